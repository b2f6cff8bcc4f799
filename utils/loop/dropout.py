"""Attention dropout as a run sets it (--attention_dropout): the one model setting both scripts may override.

Dropout on the attention probabilities needs a random draw for every attention score of every layer (batch x heads
x length x length). A GPU draws them inside its fused attention kernel; a CPU has no such kernel, falls back to
computing attention in full and draws them one by one, which costs more than the attention itself. Setting it to 0
there buys speed with a little regularization (docs/RESULTS.md, Speed, says how much of each).
"""

from utils.loop.errors import UserError

# where configs keep it: BERT, RoBERTa, ELECTRA, ALBERT...; DistilBERT and most newer architectures
_FIELDS = ("attention_probs_dropout_prob", "attention_dropout")


def config_overrides(path: str, attention_dropout: float | None) -> dict:
    """Keyword arguments for `from_pretrained(path, ...)` that set the model's attention dropout (none when not
    asked to); a one-line error for a model whose config keeps it under no known name."""
    if attention_dropout is None:
        return {}
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path)
    field = next((f for f in _FIELDS if hasattr(config, f)), None)
    if field is None:
        raise UserError(f"{path}: --attention_dropout: its config ({config.model_type}) has no attention dropout "
                        f"setting ({' or '.join(_FIELDS)})")
    return {field: attention_dropout}

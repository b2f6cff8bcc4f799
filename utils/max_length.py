"""The longest input a model takes: a length flag beyond it is refused before a run (the reader's windows,
the retriever's questions and passages)."""

from transformers import AutoConfig

from utils.errors import UserError

# RoBERTa-style models number positions from pad_token_id + 1: max_position_embeddings - pad_token_id - 1 usable.
_POSITIONS_AFTER_PADDING = {"roberta", "xlm-roberta", "camembert", "xlm-roberta-xl", "roberta-prelayernorm",
                            "data2vec-text", "longformer"}


def check_max_length(model_name_or_path: str, tokenizer, **lengths: int) -> None:
    """Refuse a length flag (`max_seq_length=384`, ...) beyond what the model can take: its position
    embeddings, and the tokenizer's declared maximum when it declares a real one. Past the positions a
    run would crash mid-training (or index garbage); a config that cannot be read is left to the model
    loading that follows to report."""
    limits = []
    try:
        config = AutoConfig.from_pretrained(model_name_or_path)
    except (OSError, ValueError):
        config = None
    positions = getattr(config, "max_position_embeddings", None)
    if isinstance(positions, int) and positions > 0:
        if config.model_type in _POSITIONS_AFTER_PADDING:  # position ids start at pad_token_id + 1
            positions -= (config.pad_token_id or 0) + 1
        limits.append(positions)
    declared = getattr(tokenizer, "model_max_length", None)
    if isinstance(declared, int) and 0 < declared < 100_000:  # "no limit" is a placeholder like 1e30
        limits.append(declared)
    if not limits:
        return
    limit = min(limits)
    for flag, value in lengths.items():
        if value > limit:
            raise UserError(f"--{flag} {value} is more than the {limit} tokens {model_name_or_path} can take")

"""An answerability verifier inside the reader (Retro-Reader's internal front verification, Zhang et al. 2021): one
logit per window from its [CLS] vector, "this window holds the question's answer", trained beside the span loss
(train_reader.py --verifier) and weighed against the reader's null score when it decides to abstain.

Why beside the null score: the span loss learns the no-answer as one more position competing with the spans, so its
evidence is relative (how much better the best span reads than the [CLS]); a verifier learns an absolute judgement
per window with its own loss, the second opinion SQuAD 2.0 systems add (Read + Verify, Retro-Reader).

The head is one linear layer on the encoder's last hidden state at [CLS] (`hidden_states[-1]`), kept on the QA model
as `answerability` so that the optimizer, DDP, checkpoints and `save_pretrained` carry it with the rest of the
weights (model.safetensors holds `answerability.weight`/`.bias`; a plain transformers load ignores them,
utils.reader.trained.load_qa_model restores them). Its loss is the binary cross-entropy of each window against
whether it holds a labelled answer (an unanswerable question's windows, and the retrieved passages without its
answer, are all negatives): averaged over a question's windows, then over the batch's questions, as the
shared-normalization loss is (a window-level reader: over its windows). It is added to the span loss at weight 1, as
Retro-Reader adds its answerability loss.

Read, a passage's verifier score is the highest of its windows' logits (the answer needs to be in one window), and
what the no-answer threshold compares becomes null_minus_best - w x that score, so a window the verifier believes
lowers the case for abstaining. Over several passages (utils.system.answer) the shared rule takes off the highest
passage's term from the question's log ratio, the window rule each passage's from its own before taking the least. `w` is tuned on dev with the threshold, from
VERIFIER_WEIGHTS (0: the null score alone), and recorded in reader_settings.json (`verifier_weight`).
"""

import torch
import torch.nn.functional as F

from utils.errors import UserError
from utils.numeric import question_mean

HEAD = "answerability"
# the weights tried for the verifier's score against the null score: 0, then doubling over the scales of both
VERIFIER_WEIGHTS = (0.0,) + tuple(2.0 ** i for i in range(-3, 5))


def attach_verifier(model) -> torch.nn.Linear:
    """A new verifier head on `model` (initialised as transformers initialises a linear layer: normal with the
    config's initializer_range, zero bias). An encoder's only: an encoder-decoder's QA output has no hidden states of
    one sequence to read [CLS] from."""
    config = model.config
    if getattr(config, "is_encoder_decoder", False):
        raise UserError(f"--verifier: {config.model_type} is an encoder-decoder model; the verifier reads an encoder's "
                        "[CLS]")
    head = torch.nn.Linear(config.hidden_size, 1)
    torch.nn.init.normal_(head.weight, std=getattr(config, "initializer_range", 0.02))
    torch.nn.init.zeros_(head.bias)
    setattr(model, HEAD, head)
    return head


def verifier_head(model):
    """The verifier head of a QA model (under DDP too), or None."""
    return getattr(getattr(model, "module", model), HEAD, None)


def reader_logits(model, inputs: dict):
    """(start logits, end logits, verifier logit per window; None for a model without the head): one forward pass
    over `inputs` (the model's inputs only: utils.reader.decoding.MODEL_INPUTS)."""
    head = verifier_head(model)
    out = model(**inputs, output_hidden_states=head is not None)
    scores = head(out.hidden_states[-1][:, 0]).squeeze(-1) if head is not None else None
    return out.start_logits, out.end_logits, scores


def verifier_loss(scores: torch.Tensor, holds_answer: torch.Tensor, group: torch.Tensor | None = None) -> torch.Tensor:
    """Binary cross-entropy of each window's logit against `holds_answer` (bool per window): the mean over each
    question's windows, then over the questions (`group`: each window's question, 0..B-1; None: each window its
    own)."""
    losses = F.binary_cross_entropy_with_logits(scores.float(), holds_answer.float(), reduction="none")
    return question_mean(losses, group)


def verifier_term(verifier: float | None, weight: float | None) -> float:
    """What a verifier's score takes off the log ratio the no-answer threshold compares: `weight` x the score (no
    verifier, or no weight: 0)."""
    return weight * verifier if verifier is not None and weight else 0.0


def with_verifier(decoded: dict, weight: float | None) -> dict:
    """Decoded examples (utils.reader.decoding) with their null_minus_best less their `verifier_term` at `weight`
    (None: as the reader alone gives it); the reader's own kept as "null_minus_best_alone", which a second call
    starts from, and the term as "verifier_term", which the QA system's shared rule takes off the question's log
    ratio over its passages (the most confident passage's: utils.system.answer)."""
    out = {}
    for i, d in decoded.items():
        alone = d.get("null_minus_best_alone", d["null_minus_best"])
        term = verifier_term(d.get("verifier"), weight)
        out[i] = {**d, "null_minus_best_alone": alone, "null_minus_best": alone - term, "verifier_term": term}
    return out

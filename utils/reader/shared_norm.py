"""Shared normalization (Clark & Gardner 2018): a reader trained so that its scores are comparable across passages.

Each passage is still encoded alone (in windows of max_seq_length), but the start logits of all the windows of all
the passages read with a question share one softmax, and so do the end logits: over every position that can start
(end) a span, i.e. every context token, and every window's [CLS], the no-answer. The loss is the negative log of
the probability that softmax gives the question's targets together (the summed objective): every labelled
occurrence of its answer, or, for an unanswerable question, its one no-answer: the [CLS] of every window, whose
probabilities add up to the question's probability of no answer. Trained on passages without the answer beside the
one with it, a span's score in one passage then means the same as in another, and the no-answer is one decision per
question, not one per window.

At reading time the same quantities come from each passage's windows (utils.reader.decoding): a span's score is
summed as its target is, the log-sum-exp of its start logits over the windows that hold it whole plus that of its end
logits; the no-answer's the log-sum-exp of the windows' [CLS] logits (start and end), and every position's likewise;
combined over a question's passages (utils.system.answer) they give its best span, its probability of no answer and
their log ratio, which the no-answer threshold compares.
"""

import torch

from utils.reader.decoding import MODEL_INPUTS
from utils.runtime.batching import pad_batch

NEG = -1e4  # a logit that never wins (fp32-safe)


def shared_norm_loss(start_logits: torch.Tensor, end_logits: torch.Tensor, batch: dict) -> torch.Tensor:
    """Mean over the batch's questions of (start loss + end loss) / 2. `batch`: "group" (each window's question,
    0..B-1), "allowed" (windows x positions: the context tokens and [CLS]), "start_target"/"end_target" (windows x
    positions: the targets; a question's targets may sit in any of its windows)."""
    group, allowed = batch["group"], batch["allowed"]
    questions = int(group.max()) + 1
    total = start_logits.new_zeros((), dtype=torch.float32)
    for logits, target in ((start_logits, batch["start_target"]), (end_logits, batch["end_target"])):
        logits = logits.float().masked_fill(~allowed, NEG)
        every = torch.logsumexp(logits, dim=1)  # per window
        hit = torch.logsumexp(logits.masked_fill(~target, NEG), dim=1)
        for g in range(questions):
            rows = group == g
            total = total + torch.logsumexp(every[rows], 0) - torch.logsumexp(hit[rows], 0)
    return total / (2 * questions)


def allowed_positions(context_start: torch.Tensor, context_end: torch.Tensor, width: int) -> torch.Tensor:
    """windows x positions: where an answer may start or end, each window's context tokens (its first to its last,
    inclusive) and its [CLS] (the no-answer)."""
    positions = torch.arange(width)
    allowed = (positions >= context_start[:, None]) & (positions <= context_end[:, None])
    allowed[:, 0] = True
    return allowed


def group_batch(windows: list[dict], groups: list[int], answerable: list[bool], pad_token_id: int) -> dict:
    """The model inputs of a batch of questions' windows (each {"input_ids", "attention_mask", "token_type_ids"?,
    "context_start", "context_end", "starts", "ends"}) with what `shared_norm_loss` needs. A question whose answer
    sits whole in none of its windows (cut by the window length) is trained towards its no-answer, as a window
    without the answer is in the per-window loss."""
    model_keys = [k for k in MODEL_INPUTS if k in windows[0]]
    batch = pad_batch([{k: w[k] for k in model_keys} for w in windows], pad_token_id)
    n, width = batch["input_ids"].shape
    allowed = allowed_positions(torch.tensor([w["context_start"] for w in windows]),
                                torch.tensor([w["context_end"] for w in windows]), width)
    start_target = torch.zeros(n, width, dtype=torch.bool)
    end_target = torch.zeros(n, width, dtype=torch.bool)
    group = torch.tensor(groups)
    has_span = [False] * (int(group.max()) + 1)
    for i, w in enumerate(windows):
        if answerable[groups[i]] and w["starts"]:
            start_target[i, w["starts"]] = True
            end_target[i, w["ends"]] = True
            has_span[groups[i]] = True
    for i in range(n):  # no answer (or none whole in the windows read): every window's [CLS]
        if not has_span[groups[i]]:
            start_target[i, 0] = end_target[i, 0] = True
    return {**batch, "group": group, "allowed": allowed, "start_target": start_target, "end_target": end_target}

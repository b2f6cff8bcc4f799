"""Numeric helpers with one definition for the whole project: the log-sum-exp that the reader's decoding
(utils.reader.decoding) and the QA system's answer rule (utils.system.answer) both take over logits and scores, and
the mean per question that the reader's per-window losses take (utils.reader.distillation)."""

import math

import numpy as np
import torch


def logsumexp(values) -> float:
    """log(sum(exp(v) for v in values)), in float64 whatever the values' dtype: -inf when there are no values or all
    are -inf (the log of a probability of zero), +inf when one is +inf. `values`: an array or any iterable of
    numbers."""
    x = np.asarray(values if isinstance(values, np.ndarray) else list(values), dtype=np.float64)
    # pairwise log(exp(a) + exp(b)), stable for any magnitudes and exact on infinities (no inf - inf)
    return float(np.logaddexp.reduce(x)) if x.size else -math.inf


def question_mean(per_window: torch.Tensor, group: torch.Tensor | None = None) -> torch.Tensor:
    """The mean over each question's windows, then over the questions (`group`: each window's question, 0..B-1;
    None: each window its own), so that a question weighs the same however many windows it reads, as in the
    shared-normalization loss."""
    if group is None:
        return per_window.mean()
    questions = int(group.max()) + 1
    total = torch.zeros(questions, dtype=per_window.dtype, device=per_window.device).index_add(0, group, per_window)
    return (total / torch.bincount(group, minlength=questions)).mean()

"""Ranks and retrieval metrics: top-k accuracy, MRR@10 and mean rank of the best-ranked gold passage, and MaxP
(a passage scored by its best sentence window).

One rank rule for every ranking the project reports (dense, BM25, the hybrids, in-batch): a passage's rank is 1 +
the number of other passages scoring at least as high, so ties count against it (BM25 gives many passages the same
score, 0 for no shared term, and a question that shares no term with any passage must not count as a hit), and a
NaN score ranks last (a comparison with NaN is False, which would otherwise put it first: an encoder that diverged
in fp16 would report top-1 = 100). `count_at_least` is that rule; counts over disjoint column blocks add up.
"""

import numpy as np
import torch


def _nan_last(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a)
    return np.where(np.isnan(a), -np.inf, a) if np.issubdtype(a.dtype, np.floating) else a


def count_at_least(scores: np.ndarray, values: np.ndarray) -> np.ndarray:
    """counts[i, j] = how many entries of scores[i] are >= values[i, j] (NaN scores never are; a NaN value has every
    entry at or above it)."""
    scores, values = _nan_last(scores), _nan_last(values)
    if values.shape[1] <= 8:  # a few values per row: compare directly
        return (scores[:, :, None] >= values[:, None, :]).sum(1)
    ascending = np.sort(scores, axis=1)  # many values (every passage of a row): sort once per row
    return np.stack([scores.shape[1] - np.searchsorted(row, v, side="left") for row, v in zip(ascending, values)])


def ranks(scores: np.ndarray) -> np.ndarray:
    """1-based rank of every passage for every query (queries x passages): tied passages share the worst rank of
    their group."""
    return count_at_least(scores, scores)


def gold_ranks(scores: np.ndarray, gold: list[list[int]]) -> np.ndarray:
    """1-based rank of each question's best-scored gold passage among the other passages (ties against it)."""
    scores = _nan_last(scores)
    out = np.empty(len(gold), dtype=np.int64)
    for i, idx in enumerate(gold):
        best = scores[i, idx].max()
        row = scores[i:i + 1]
        out[i] = (count_at_least(row, [[best]])[0, 0] - count_at_least(row[:, idx], [[best]])[0, 0]) + 1
    return out


def retrieval_metrics(ranks: np.ndarray, ks=(1, 5, 20, 100)) -> dict:
    out = {f"top{k}": float(100.0 * np.mean(ranks <= k)) for k in ks}
    out["mrr@10"] = float(np.mean(np.where(ranks <= 10, 1.0 / ranks, 0.0)))
    out["mean_rank"] = float(np.mean(ranks))
    return out


def top_passages(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k best passages per question, best first (NaN scores last)."""
    scores = _nan_last(scores)
    k = min(k, scores.shape[1])
    part = np.argpartition(-scores, k - 1, axis=1)[:, :k]
    order = np.take_along_axis(scores, part, axis=1).argsort(axis=1, kind="stable")[:, ::-1]
    return np.take_along_axis(part, order, axis=1)


def passage_scores(q: torch.Tensor, windows: torch.Tensor, owner: torch.Tensor, count: int) -> torch.Tensor:
    """Questions x passages: each passage scored by its best window (MaxP, Dai & Callan 2019). With one window per
    passage (owner = 0..count-1) these are the plain similarities."""
    scores = q @ windows.T
    if len(owner) == count:
        return scores
    best = torch.full((len(q), count), float("-inf"), dtype=scores.dtype)
    return best.scatter_reduce_(1, owner.expand(len(q), -1), scores, reduce="amax")

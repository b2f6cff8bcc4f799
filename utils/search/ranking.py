"""Ranks and retrieval metrics: top-k accuracy, MRR@10 and mean rank of the best-ranked gold passage.

One rank rule for every ranking the project reports (dense, BM25, the hybrids, in-batch): a passage's rank is 1 +
the number of other passages scoring at least as high, so ties count against it (BM25 gives many passages the same
score, 0 for no shared term, and a question that shares no term with any passage must not count as a hit), and a
NaN score ranks last (a comparison with NaN is False, which would otherwise put it first: an encoder that diverged
in fp16 would report top-1 = 100). `count_at_least` is that rule for a small matrix (a batch's scores); the search
engine (utils.search.exact) applies it block by block to a whole corpus.
"""

import numpy as np


def _nan_last(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a)
    return np.where(np.isnan(a), -np.inf, a) if np.issubdtype(a.dtype, np.floating) else a


def count_at_least(scores: np.ndarray, values: np.ndarray) -> np.ndarray:
    """counts[i, j] = how many entries of scores[i] are >= values[i, j] (NaN scores never are; a NaN value has every
    entry at or above it)."""
    scores, values = _nan_last(scores), _nan_last(values)
    return (scores[:, :, None] >= values[:, None, :]).sum(1)


def gold_ranks(scores: np.ndarray, gold: list[list[int]]) -> np.ndarray:
    """1-based rank of each question's best-scored gold passage among the other passages (ties against it)."""
    scores = _nan_last(scores)
    out = np.empty(len(gold), dtype=np.int64)
    for i, idx in enumerate(gold):
        idx = list(dict.fromkeys(idx))  # a gold passage listed twice is one passage (else it counts twice below)
        best = scores[i, idx].max()
        row = scores[i:i + 1]
        out[i] = (count_at_least(row, [[best]])[0, 0] - count_at_least(row[:, idx], [[best]])[0, 0]) + 1
    return out


def retrieval_metrics(ranks: np.ndarray, ks=(1, 5, 20, 100)) -> dict:
    out = {f"top{k}": float(100.0 * np.mean(ranks <= k)) for k in ks}
    out["mrr@10"] = float(np.mean(np.where(ranks <= 10, 1.0 / ranks, 0.0)))
    out["mean_rank"] = float(np.mean(ranks))
    return out

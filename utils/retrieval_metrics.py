"""Retrieval metrics: top-k accuracy, MRR@10 and mean rank of the best-ranked gold passage."""

import numpy as np


def gold_ranks(scores: np.ndarray, gold: list[list[int]]) -> np.ndarray:
    """1-based rank of each question's best-scored gold passage. Ties count against it: every other passage
    scoring at least as high is ahead (BM25 gives many passages the same score, 0 for no shared term, and a
    question that shares no term with any passage must not count as a hit)."""
    ranks = np.empty(len(gold), dtype=np.int64)
    for i, idx in enumerate(gold):
        best = scores[i, idx].max()
        ranks[i] = int((scores[i] >= best).sum()) - int((scores[i, idx] >= best).sum()) + 1
    return ranks


def retrieval_metrics(ranks: np.ndarray, ks=(1, 5, 20, 100)) -> dict:
    out = {f"top{k}": float(100.0 * np.mean(ranks <= k)) for k in ks}
    out["mrr@10"] = float(np.mean(np.where(ranks <= 10, 1.0 / ranks, 0.0)))
    out["mean_rank"] = float(np.mean(ranks))
    return out


def top_passages(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k best passages per question, best first."""
    k = min(k, scores.shape[1])
    part = np.argpartition(-scores, k - 1, axis=1)[:, :k]
    order = np.take_along_axis(scores, part, axis=1).argsort(axis=1)[:, ::-1]
    return np.take_along_axis(part, order, axis=1)

"""Hybrid retrieval: two ways to fuse a dense ranking with BM25's. Reciprocal-rank fusion needs no weight; a convex
combination of per-question min-max normalised scores has one dense weight, tuned on labelled questions (Bruch et
al., 2023, "An Analysis of Fusion Functions for Hybrid Retrieval": tuned, it beats RRF)."""

import numpy as np

from utils.retriever.ranking import gold_ranks, ranks, retrieval_metrics

RRF_K = 60  # reciprocal-rank fusion constant (Cormack et al., 2009): the usual, untuned value


def reciprocal_rank_fusion(*score_matrices: np.ndarray, k: int = RRF_K) -> np.ndarray:
    """Fused scores: sum over the rankings of 1 / (k + rank). Needs no score calibration between retrievers."""
    return sum(1.0 / (k + ranks(s)) for s in score_matrices)


FUSION_WEIGHTS = np.round(np.linspace(0.0, 1.0, 21), 2)  # dense weights tried: 0, 0.05, ..., 1


def _minmax(scores: np.ndarray) -> np.ndarray:
    low, high = scores.min(axis=1, keepdims=True), scores.max(axis=1, keepdims=True)
    return (scores - low) / np.maximum(high - low, 1e-12)


def convex_fusion(dense: np.ndarray, lexical: np.ndarray, dense_weight: float) -> np.ndarray:
    """dense_weight x dense + (1 - dense_weight) x lexical, each min-max normalised per question (Bruch et al.,
    2023, "An Analysis of Fusion Functions for Hybrid Retrieval": it beats RRF once its one weight is tuned)."""
    return dense_weight * _minmax(dense) + (1.0 - dense_weight) * _minmax(lexical)


def tune_dense_weight(dense: np.ndarray, lexical: np.ndarray, gold: list[list[int]]) -> float:
    """The weight of FUSION_WEIGHTS with the best MRR@10 on these questions (ties: the smallest)."""
    mrr = [retrieval_metrics(gold_ranks(convex_fusion(dense, lexical, w), gold))["mrr@10"] for w in FUSION_WEIGHTS]
    return float(FUSION_WEIGHTS[int(np.argmax(mrr))])


def cross_fitted_fusion(dense: np.ndarray, lexical: np.ndarray, gold: list[list[int]]) -> tuple[np.ndarray, float]:
    """(fused scores, dense weight tuned on all questions). Each half of the questions (even / odd positions) is
    fused with the weight tuned on the other half, so the fused metrics are not tuned on the questions they
    score; the weight tuned on all of them is the one to use afterwards."""
    fused = np.empty_like(dense, dtype=np.float64)
    halves = [np.arange(0, len(gold), 2), np.arange(1, len(gold), 2)]
    for this, other in (halves, halves[::-1]):
        if len(this) == 0:
            continue
        train = other if len(other) else this
        w = tune_dense_weight(dense[train], lexical[train], [gold[i] for i in train])
        fused[this] = convex_fusion(dense[this], lexical[this], w)
    return fused, tune_dense_weight(dense, lexical, gold)

"""BM25 over a passage corpus (the bm25s library), the lexical baseline a dense retriever has to beat, and two
ways to fuse it with a dense ranking (hybrid retrieval): reciprocal-rank fusion (no weight) and a convex
combination of per-question min-max normalised scores whose dense weight is tuned on labelled questions.

The converter (utils.make_dpr_data) mines hard negatives with it and the DPR evaluation reports it beside the
dense ranking, with the same tokenisation: passages as "title text", English stopwords removed, words reduced to
their Snowball (Porter 2) stems, as Lucene/Pyserini's English BM25 does: without stems "drives" never matches
"driving" (on the shared SQuAD dev set: top-1 79.2 without stems, 79.9 with).
"""

import logging

import bm25s
import numpy as np
import Stemmer

from utils.retrieval_metrics import gold_ranks, ranks, retrieval_metrics

logging.getLogger("bm25s").setLevel(logging.INFO)  # bm25s sets its own logger to DEBUG: a line per index built

RRF_K = 60  # reciprocal-rank fusion constant (Cormack et al., 2009): the usual, untuned value


class BM25:
    def __init__(self, passages: list[dict]):
        self.size = len(passages)
        self.retriever = bm25s.BM25()
        self.retriever.index(_tokenize([f"{p['title']} {p['text']}" for p in passages]), show_progress=False)

    def top(self, queries: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        """(passage indices, scores) of each query's k best passages, best first."""
        return self.retriever.retrieve(_tokenize(queries), k=min(k, self.size), show_progress=False)

    def scores(self, queries: list[str]) -> np.ndarray:
        """Score of every passage for every query (queries x passages), 0 where no query term occurs."""
        hits, scores = self.top(queries, self.size)
        out = np.zeros((len(queries), self.size), dtype=np.float32)
        np.put_along_axis(out, np.asarray(hits, dtype=np.int64), np.asarray(scores, dtype=np.float32), axis=1)
        return out


_STEMMER = Stemmer.Stemmer("english")


def _tokenize(texts: list[str], return_ids: bool = True):
    return bm25s.tokenize(texts, stopwords="en", stemmer=_STEMMER.stemWords, return_ids=return_ids,
                          show_progress=False)


def terms(text: str) -> set[str]:
    """The BM25 terms of a text (stemmed words, stopwords removed)."""
    return set(_tokenize([text], return_ids=False)[0])


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

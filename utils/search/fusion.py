"""Hybrid retrieval: a dense ranking fused with BM25's over their candidates, never over the whole corpus.

Each question's candidates are the union of the dense and the BM25 top `CANDIDATES`; every candidate has both scores
(the dense score of a BM25-only candidate and the BM25 score of a dense-only one are computed for it). Two fusions:
* convex: dense_weight x dense + (1 - dense_weight) x BM25, each min-max normalised over the question's candidates
  (Bruch et al., 2023, "An Analysis of Fusion Functions for Hybrid Retrieval": tuned, it beats RRF); the weight is
  tuned on labelled questions and recorded with the retriever (utils.retriever.settings);
* reciprocal-rank fusion: sum over the two lists of 1 / (60 + rank), nothing tuned (0 from a list that misses it).
A gold passage outside the candidates ranks after all of them: it would be no hit for any k up to their number.

A search (`hybrid_ranking`, utils.index.index) ranks by the same rule: the candidates are each ranking's first
`hybrid_candidates` whatever the number of hits asked for, so that a ranking's head does not depend on how deep one
looks (widening them with k changed the normalisation, and with it the first hits). Past the candidates the rest of
the dense ranking follows, in its order, each scored dense_weight x its dense score normalised as the candidates',
capped at 0 (the lowest a candidate can score): the scores never increase down the list.
"""

import warnings
from dataclasses import dataclass

import numpy as np

from utils.search.ranking import retrieval_metrics

CANDIDATES = 100  # per ranking: the union has at most twice as many
RRF_K = 60  # reciprocal-rank fusion constant (Cormack et al., 2009): the usual, untuned value
FUSION_WEIGHTS = np.round(np.linspace(0.0, 1.0, 21), 2)  # dense weights tried: 0, 0.05, ..., 1


@dataclass
class Candidates:
    """Per question (rows): candidate passage ids (-1 = padding), their dense and BM25 scores, and their 1-based
    ranks in the dense and BM25 lists (0 = not in that list)."""

    ids: np.ndarray
    dense: np.ndarray
    lexical: np.ndarray
    dense_rank: np.ndarray
    lexical_rank: np.ndarray

    @property
    def valid(self) -> np.ndarray:
        return self.ids >= 0

    def gold_mask(self, gold: list[list[int]]) -> np.ndarray:
        """Which candidates are a gold passage of their question."""
        width = max((len(g) for g in gold), default=0)
        padded = np.array([list(g) + [-2] * (width - len(g)) for g in gold], dtype=np.int64).reshape(len(gold), width)
        return (self.ids[:, :, None] == padded[:, None, :]).any(2) & self.valid

    def rows(self, which) -> "Candidates":
        return Candidates(*(a[which] for a in (self.ids, self.dense, self.lexical, self.dense_rank,
                                                self.lexical_rank)))


def union(dense_ids: np.ndarray, lexical_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ids, dense ranks, lexical ranks): each question's candidates, dense list first, then the BM25 passages the
    dense list does not hold; -1 pads the rows to one width."""
    width = dense_ids.shape[1] + lexical_ids.shape[1]
    ids = np.full((len(dense_ids), width), -1, dtype=np.int64)
    d_rank, l_rank = np.zeros_like(ids), np.zeros_like(ids)
    for i, (d, lex) in enumerate(zip(dense_ids, lexical_ids)):
        order = {int(p): r + 1 for r, p in enumerate(d) if p >= 0}
        lexical = {int(p): r + 1 for r, p in enumerate(lex) if p >= 0}
        row = list(order) + [p for p in lexical if p not in order]
        ids[i, :len(row)] = row
        d_rank[i, :len(row)] = [order.get(p, 0) for p in row]
        l_rank[i, :len(row)] = [lexical.get(p, 0) for p in row]
    return ids, d_rank, l_rank


def gather_candidates(dense_s, dense_i, lex_s, lex_i, lex_of_dense, dense_of_lex) -> Candidates:
    """Both rankings' candidates with both scores: the dense list's own and BM25's of it, BM25's own and the dense
    score of it."""
    ids, d_rank, l_rank = union(dense_i, lex_i)
    dense, lexical = np.full(ids.shape, -np.inf, np.float32), np.full(ids.shape, -np.inf, np.float32)
    for i in range(len(ids)):
        d = dict(zip(dense_i[i].tolist(), zip(dense_s[i].tolist(), lex_of_dense[i].tolist())))
        lex = dict(zip(lex_i[i].tolist(), zip(dense_of_lex[i].tolist(), lex_s[i].tolist())))
        for j, p in enumerate(ids[i].tolist()):
            if p >= 0:
                dense[i, j], lexical[i, j] = d[p] if p in d else lex[p]
    return Candidates(ids, dense, lexical, d_rank, l_rank)


def _bounds(scores: np.ndarray, valid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row (as a column), the lowest and highest finite score of its valid candidates (NaN: none)."""
    s = np.where(valid & np.isfinite(scores), scores, np.nan)
    with warnings.catch_warnings():  # a row without a finite score: "All-NaN slice"
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmin(s, 1, keepdims=True), np.nanmax(s, 1, keepdims=True)


def _normalised(scores: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """(score - low) / (high - low); a score that is not finite (or a row without bounds) as the lowest: 0."""
    s = np.where(np.isfinite(scores), scores, np.nan)
    return np.nan_to_num((s - low) / np.maximum(high - low, 1e-12), nan=0.0)


def _minmax(scores: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """Per row, over its valid candidates: (score - lowest) / (highest - lowest); a score that is not finite counts
    as the row's lowest."""
    return _normalised(np.where(valid, scores, np.nan), *_bounds(scores, valid))


def convex_fusion(c: Candidates, dense_weight: float) -> np.ndarray:
    fused = dense_weight * _minmax(c.dense, c.valid) + (1.0 - dense_weight) * _minmax(c.lexical, c.valid)
    return np.where(c.valid, fused, -np.inf)


def hybrid_ranking(c: Candidates, dense_weight: float, rest_s: np.ndarray, rest_i: np.ndarray,
                   k: int) -> tuple[np.ndarray, np.ndarray]:
    """(scores, ids) of each question's first k hits of the convex hybrid (-1: none): its candidates by fused score
    (ties: the candidates' order), then the rest of its dense ranking (`rest_s`, `rest_i`: past the candidates,
    best first) without the candidates, in dense order, scored as the module docstring says."""
    fused = convex_fusion(c, dense_weight)
    low, high = _bounds(c.dense, c.valid)
    rest = dense_weight * np.minimum(_normalised(rest_s, low, high), 0.0)
    scores, ids = np.full((len(fused), k), -np.inf, np.float32), np.full((len(fused), k), -1, np.int64)
    for i in range(len(fused)):
        order = np.argsort(-fused[i], kind="stable")
        order = order[c.valid[i][order]]
        taken = set(c.ids[i].tolist())
        tail = [j for j, p in enumerate(rest_i[i].tolist()) if p >= 0 and p not in taken]
        row_s = np.concatenate([fused[i][order], np.minimum.accumulate(rest[i][tail])])[:k]
        row_i = np.concatenate([c.ids[i][order], rest_i[i][tail]])[:k]
        scores[i, :len(row_s)], ids[i, :len(row_i)] = row_s, row_i
    return scores, ids


def reciprocal_rank_fusion(c: Candidates, k: int = RRF_K) -> np.ndarray:
    fused = sum(np.where(r > 0, 1.0 / (k + r), 0.0) for r in (c.dense_rank, c.lexical_rank))
    return np.where(c.valid, fused, -np.inf)


def fused_gold_ranks(fused: np.ndarray, c: Candidates, gold: list[list[int]]) -> np.ndarray:
    """1-based rank of each question's best gold candidate among the other candidates (ties against it); a question
    with no gold candidate ranks after all its candidates."""
    is_gold = c.gold_mask(gold)
    best = np.where(is_gold, fused, -np.inf).max(1)
    ahead = ((fused >= best[:, None]) & c.valid & ~is_gold).sum(1) + 1
    return np.where(is_gold.any(1), ahead, c.valid.sum(1) + 1).astype(np.int64)


def tune_dense_weight(c: Candidates, gold: list[list[int]]) -> float:
    """The weight of FUSION_WEIGHTS with the best MRR@10 on these questions (ties: the smallest)."""
    mrr = [retrieval_metrics(fused_gold_ranks(convex_fusion(c, w), c, gold))["mrr@10"] for w in FUSION_WEIGHTS]
    return float(FUSION_WEIGHTS[int(np.argmax(mrr))])


def cross_fitted_ranks(c: Candidates, gold: list[list[int]]) -> tuple[np.ndarray, float]:
    """(gold ranks, dense weight tuned on all questions). Each half of the questions (even / odd positions) is fused
    with the weight tuned on the other half, so the ranks are not tuned on the questions they score; the weight
    tuned on all of them is the one to record and use afterwards."""
    ranks = np.empty(len(gold), dtype=np.int64)
    halves = [np.arange(0, len(gold), 2), np.arange(1, len(gold), 2)]
    for this, other in (halves, halves[::-1]):
        if len(this) == 0:
            continue
        train = other if len(other) else this
        w = tune_dense_weight(c.rows(train), [gold[i] for i in train])
        part = c.rows(this)
        ranks[this] = fused_gold_ranks(convex_fusion(part, w), part, [gold[i] for i in this])
    return ranks, tune_dense_weight(c, gold)

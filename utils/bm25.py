"""BM25 over a passage corpus (the bm25s library), the lexical baseline a dense retriever has to beat, and
reciprocal-rank fusion of two rankings (the hybrid retriever).

The converter (utils.make_dpr_data) mines hard negatives with it and the DPR evaluation reports it beside the
dense ranking, with the same tokenisation: passages as "title text", English stopwords removed.
"""

import bm25s
import numpy as np

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


def _tokenize(texts: list[str]):
    return bm25s.tokenize(texts, stopwords="en", show_progress=False)


def ranks(scores: np.ndarray) -> np.ndarray:
    """1-based rank of every passage for every query; tied passages share the worst rank of their group (no
    passage gains from the corpus order, e.g. among BM25's many zero scores)."""
    descending = -np.sort(-scores, axis=1)
    return np.stack([np.searchsorted(-row, -s, side="right") for row, s in zip(descending, scores)])


def reciprocal_rank_fusion(*score_matrices: np.ndarray, k: int = RRF_K) -> np.ndarray:
    """Fused scores: sum over the rankings of 1 / (k + rank). Needs no score calibration between retrievers."""
    return sum(1.0 / (k + ranks(s)) for s in score_matrices)

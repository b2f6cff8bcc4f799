"""BM25 over a passage corpus (the bm25s library), the lexical baseline a dense retriever has to beat, and two
ways to fuse it with a dense ranking (hybrid retrieval): reciprocal-rank fusion (no weight) and a convex
combination of per-question min-max normalised scores whose dense weight is tuned on labelled questions.

The converter (utils.retriever.make_dpr_data) mines hard negatives with it and the DPR evaluation reports it beside the
dense ranking, with the same tokenisation: passages as "title text", English stopwords removed, words reduced to
their Snowball (Porter 2) stems, as Lucene/Pyserini's English BM25 does: without stems "drives" never matches
"driving" (on the shared SQuAD dev set: top-1 79.2 without stems, 79.9 with).
"""

import logging

import bm25s
import numpy as np
import Stemmer

logging.getLogger("bm25s").setLevel(logging.INFO)  # bm25s sets its own logger to DEBUG: a line per index built


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

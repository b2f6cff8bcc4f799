"""BM25 over a passage corpus (the bm25s library): the lexical baseline a dense retriever has to beat, and the lexical
half of the hybrids (utils.search.fusion).

The converter (make_dpr_data.py) mines hard negatives with it and the DPR evaluation reports it beside the
dense ranking, with the same tokenisation: passages as "title text", English stopwords removed, words reduced to
their Snowball (Porter 2) stems, as Lucene/Pyserini's English BM25 does: without stems "drives" never matches
"driving" (docs/RESULTS.md compares the two on the shared data).
"""

import logging
import os

import bm25s
import numpy as np
import Stemmer

from utils.errors import UserError

logging.getLogger("bm25s").setLevel(logging.INFO)  # bm25s sets its own logger to DEBUG: a line per index built


class BM25:
    """BM25 of a corpus, one question at a time: memory is one score per passage, never questions x passages."""

    def __init__(self, passages: list[dict]):
        if not passages:
            raise UserError("BM25 needs at least one passage")
        self.size = len(passages)
        self.retriever = bm25s.BM25()
        self.retriever.index(_tokenize([f"{p['title']} {p['text']}" for p in passages]), show_progress=False)

    def save(self, directory: str) -> None:
        self.retriever.save(directory)

    @classmethod
    def load(cls, directory: str, size: int) -> "BM25":
        """BM25 as `save` wrote it, over `size` passages. Each of its files is checked whole first, in a few reads
        whatever its size (an array's header against its length, a JSON object's closing brace), so that one
        missing or cut short is a one-line UserError naming it, as is BM25 over another number of passages."""
        for name in ("params.index.json", "vocab.index.json", "data.csc.index.npy", "indices.csc.index.npy",
                     "indptr.csc.index.npy"):  # what bm25s saves and loads, by its default names
            path = os.path.join(directory, name)
            if not os.path.isfile(path):
                raise UserError(f"{directory}: {name} is missing")
            try:
                if name.endswith(".npy"):
                    np.load(path, mmap_mode="r")  # reads the header; refuses a file shorter than the array it gives
                else:
                    with open(path, "rb") as f:
                        f.seek(max(os.path.getsize(path) - 64, 0))
                        if not f.read().rstrip().endswith(b"}"):
                            raise ValueError("no closing brace")
            except (OSError, ValueError, EOFError) as err:
                raise UserError(f"{directory}: {name} is cut short or damaged ({err})") from None
        out = cls.__new__(cls)
        try:
            out.retriever = bm25s.BM25.load(directory)
        except (OSError, ValueError, EOFError) as err:
            raise UserError(f"{directory}: not a BM25 index ({err})") from None
        if out.retriever.scores["num_docs"] != size:
            raise UserError(f"{directory}: BM25 over {out.retriever.scores['num_docs']} passages, the index has {size}")
        out.size = size
        return out

    def query_scores(self, query: str) -> np.ndarray:
        """The score of every passage for one query (float32), 0 where no query term occurs."""
        tokens = _tokenize([query], return_ids=False)[0]
        known = [t for t in tokens if t in self.retriever.vocab_dict]
        if not known:  # stopwords only, or no term in the corpus
            return np.zeros(self.size, dtype=np.float32)
        return np.asarray(self.retriever.get_scores(known), dtype=np.float32)


    def search(self, queries: list[str], k: int, gold: list[list[int]] | None = None,
               score_ids: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray | None,
                                                             np.ndarray | None]:
        """(scores, ids, gold ranks, scores of score_ids): per query its k best passages (ties: the smaller id first,
        the project's one rule: utils.search.kbest), with `gold` (per query its gold passages' ids, each
        counted once) the rank of its best gold passage (1 + the others scoring at least as high: a question sharing
        no term with the corpus ranks last), with `score_ids` (query x ids, -1 = none) the BM25 score of those
        passages (the dense candidates a hybrid fuses)."""
        k = min(k, self.size)
        top_s, top_i = np.zeros((len(queries), k), np.float32), np.zeros((len(queries), k), np.int64)
        ranks = np.zeros(len(queries), np.int64) if gold is not None else None
        extra = np.full(score_ids.shape, -np.inf, np.float32) if score_ids is not None else None
        for i, query in enumerate(queries):
            s = self.query_scores(query)
            top_i[i] = k_best(s, k)
            top_s[i] = s[top_i[i]]
            if gold is not None:
                ids = np.unique(np.asarray(gold[i], dtype=np.int64))
                g = s[ids].max()
                ranks[i] = int((s >= g).sum() - (s[ids] >= g).sum()) + 1
            if score_ids is not None:
                valid = score_ids[i] >= 0
                extra[i, valid] = s[score_ids[i][valid]]
        return top_s, top_i, ranks, extra


def k_best(scores: np.ndarray, k: int) -> np.ndarray:
    """The ids of the k best scores, best first, equal scores by the smaller id (utils.search.kbest's rule,
    the dense search's), whatever k: a k = 1 and a k = 10 search agree on the first hit. Linear in the corpus: the
    k-th best score by partition, then every passage above it and the smallest ids among those equal to it."""
    if k >= len(scores):
        return np.lexsort((np.arange(len(scores)), -scores))
    kth = np.partition(scores, len(scores) - k)[len(scores) - k]
    above = np.flatnonzero(scores > kth)
    best = np.concatenate([above, np.flatnonzero(scores == kth)[:k - len(above)]])
    return best[np.lexsort((best, -scores[best]))]


_STEMMER = Stemmer.Stemmer("english")


def _tokenize(texts: list[str], return_ids: bool = True):
    return bm25s.tokenize(texts, stopwords="en", stemmer=_STEMMER.stemWords, return_ids=return_ids,
                          show_progress=False)


def terms(text: str) -> set[str]:
    """The BM25 terms of a text (stemmed words, stopwords removed)."""
    return set(_tokenize([text], return_ids=False)[0])

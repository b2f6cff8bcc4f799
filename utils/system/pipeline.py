"""The QA system: retrieve passages of a corpus with a trained retriever (or BM25), read them with a trained reader,
answer by the one rule of utils.system.answer.

    from utils.system import QASystem
    qa = QASystem("outputs/dpr-squad", "outputs/reader-squad", passages="corpus.jsonl")   # or retriever="bm25"
    for a in qa.ask(["Who designed the Corran lighthouse?"], k=5):
        print(a["answer"] or "(no answer)", a["passage_id"], a["score"])

The retriever ranks with its recorded settings (sentence windows, the hybrid's dense weight: utils.retriever.index)
and the reader reads with its own (windows, decoding: utils.reader.trained); the threshold is the reader's recorded
one unless a system threshold (tuned by qa_system.py on labelled questions) is given.
"""

import os

from utils.loop.errors import UserError
from utils.reader.trained import Reader
from utils.retriever.bm25 import BM25
from utils.retriever.data import load_passages
from utils.retriever.index import Index, Retriever, ranked_passages
from utils.system.answer import answer, combine


class QASystem:
    def __init__(self, retriever: str, reader: str, passages=None, index: str | None = None, hybrid: bool | None = None,
                 device: str | None = None, precision: str = "no", batch_size: int = 64, progress: bool = False):
        """`retriever`: a directory written by train_dpr.py, or "bm25". `passages`: the corpus (a JSON-lines file or a
        list of {"title", "text", "passage_id"}), or `index`: a saved Index of it. `hybrid`: fuse the dense ranking
        with BM25 at the retriever's recorded weight (default: when it has one)."""
        self.reader = Reader(reader, device=device, batch_size=batch_size, precision=precision, sort_by_length=True)
        if retriever == "bm25":
            if passages is None:
                raise UserError("the BM25 retriever needs the passages")
            self.passages = load_passages(passages) if isinstance(passages, str) else list(passages)
            self.bm25, self.index, self.hybrid = BM25(self.passages), None, False
        else:
            if not os.path.isdir(retriever):
                raise UserError(f"{retriever}: no such directory (give a retriever trained by train_dpr.py, or bm25)")
            model = Retriever(retriever, device=device, batch_size=batch_size)
            self.hybrid = model.settings.hybrid_dense_weight is not None if hybrid is None else hybrid
            if index is not None:
                self.index = Index.load(index, model)
            elif passages is not None:
                self.index = model.index(passages, bm25=self.hybrid, progress=progress)
            else:
                raise UserError("give the passages (or a saved index of them)")
            self.passages, self.bm25 = self.index.passages, None

    @property
    def recorded_threshold(self) -> float | None:
        """The reader's own null threshold (0 for a QA model without reader_settings.json; None: always answer)."""
        return self.reader.settings.null_threshold

    def retrieve(self, questions: list[str], k: int) -> list[list[dict]]:
        """Per question its k best passages ({"passage_id", "title", "text", "score"}), best first."""
        if self.bm25 is not None:
            scores, ids, _, _ = self.bm25.search(list(questions), k)
            return ranked_passages(self.passages, scores, ids)
        return self.index.search(list(questions), k, hybrid=self.hybrid)

    def read(self, questions: list[str], retrieved: list[list[dict]]) -> list[list[dict]]:
        """Per question, per passage read: {"passage_id", "text" (its best span), "score", "null_score",
        "null_minus_best"}, in retrieval order. Every (question, passage) pair goes through the reader's one
        decoding, in batches."""
        examples = [{"id": f"{i}:{r}", "question": q, "context": p["text"]}
                    for i, (q, passages) in enumerate(zip(questions, retrieved)) for r, p in enumerate(passages)]
        decoded = self.reader.spans(examples) if examples else {}
        return [[{"passage_id": p["passage_id"], "text": decoded[f"{i}:{r}"]["text"],
                  "score": decoded[f"{i}:{r}"]["score"], "null_score": decoded[f"{i}:{r}"]["null_score"],
                  "null_minus_best": decoded[f"{i}:{r}"]["null_minus_best"]} for r, p in enumerate(passages)]
                for i, passages in enumerate(retrieved)]

    def ask(self, questions: list[str], k: int = 5, threshold: float | None = "recorded") -> list[dict]:
        """Per question {"answer" ("" = no answer), "passage_id", "score", "null_minus_best", "passages" (what each
        passage read gave)}. `threshold`: the system's (default: the reader's recorded one; None: always answer)."""
        threshold = self.recorded_threshold if threshold == "recorded" else threshold
        readings = self.read(questions, self.retrieve(questions, k))
        out = []
        for passages in readings:
            c = combine(passages)
            out.append({"answer": answer(c, threshold), "passage_id": c["passage_id"], "score": c["score"],
                        "null_minus_best": c["null_minus_best"], "passages": passages})
        return out

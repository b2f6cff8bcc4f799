"""The QA system: retrieve passages of a corpus with a trained retriever (or BM25), read them with a trained reader,
answer by the one rule of utils.system.answer. Each model runs with its recorded settings and precision unless told.

    from utils.system import QASystem
    qa = QASystem("outputs/dpr-squad", "outputs/reader-squad", passages="corpus.jsonl")   # or retriever="bm25"
    for a in qa.ask(["Who designed the Corran lighthouse?"], k=5):
        print(a["answer"] or "(no answer)", a["passage_id"], a["score"])
    qa.ask("Who designed the Corran lighthouse?")                      # one question: its answer, not a list
"""

import copy

from utils.errors import UserError
from utils.files.corpus import load_passages
from utils.files.questions import question_list
from utils.index.index import Index
from utils.reader.trained import Reader
from utils.retriever.retriever import Retriever
from utils.search.bm25 import BM25
from utils.search.hits import check_k, ranked_passages
from utils.system.answer import READING_STATS, answer, at_share, check_settings, combine

NBEST_KEPT = 5  # spans of each passage kept in its reading (its best first)


class QASystem:
    def __init__(self, retriever, reader, passages=None, index=None, hybrid: bool | None = None,
                 device: str | None = None, mixed_precision: str | None = None, batch_size: int = 64,
                 progress: bool = False, retriever_weight: float = 0.0,
                 calibration: tuple | None = None, unanswerable_share: float | None = None):
        """`retriever`: a train_dpr.py directory (or its loaded `Retriever`), or "bm25". `reader`: a train_reader.py
        directory (or its loaded `Reader`). Give the corpus as `passages` (a JSON-lines file or a list of
        {"title", "text", "passage_id"}) or as `index` (an Index or its directory); UserError for both or neither.
        `hybrid`: fuse with BM25 at the retriever's recorded weight (default: when it has one). `mixed_precision`: both
        models' autocast ("no", "bf16", "fp16"; default: each model's own). `retriever_weight`: how much a passage's
        retrieval score weighs on what is read in it (0: the reader's alone). `calibration`: (a, b) or (a, b, share)
        fitted by qa_system.py, for calibrated no_answer_probability. `unanswerable_share`: the share of unanswerable
        questions expected; the threshold and calibration move to it (needs the calibration's share)."""
        if (passages is None) == (index is None):
            raise UserError("give the corpus as passages, or as an index of it (one of them)")
        self.progress = progress
        check_settings(retriever_weight, calibration, unanswerable_share)
        self.retriever_weight, self.calibration = retriever_weight, calibration
        self.unanswerable_share = unanswerable_share
        self.reader = reader if isinstance(reader, Reader) else Reader(
            reader, device=device, batch_size=batch_size, mixed_precision=mixed_precision, sort_by_length=True)
        if isinstance(retriever, str) and retriever == "bm25":  # the passages given, or an index's with its BM25
            self.hybrid, self.retriever, self.index = False, None, None
            if passages is not None:
                self.passages = load_passages(passages)
                self.bm25 = BM25(self.passages)
            else:
                index = index if isinstance(index, Index) else Index.load(index)
                self.index, self.passages, self.bm25 = index, index.passages, lexical(index, "the index given")
            return
        self.retriever = retriever if isinstance(retriever, Retriever) else Retriever(
            retriever, device=device, batch_size=batch_size, mixed_precision=mixed_precision)
        self.hybrid = self.retriever.settings.hybrid_by_default if hybrid is None else hybrid
        if index is None:
            index = self.retriever.index(passages, bm25=self.hybrid, progress=progress)
        elif isinstance(index, Index):
            self.retriever.check_index(index, "the index given")
        else:  # its directory
            index, directory = Index.load(index), index
            self.retriever.check_index(index, directory)
        self.index = index
        if self.hybrid and self.index.bm25 is None:
            raise UserError("the index has no BM25 (built with bm25=False): give hybrid=False, or index with BM25")
        self.passages, self.bm25 = self.index.passages, None

    def with_index(self, index: Index, where: str) -> "QASystem":
        """This system over another index (a new version of its own: serve.py's reload), the models shared, not
        loaded again; the index is checked as one given at the start (`where` names it in the errors)."""
        other = copy.copy(self)
        if self.retriever is None:  # BM25: the new version's passages and BM25
            other.index, other.passages, other.bm25 = index, index.passages, lexical(index, where)
            return other
        self.retriever.check_index(index, where)
        if self.hybrid and index.bm25 is None:
            raise UserError(f"{where}: the index has no BM25, which this system's hybrid needs")
        other.index, other.passages = index, index.passages
        return other

    def with_reader(self, reader: Reader) -> "QASystem":
        """This system with another reader (a new one published into its directory: serve.py's reload), the index and
        the retriever shared."""
        other = copy.copy(self)
        other.reader = reader
        return other

    @property
    def null_threshold(self) -> float | None:
        """The reader's own null threshold (0 for a QA model without reader_settings.json; None: always answer)."""
        return self.reader.settings.null_threshold

    @property
    def shared_norm(self) -> bool:
        """Whether answers follow the shared rule (a shared-normalization reader): one no-answer per question over
        every passage read."""
        return self.reader.settings.shared_norm

    @property
    def precisions(self) -> dict:
        """The precision each part runs at: {"reader", "retriever", "index" (the passage vectors')}."""
        out = {"reader": self.reader.mixed_precision}
        if self.retriever is not None:
            out.update(retriever=self.retriever.mixed_precision, index=self.index.built_by["precision"])
        return out

    def settings(self, threshold: float | None = "recorded", unanswerable_share: float | None = "system") -> tuple:
        """(threshold, calibration) the system answers with, both moved to `unanswerable_share` ("system": the
        system's own; None: as tuned). `threshold` "recorded": the reader's own."""
        threshold = self.null_threshold if threshold == "recorded" else threshold
        share = self.unanswerable_share if unanswerable_share == "system" else unanswerable_share
        return at_share(threshold, self.calibration, share)

    def retrieve(self, questions: list[str], k: int) -> list[list[dict]]:
        """Per question its k best passages ({"passage_id", "title", "text", "score"}), best first."""
        questions, _ = question_list(questions), check_k(k)
        if self.bm25 is not None:
            scores, ids, _, _ = self.bm25.search(questions, k)
            return ranked_passages(self.passages, scores, ids)
        return self.retriever.search(self.index, questions, k, hybrid=self.hybrid)

    def read(self, questions: list[str], retrieved: list[list[dict]]) -> list[list[dict]]:
        """Per question, per passage read in retrieval order: {"passage_id", "retrieval_score", "text" (its best span),
        "start"/"end" (character offsets; None without a span), "score", "null_score", "null_minus_best", "nbest",
        and the log-sum-exps the shared rule combines}."""
        examples = [{"id": f"{i}:{r}", "question": q, "context": p["text"]}
                    for i, (q, passages) in enumerate(zip(questions, retrieved)) for r, p in enumerate(passages)]
        decoded = self.reader.spans(examples, progress="reading" if self.progress else None) if examples else {}
        out = []
        for i, passages in enumerate(retrieved):
            row = []
            for r, p in enumerate(passages):
                d = decoded[f"{i}:{r}"]
                span = d["nbest"][0] if d["nbest"] else {"start": None, "end": None}
                row.append({"passage_id": p["passage_id"], "retrieval_score": p.get("score"), "text": d["text"],
                            "start": span["start"],
                            "end": span["end"], "score": d["score"], "null_score": d["null_score"],
                            "null_minus_best": d["null_minus_best"], "nbest": d["nbest"][:NBEST_KEPT],
                            **{k: d[k] for k in READING_STATS}})
            out.append(row)
        return out

    def ask(self, questions, k=5, threshold: float | None = "recorded", unanswerable_share="system"):
        """Per question {"answer" ("" = no answer), "passage_id", "title", "source" (where the passage came from: its
        document, its place there, its page; None where the corpus does not say), "start"/"end" (character offsets
        in that passage), "score" (None on an abstention), "null_minus_best", "passages" (the k read, with what the
        reader found in each)}. `questions`: a list, or one string (then one answer, not a list). `k` and
        `unanswerable_share` (see `settings`): one value, or a list of one per question. `threshold`: default the
        reader's recorded one; None: always answer. UserError on mismatched list lengths or a bad k."""
        one = isinstance(questions, str)
        questions = question_list(questions)
        ks = list(k) if isinstance(k, (list, tuple)) else [k] * len(questions)
        shares = list(unanswerable_share) if isinstance(unanswerable_share, (list, tuple)) \
            else [unanswerable_share] * len(questions)
        if len(ks) != len(questions) or len(shares) != len(questions):
            raise UserError(f"{len(ks)} k's and {len(shares)} shares for {len(questions)} questions")
        for each in ks:
            check_k(each)
        settings = {share: self.settings(threshold, share) for share in set(shares)}  # each checked before reading
        # Retrieved together at the largest k: a ranking's first k are the same whatever k was asked for.
        retrieved = [hits[:each] for hits, each in zip(self.retrieve(questions, max(ks, default=1)), ks)]
        out = [answer_of(combine(readings, self.shared_norm, retriever_weight=self.retriever_weight,
                                 calibration=settings[share][1]), settings[share][0], passages, readings)
               for passages, readings, share in zip(retrieved, self.read(questions, retrieved), shares)]
        return out[0] if one else out


def answer_of(combined: dict, threshold: float | None, passages: list[dict], readings: list[dict]) -> dict:
    """One question's answer as `QASystem.ask` gives it, plus "text", its passage's text (None on an abstention)."""
    text = answer(combined, threshold)
    chosen = (next((j for j, p in enumerate(passages) if p["passage_id"] == combined["passage_id"]), None)
              if text else None)
    hit = passages[chosen] if chosen is not None else None
    start = readings[chosen]["start"] if hit else None
    end = readings[chosen]["end"] if hit else None
    return {"answer": text, "passage_id": hit and hit["passage_id"], "title": hit and hit["title"],
            "text": hit and hit["text"], "source": hit.get("source") if hit else None, "start": start, "end": end,
            "score": combined["score"] if hit else None, "null_minus_best": combined["null_minus_best"],
            "no_answer_probability": combined["no_answer_probability"],
            "passages": [{**p, "reading": r} for p, r in zip(passages, readings)]}


def lexical(index: Index, where: str) -> BM25:
    """The BM25 of an index a BM25 system searches (one built by index_corpus.py --retriever bm25, or a dense one
    built with BM25)."""
    if index.bm25 is None:
        raise UserError(f"{where}: the index has no BM25 (a dense index built without it): give --passages, or an "
                        "index built with --retriever bm25 or --bm25 true")
    return index.bm25

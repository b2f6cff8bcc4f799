"""A train_dpr.py retriever used as trained (retriever_settings.json): it encodes, indexes a corpus, and searches an
index (utils.index.index) of its own passage vectors, dense or fused with BM25.

    from utils.retriever import Index, Retriever
    retriever = Retriever("outputs/dpr-squad")
    q = retriever.encode_questions(["Who designed the Corran lighthouse?"])       # (1, dim) float32
    vectors, owner = retriever.encode_passages(passages)   # windows as trained; owner[row] = its passage
    index = retriever.index("corpus.jsonl")                 # in memory; index_corpus.py at scale, Index.load reads it
    hits = retriever.search(index, "Who designed the Corran lighthouse?", k=5, hybrid=True)   # its list of hits
"""

import os
from dataclasses import asdict

import numpy as np
import torch

from utils.errors import UserError
from utils.files.corpus import load_passages
from utils.files.questions import question_list
from utils.index.index import Index
from utils.index.writer import index_for_run
from utils.retriever.bi_encoder import load_bi_encoder
from utils.retriever.encoding import encode_texts, load_tokenizers, tokenize_passages, tokenize_questions
from utils.retriever.sentence_windows import sentence_windows
from utils.retriever.settings import PASSAGE_ENCODER, QUERY_ENCODER, RetrieverSettings
from utils.runtime.model_fingerprint import model_fingerprint
from utils.search.bm25 import BM25
from utils.search.hits import check_k
from utils.search.vectors import Vectors

AUTOCAST = {"no": None, "bf16": torch.bfloat16, "fp16": torch.float16}


class Retriever:
    """The encoders of a retriever trained by train_dpr.py, with its ranking settings."""

    def __init__(self, model_dir: str, device: str | None = None, batch_size: int = 64,
                 mixed_precision: str | None = None):
        """`mixed_precision`: autocast to embed under ("no", "bf16", "fp16"; default: the run's). UserError if
        invalid."""
        self.model_dir = os.path.abspath(model_dir)
        self.settings = s = RetrieverSettings.load(model_dir)
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        if batch_size < 1:
            raise UserError(f"batch_size must be at least 1 (got {batch_size})")
        self.batch_size = batch_size
        # The recorded precision by default, so that it ranks exactly as the run did.
        self.mixed_precision = mixed_precision or s.precision
        if self.mixed_precision not in AUTOCAST:
            raise UserError(f"precision {self.mixed_precision!r}: choose no, bf16 or fp16")
        query, passage = os.path.join(model_dir, QUERY_ENCODER), os.path.join(model_dir, PASSAGE_ENCODER)
        self.q_tok, self.p_tok = load_tokenizers(query, passage, s.shared_encoder, s.max_query_length,
                                                 s.max_passage_length)
        self.model = load_bi_encoder(query, passage, s.shared_encoder, s.pooling, s.similarity,
                                     length_buckets=4).to(self.device).eval()
        self._fingerprint = None

    @property
    def dimension(self) -> int:
        return self.model.query_encoder.config.hidden_size

    @property
    def hybrid_by_default(self) -> bool:
        """Whether it ranks fused with BM25 unless told otherwise (a dense weight was tuned): an index of its vectors
        then comes with BM25."""
        return self.settings.hybrid_by_default

    @property
    def passage_encoder_dir(self) -> str:
        return os.path.join(self.model_dir, QUERY_ENCODER if self.settings.shared_encoder else PASSAGE_ENCODER)

    @property
    def fingerprint(self) -> str:
        """What identifies this retriever's passage vectors: recorded in every index it builds, checked on search."""
        if self._fingerprint is None:
            self._fingerprint = model_fingerprint(self.passage_encoder_dir)
        return self._fingerprint

    def built_by(self) -> dict:
        """What an index records of the retriever that made its vectors."""
        return {"model": self.model_dir, "passage_encoder": self.fingerprint, "settings": asdict(self.settings),
                "precision": self.mixed_precision}

    def _encode(self, tokens, side: str, pad: int, progress=None) -> torch.Tensor:
        autocast = AUTOCAST[self.mixed_precision]
        with torch.autocast(self.device.type, dtype=autocast, enabled=autocast is not None):
            return encode_texts(self.model, tokens, side, pad, self.batch_size, self.device, progress=progress)

    def encode_questions(self, questions: list[str]) -> torch.Tensor:
        return self._encode(tokenize_questions(self.q_tok, question_list(questions), self.settings.max_query_length),
                            "query", self.q_tok.pad_token_id)

    def encode_passages(self, passages: list[dict],
                        progress: str | None = None) -> tuple[np.ndarray, np.ndarray | None]:
        """(vectors float32, owner): one vector per passage or, for a sentence-trained retriever, per sentence window
        (owner[row] = the position of its passage in `passages`; None without windows)."""
        windows, owner = sentence_windows(passages, self.settings.window_sentences)
        tokens = tokenize_passages(self.p_tok, windows, self.settings.max_passage_length, self.settings.embed_title)
        vectors = self._encode(tokens, "passage", self.p_tok.pad_token_id, progress=progress).numpy()
        if not len(windows):
            vectors = np.zeros((0, self.dimension), np.float32)
        return vectors, (owner if self.settings.window_sentences else None)

    def index(self, passages, dtype: str = "float32", bm25: bool = True, progress: bool = True) -> Index:
        """An in-memory Index of `passages` (a list of {"title", "text", "passage_id"}, or a JSON-lines file of them,
        checked before anything is embedded). `dtype` float16 halves the memory, float32 keeps scores exact. With
        `bm25`, also a BM25 index for the hybrid. For a corpus beyond memory, use index_corpus.py."""
        if dtype not in ("float32", "float16"):
            raise UserError(f"index dtype {dtype!r}: choose float32 or float16")
        passages = load_passages(passages)
        vectors, owner = self.encode_passages(passages, progress="indexing" if progress else None)
        return Index([Vectors(vectors.astype(dtype), owner, len(passages))], passages,
                     BM25(passages) if bm25 else None, self.built_by())

    def check_index(self, index: Index, where: str) -> None:
        """Refuse (a one-line error starting with `where`) an index whose vectors this retriever's passage encoder did
        not make: another encoder (or this directory retrained since), other settings or another dimension."""
        index.check_encoder(self.model_dir, self.settings, self.fingerprint, self.dimension, where)

    def search(self, index: Index, questions, k: int = 10, hybrid: bool = False):
        """Per question its k best passages of `index`, best first: {"passage_id", "title", "text", "score"} (fewer
        when the corpus has fewer). Dense, or with `hybrid` fused with BM25 at the recorded dense weight (UserError
        without one). `questions`: a list, or one string (then its hits). The index must be this retriever's
        (`check_index`; for one loaded from disk, `Retriever(index.model_dir)`)."""
        one = isinstance(questions, str)
        questions = question_list(questions)
        check_k(k)
        if not questions:
            return []
        hits = index.hits(*self.rank(index, questions, k, hybrid))
        return hits[0] if one else hits

    def rank(self, index: Index, questions: list[str], k: int, hybrid: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """(scores, ids): what `search` ranks, as indices into the index's passages (-1: none)."""
        self.check_index(index, f"the index built by {index.model_dir}")
        weight = self.settings.hybrid_dense_weight
        if hybrid and weight is None:
            raise UserError(f"{self.model_dir}: no recorded hybrid dense weight")
        q = self.encode_questions(questions)
        if hybrid:
            # Fused over both rankings' first `hybrid_candidates`, so the hybrid's first hits do not depend on k.
            return index.hybrid_search(q, questions, k, weight, self.settings.hybrid_candidates)
        return index.search(q, k)


def ranking_for_run(accelerator, retriever_dir: str, passages: str | None, index_dir: str | None, into: str,
                    overwrite: bool = False):
    """A trained retriever's ranking of a corpus for one training run (train_reader.py --retriever), as the QA
    system ranks with it (hybrid where it recorded a dense weight): (the corpus as its index holds it,
    `rank(questions, depth)` -> (scores, ids)). The index is `index_dir`, or `passages` indexed by every process,
    each its shard, into `into` (index_for_run: a killed run's is resumed; with `overwrite` an earlier run's is
    built anew); every process searches its share of the shards for every question (a collective): no process
    embeds or searches the whole corpus alone."""
    retriever = Retriever(retriever_dir, device=str(accelerator.device))
    hybrid = retriever.hybrid_by_default
    if index_dir is None:
        index = index_for_run(accelerator, retriever, passages, into, hybrid, overwrite)
    else:
        index = Index.load(index_dir, share=(accelerator.process_index, accelerator.num_processes))
        retriever.check_index(index, f"--index {index_dir}")
    return index.passages, lambda questions, depth: retriever.rank(index, questions, depth, hybrid)

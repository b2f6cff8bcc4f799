"""A trained retriever used as trained, and its index of a corpus.

`Retriever(dir)` loads a train_dpr.py output directory: the encoders and how they rank (retriever_settings.json:
pooling, similarity, sentence windows, titles, lengths, the hybrid's dense weight). `Retriever.index(passages)`
embeds a corpus the way the run ranked it (a sentence-trained model indexes sentence windows and ranks a passage by
its best one) into an `Index`, which saves to a directory, loads from it memory-mapped, and searches it exactly
(utils.retriever.search: blockwise, never the questions x corpus matrix), optionally fused with BM25 at the
recorded weight (utils.retriever.fusion). For corpora beyond memory or approximate search it exports to FAISS.

    from utils.retriever.index import Index, Retriever
    index = Retriever("outputs/dpr-squad").index("corpus.jsonl")   # or a list of {"title", "text", "passage_id"}
    index.save("outputs/corpus-index")                               # later: Index.load("outputs/corpus-index")
    for hits in index.search(["Who designed the Corran lighthouse?"], k=5, hybrid=True):
        print([(h["passage_id"], round(h["score"], 3)) for h in hits])
"""

import json
import os
import shutil
from dataclasses import asdict
from types import SimpleNamespace

import numpy as np
import torch

from utils.loop.errors import UserError
from utils.loop.jsonfiles import json_line
from utils.loop.output_dir import staged_directory
from utils.retriever.bi_encoder import load_bi_encoder
from utils.retriever.bm25 import BM25
from utils.retriever.data import load_passages
from utils.retriever.encoding import encode_texts, load_tokenizers, tokenize_passages, tokenize_questions
from utils.retriever.fusion import convex_fusion, gather_candidates
from utils.retriever.search import Vectors, score_passages, top_k
from utils.retriever.sentence_windows import sentence_windows
from utils.retriever.settings import PASSAGE_ENCODER, QUERY_ENCODER, RetrieverSettings, encoder_fingerprint

INDEX_FILE, FORMAT = "index.json", 2
# What an index's vectors depend on beside the passage encoder's weights: compared with the retriever searching it.
VECTOR_SETTINGS = ("pooling", "similarity", "embed_title", "window_sentences", "max_passage_length")


class Retriever:
    """The encoders of a retriever trained by train_dpr.py, with its ranking settings."""

    def __init__(self, model_dir: str, device: str | None = None, batch_size: int = 64, precision: str | None = None):
        """`precision`: the autocast to embed under ("no", "bf16", "fp16"); default: the one the run evaluated with
        (retriever_settings.json), so that it ranks exactly as the run did."""
        self.model_dir = os.path.abspath(model_dir)
        self.settings = RetrieverSettings.load(model_dir)
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        if batch_size < 1:
            raise UserError(f"batch_size must be at least 1 (got {batch_size})")
        self.batch_size = batch_size
        self.precision = precision or self.settings.precision
        if self.precision not in ("no", "bf16", "fp16"):
            raise UserError(f"precision {self.precision!r}: choose no, bf16 or fp16")
        self.autocast = {"no": None, "bf16": torch.bfloat16, "fp16": torch.float16}[self.precision]
        self._fingerprint = None
        self._args = SimpleNamespace(**asdict(self.settings), length_buckets=4,
                                     query_model_name_or_path=os.path.join(model_dir, QUERY_ENCODER),
                                     passage_model_name_or_path=os.path.join(model_dir, PASSAGE_ENCODER))
        self.q_tok, self.p_tok = load_tokenizers(self._args)
        self.model = load_bi_encoder(self._args).to(self.device).eval()

    @property
    def dimension(self) -> int:
        return self.model.query_encoder.config.hidden_size

    @property
    def passage_encoder_dir(self) -> str:
        return os.path.join(self.model_dir, QUERY_ENCODER if self.settings.shared_encoder else PASSAGE_ENCODER)

    @property
    def fingerprint(self) -> str:
        """What identifies the passage vectors this retriever makes (`encoder_fingerprint` of its passage encoder):
        recorded in every index it builds and checked when one is searched."""
        if self._fingerprint is None:
            self._fingerprint = encoder_fingerprint(self.passage_encoder_dir)
        return self._fingerprint

    def _encode(self, tokens, side: str, pad: int, progress=None) -> torch.Tensor:
        with torch.autocast(self.device.type, dtype=self.autocast, enabled=self.autocast is not None):
            return encode_texts(self.model, tokens, side, pad, self.batch_size, self.device, progress=progress)

    def encode_questions(self, questions: list[str]) -> torch.Tensor:
        return self._encode(tokenize_questions(self.q_tok, question_list(questions), self._args), "query",
                            self.q_tok.pad_token_id)

    def index(self, passages, dtype: str = "float32", bm25: bool = True, progress: bool = True) -> "Index":
        """Embed `passages` (a list of {"title", "text", "passage_id"}, or a JSON-lines file of them; checked as
        every corpus is, utils.retriever.data.load_passages, before anything is embedded) as the run ranked them.
        float16 halves the index's memory for scores within about 1e-3 of float32's (exact: float32). With `bm25`,
        a BM25 index for the hybrid is built too."""
        if dtype not in ("float32", "float16"):
            raise UserError(f"index dtype {dtype!r}: choose float32 or float16")
        passages = load_passages(passages)
        windows, owner = sentence_windows(passages, self.settings.window_sentences)
        embeddings = self._encode(tokenize_passages(self.p_tok, windows, self._args), "passage",
                                  self.p_tok.pad_token_id, progress="indexing" if progress else None)
        return Index(self, embeddings.numpy().astype(dtype), owner if self.settings.window_sentences else None,
                     passages, BM25(passages) if bm25 else None,
                     built_by={"model": self.model_dir, "passage_encoder": self.fingerprint,
                               "settings": asdict(self.settings), "precision": self.precision})


class Index:
    """Embeddings of a corpus (rows: passages, or their sentence windows with `owner`), the passages, optionally
    BM25 over them, and the retriever that made it (to encode questions)."""

    def __init__(self, retriever: Retriever | None, embeddings, owner, passages: list[dict], bm25: BM25 | None,
                 built_by: dict):
        """`built_by`: what made the vectors ({"model", "passage_encoder" (its fingerprint), "settings",
        "precision"}), checked against every retriever that searches them."""
        self.built_by, self.model_dir = built_by, built_by["model"]
        self._retriever = retriever
        self.vectors = Vectors(embeddings, owner, len(passages))
        self.passages, self.bm25 = passages, bm25

    @property
    def retriever(self) -> Retriever:
        if self._retriever is None:  # loaded from a directory: the retriever it names, on first use, checked
            retriever = Retriever(self.model_dir)
            self.check_retriever(retriever, f"the index built by {self.model_dir}")
            self._retriever = retriever
        return self._retriever

    def check_retriever(self, retriever: Retriever, where: str) -> None:
        """Refuse (one line) a retriever whose passage vectors are not this index's: another encoder (or the same
        directory retrained), other settings or another dimension."""
        dimension = np.asarray(self.vectors.embeddings).shape[1] if len(self.vectors.embeddings) else None
        if dimension is not None and dimension != retriever.dimension:
            raise UserError(f"{where}: {dimension}-dimensional vectors, but {retriever.model_dir} embeds in "
                            f"{retriever.dimension}")
        ours, theirs = asdict(retriever.settings), self.built_by["settings"]
        differ = [k for k in VECTOR_SETTINGS if theirs.get(k) != ours[k]]
        if differ:
            raise UserError(f"{where}: built with other settings than {retriever.model_dir} ranks with ("
                            + ", ".join(f"{k}: {theirs.get(k)} vs {ours[k]}" for k in differ) + ")")
        if self.built_by["passage_encoder"] != retriever.fingerprint:
            raise UserError(f"{where}: its vectors were made by another passage encoder than {retriever.model_dir}'s "
                            f"(built by {self.model_dir}, encoder fingerprint {self.built_by['passage_encoder'][:12]} vs "
                            f"{retriever.fingerprint[:12]}; a retriever retrained since?): index the corpus again")

    def search(self, questions, k: int = 10, hybrid: bool = False):
        """Per question its k best passages, best first: {"passage_id", "title", "text", "score"} (fewer when the
        corpus has fewer). Dense, or with `hybrid` fused with BM25 at the retriever's recorded dense weight over both
        rankings' candidates. `questions`: a list of strings; a single string is one question, and then the result
        is that question's list of hits."""
        one = isinstance(questions, str)
        questions = question_list(questions)
        check_k(k)
        if not questions:
            return []
        q = self.retriever.encode_questions(questions)
        settings = self.retriever.settings
        depth = max(k, settings.hybrid_candidates) if hybrid else k
        scores, ids, _ = top_k(q, self.vectors, depth)
        if hybrid:
            if self.bm25 is None:
                raise UserError("this index has no BM25 (built with bm25=False): search with hybrid=False")
            if settings.hybrid_dense_weight is None:
                raise UserError(f"{self.model_dir}: no recorded hybrid dense weight")
            lex_s, lex_i, _, lex_of_dense = self.bm25.search(questions, settings.hybrid_candidates, score_ids=ids)
            c = gather_candidates(scores, ids, lex_s, lex_i, lex_of_dense, score_passages(q, self.vectors, lex_i))
            fused = convex_fusion(c, settings.hybrid_dense_weight)
            order = np.argsort(-fused, axis=1, kind="stable")[:, :k]
            scores, ids = np.take_along_axis(fused, order, 1), np.take_along_axis(c.ids, order, 1)
        hits = ranked_passages(self.passages, scores[:, :k], ids[:, :k])
        return hits[0] if one else hits

    # --- on disk ---

    def save(self, directory: str, overwrite: bool = False) -> None:
        """embeddings.npy (+ owner.npy for sentence windows), passages.jsonl, bm25/ and index.json (what built the
        vectors). A directory that holds anything but an index is refused, an index only replaced with `overwrite`;
        the new index is written beside it and swapped in as a whole (utils.loop.output_dir.staged_directory), so
        that a crash leaves the old index or the new one, never none or a mix."""
        if os.path.lexists(directory) and not os.path.isdir(directory):
            raise UserError(f"{directory}: is a file, not a directory: save the index to a new or empty directory")
        if os.path.isdir(directory) and os.listdir(directory):
            if not os.path.isfile(os.path.join(directory, INDEX_FILE)):
                raise UserError(f"{directory}: not empty and not an index: save the index to a new or empty "
                                "directory")
            if not overwrite:
                raise UserError(f"{directory}: holds an index already: pass overwrite=True to replace it")
        embeddings = np.asarray(self.vectors.embeddings)
        try:
            with staged_directory(directory, loadable=INDEX_FILE) as tmp:
                np.save(os.path.join(tmp, "embeddings.npy"), embeddings)
                if self.vectors.owner is not None:
                    np.save(os.path.join(tmp, "owner.npy"), self.vectors.owner)
                with open(os.path.join(tmp, "passages.jsonl"), "w", encoding="utf-8") as f:
                    f.writelines(json_line(p) + "\n" for p in self.passages)
                if self.bm25 is not None:
                    self.bm25.save(os.path.join(tmp, "bm25"))
                meta = {"format": FORMAT, **self.built_by, "dimension": int(embeddings.shape[1]),
                        "dtype": str(embeddings.dtype), "vectors": int(embeddings.shape[0]),
                        "passages": len(self.passages), "bm25": self.bm25 is not None}
                with open(os.path.join(tmp, INDEX_FILE), "w") as f:
                    json.dump(meta, f, indent=1)
        except OSError as err:
            raise UserError(f"{directory}: cannot write the index ({err.strerror or err})") from None

    @classmethod
    def load(cls, directory: str, retriever: Retriever | None = None) -> "Index":
        """An index saved by `save`, its embeddings memory-mapped. Every mismatch (files missing, shapes, another
        retriever's encoder, settings or dimension: checked now against `retriever`, else against the retriever the
        index names when it is first needed) is a one-line UserError naming the directory."""
        meta = _read_meta(directory)
        embeddings = _load_array(directory, "embeddings.npy")
        if embeddings.shape != (meta["vectors"], meta["dimension"]) or str(embeddings.dtype) != meta["dtype"]:
            raise UserError(f"{directory}: embeddings.npy is {embeddings.dtype} {embeddings.shape}, index.json says "
                            f"{meta['dtype']} ({meta['vectors']}, {meta['dimension']})")
        owner = None
        if meta["settings"].get("window_sentences"):
            owner = _load_array(directory, "owner.npy")
            if len(owner) != meta["vectors"] or (len(owner) and int(owner[-1]) + 1 != meta["passages"]):
                raise UserError(f"{directory}: owner.npy does not map the {meta['vectors']} vectors to "
                                f"{meta['passages']} passages")
        passages = load_passages(os.path.join(directory, "passages.jsonl"))
        if len(passages) != meta["passages"]:
            raise UserError(f"{directory}: passages.jsonl holds {len(passages)} passages, index.json says "
                            f"{meta['passages']}")
        bm25 = BM25.load(os.path.join(directory, "bm25"), len(passages)) if meta.get("bm25") else None
        built_by = {k: meta[k] for k in ("model", "passage_encoder", "settings", "precision")}
        index = cls(None, embeddings, owner, passages, bm25, built_by)
        if retriever is not None:
            index.check_retriever(retriever, directory)
            index._retriever = retriever
        return index

    # --- FAISS ---

    def to_faiss(self, kind: str = "flat", hnsw_m: int = 32):
        """A FAISS index (faiss-cpu) over the stored vectors, inner product (cosine retrievers' vectors are
        normalised): "flat" (exact) or "hnsw" (approximate, `hnsw_m` links per node). Row i is vector i of this
        index: with sentence windows, map rows to passages with `search_faiss` or this index's owner array."""
        try:  # optional: training, evaluation and the exact search never need it
            import faiss
        except ImportError:
            raise UserError("Index.to_faiss needs FAISS: pip install faiss-cpu (or faiss-gpu)") from None

        vectors = np.ascontiguousarray(np.asarray(self.vectors.embeddings, dtype=np.float32))
        if kind == "flat":
            out = faiss.IndexFlatIP(vectors.shape[1])
        elif kind == "hnsw":
            out = faiss.IndexHNSWFlat(vectors.shape[1], hnsw_m, faiss.METRIC_INNER_PRODUCT)
        else:
            raise UserError(f"FAISS index kind {kind!r}: choose flat or hnsw")
        out.add(vectors)
        return out

    def search_faiss(self, faiss_index, questions, k: int = 10):
        """`search` through a FAISS index of this index's vectors (`to_faiss`). With sentence windows it asks for k x
        the most windows a passage has and keeps each passage's best window: exact for a flat index (those windows
        hold at least k distinct passages)."""
        one = isinstance(questions, str)
        questions = question_list(questions)
        check_k(k)
        if not questions:
            return []
        q = np.ascontiguousarray(self.retriever.encode_questions(questions).numpy())
        per = int(np.diff(self.vectors.starts).max()) if self.vectors.count else 1
        scores, rows = faiss_index.search(q, min(k * per, len(self.vectors.embeddings)))
        owner = self.vectors.owner
        out = []
        for row_s, row_r in zip(scores, rows):
            seen, hits = set(), []
            for s, r in zip(row_s, row_r):
                p = int(owner[r]) if owner is not None and r >= 0 else int(r)
                if r < 0 or p in seen:
                    continue
                seen.add(p)
                hits.append(passage_hit(self.passages, p, s))
                if len(hits) == k:
                    break
            out.append(hits)
        return out[0] if one else out


def passage_hit(passages: list[dict], j: int, score) -> dict:
    """Passage j of the corpus as a search result: {"passage_id", "title", "text", "score"}."""
    p = passages[j]
    return {"passage_id": p["passage_id"], "title": p["title"], "text": p["text"], "score": float(score)}


def ranked_passages(passages: list[dict], scores, ids) -> list[list[dict]]:
    """Per query, its ranked passage ids (-1: none) and scores as search results, best first."""
    return [[passage_hit(passages, int(j), s) for s, j in zip(row_s, row_i) if j >= 0]
            for row_s, row_i in zip(scores, ids)]


def question_list(questions) -> list[str]:
    """Questions as a list of non-empty strings; a single string is one question (not one per character)."""
    if isinstance(questions, str):
        questions = [questions]
    try:
        questions = list(questions)
    except TypeError:
        raise UserError(f"questions: expected a string or a list of strings, got {type(questions).__name__}") from None
    for i, q in enumerate(questions):
        if not isinstance(q, str) or not q.strip():
            raise UserError(f"question #{i}: expected a non-empty string, got {q!r}")
    return questions


def check_k(k) -> None:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise UserError(f"k must be a whole number of at least 1 (got {k!r})")


def _read_meta(directory: str) -> dict:
    path = os.path.join(directory, INDEX_FILE)
    if not os.path.isfile(path):
        raise UserError(f"{directory}: not an index (no {INDEX_FILE})")
    try:
        with open(path) as f:
            meta = json.load(f)
    except ValueError as err:
        raise UserError(f"{path}: malformed ({err})") from None
    if not isinstance(meta, dict) or "format" not in meta:
        raise UserError(f"{path}: malformed (no format)")
    if meta["format"] != FORMAT:
        raise UserError(f"{path}: index format {meta['format']}, this version reads {FORMAT}: index the corpus again")
    missing = [k for k in ("model", "passage_encoder", "settings", "precision", "dimension", "dtype", "vectors",
                           "passages") if k not in meta]
    if missing:
        raise UserError(f"{path}: malformed (missing {', '.join(missing)})")
    return meta


def _load_array(directory: str, name: str) -> np.ndarray:
    path = os.path.join(directory, name)
    if not os.path.isfile(path):
        raise UserError(f"{directory}: {name} is missing")
    return np.load(path, mmap_mode="r")

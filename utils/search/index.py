"""An index of a corpus: its vectors (in shards), its passages, optionally BM25 over them, and what made the vectors.

`Retriever.index(passages)` (utils.retriever.retriever) builds one in memory; `index_corpus.py` builds one on disk
from every process, shard by shard, resumable; both save the same directory layout (utils.search.index_format),
which `Index.load` maps where it lies. The search is exact (utils.search.exact: blockwise, never the questions
x corpus matrix), each passage ranked by its best sentence window for a sentence-trained retriever, optionally fused
with BM25 at the recorded weight (utils.search.fusion); FAISS indexes for approximate search are built from the
shards (utils.search.faiss_index).

    from utils.retriever import Index, Retriever
    index = Retriever("outputs/dpr-squad").index("corpus.jsonl")     # or Index.load("outputs/corpus-index")
    index.save("outputs/corpus-index")
    for hits in index.search(["Who designed the Corran lighthouse?"], k=5, hybrid=True):
        print([(h["passage_id"], round(h["score"], 3)) for h in hits])

Several processes may each load only their share of the shards (`Index.load(dir, share=(rank, world))`): a search
is then a collective that every process calls with the same questions, each searching its shards, the results
merged (utils.search.shards): the same as one process searching them all.
"""

import os
from dataclasses import asdict

import numpy as np

from utils.errors import UserError
from utils.files.jsonfiles import write_json_file
from utils.loop.output_dir import read_marker, staged_directory
from utils.search.bm25 import BM25
from utils.search.fusion import gather_candidates, hybrid_ranking
from utils.search.index_format import (FORMAT, INDEX_FILE, PassageStore, ShardWriter, content_hash,
                                         holds_index_manifest, map_shard, read_manifest, shard_name)
from utils.files.questions import question_list
from utils.search.exact import Vectors, score_shards, search_shards
from utils.search.shards import shard as share_of

# What an index's vectors depend on beside the passage encoder's weights: compared with the retriever searching it.
VECTOR_SETTINGS = ("pooling", "similarity", "embed_title", "window_sentences", "max_passage_length")


class Index:
    """Vectors of a corpus in shards (rows: passages, or their sentence windows), its passages (a list, or a
    PassageStore reading them from disk), optional BM25, and `built_by` ({"model", "passage_encoder" (its
    fingerprint), "settings", "precision"}), checked against every retriever that searches it."""

    def __init__(self, shards: list[Vectors], passages, bm25: BM25 | None, built_by: dict, retriever=None,
                 distributed: bool = False):
        """`shards`: Vectors with their global passage offsets; `distributed`: they are this process's share of
        the index, and a search is a collective over every process."""
        self.shards, self.passages, self.bm25, self.built_by = shards, passages, bm25, built_by
        self.model_dir, self.distributed = built_by["model"], distributed
        self._retriever = retriever

    @property
    def count(self) -> int:
        return len(self.passages)

    @property
    def dimension(self) -> int | None:
        return next((np.asarray(v.embeddings).shape[1] for v in self.shards if len(v.embeddings)), None)

    @property
    def retriever(self):
        if self._retriever is None:  # loaded from a directory: the retriever it names, on first use, checked
            from utils.retriever.retriever import Retriever

            retriever = Retriever(self.model_dir)
            self.check_retriever(retriever, f"the index built by {self.model_dir}")
            self._retriever = retriever
        return self._retriever

    def use(self, retriever, where: str) -> "Index":
        """Search with `retriever` (checked): another device, batch size or precision for the questions."""
        self.check_retriever(retriever, where)
        self._retriever = retriever
        return self

    def check_retriever(self, retriever, where: str) -> None:
        """Refuse (one line) a retriever whose passage vectors are not this index's: another encoder (or the same
        directory retrained), other settings or another dimension."""
        self.check_encoder(retriever.model_dir, retriever.settings, retriever.fingerprint, retriever.dimension, where)

    def check_encoder(self, model_dir: str, settings, fingerprint: str, dimension: int, where: str) -> None:
        """`check_retriever` from what identifies a retriever: its directory, settings, passage encoder fingerprint
        and dimension."""
        if self.dimension is not None and self.dimension != dimension:
            raise UserError(f"{where}: {self.dimension}-dimensional vectors, but {model_dir} embeds in {dimension}")
        ours, theirs = asdict(settings), self.built_by["settings"]
        differ = [k for k in VECTOR_SETTINGS if theirs.get(k) != ours[k]]
        if differ:
            raise UserError(f"{where}: built with other settings than {model_dir} ranks with ("
                            + ", ".join(f"{k}: {theirs.get(k)} vs {ours[k]}" for k in differ) + ")")
        if self.built_by["passage_encoder"] != fingerprint:
            raise UserError(f"{where}: its vectors were made by another passage encoder than {model_dir}'s "
                            f"(built by {self.model_dir}, encoder fingerprint {self.built_by['passage_encoder'][:12]} vs "
                            f"{fingerprint[:12]}; a retriever retrained since?): index the corpus again")

    # --- search ---

    def search(self, questions, k: int = 10, hybrid: bool = False):
        """Per question its k best passages, best first: {"passage_id", "title", "text", "score"} (fewer when the
        corpus has fewer). Dense, or with `hybrid` fused with BM25 at the retriever's recorded dense weight over both
        rankings' candidates. `questions`: a list of strings; a single string is one question, and then the result
        is that question's list of hits. The hybrid's first hits do not depend on k (utils.search.fusion: its
        candidates are each ranking's first hybrid_candidates; past them the dense ranking follows)."""
        one = isinstance(questions, str)
        questions = question_list(questions)
        check_k(k)
        if not questions:
            return []
        q = self.retriever.encode_questions(questions)
        settings = self.retriever.settings
        width = settings.hybrid_candidates  # the hybrid's candidates: each ranking's first `width`, whatever k
        depth = max(k, width) if hybrid else k
        scores, ids = search_shards(q, self.shards, min(depth, self.count), self.distributed)
        if hybrid:
            if self.bm25 is None:
                raise UserError("this index has no BM25 (built with bm25=False): search with hybrid=False")
            if settings.hybrid_dense_weight is None:
                raise UserError(f"{self.model_dir}: no recorded hybrid dense weight")
            head_s, head_i = scores[:, :width], ids[:, :width]
            lex_s, lex_i, _, lex_of_dense = self.bm25.search(questions, width, score_ids=head_i)
            dense_of_lex = score_shards(q, self.shards, lex_i, self.distributed)
            c = gather_candidates(head_s, head_i, lex_s, lex_i, lex_of_dense, dense_of_lex)
            scores, ids = hybrid_ranking(c, settings.hybrid_dense_weight, scores[:, width:], ids[:, width:], k)
        hits = ranked_passages(self.passages, scores[:, :k], ids[:, :k])
        return hits[0] if one else hits

    # --- on disk ---

    def save(self, directory: str, overwrite: bool = False) -> None:
        """The index as index_corpus.py writes one (utils.search.index_format), one shard per shard held. A
        directory that holds anything but an index is refused, an index only replaced with `overwrite`; the new
        index is written beside it and swapped in as a whole (utils.loop.output_dir.staged_directory), so that a
        crash leaves the old index or the new one, never none or a mix."""
        if self.distributed:
            raise UserError("this index holds one process's share of the shards: save the whole index instead")
        check_index_target(directory, overwrite)
        dimension = self.dimension or 0
        dtype = str(np.asarray(self.shards[0].embeddings).dtype) if self.shards else "float32"
        try:
            with staged_directory(directory, loadable=INDEX_FILE) as tmp:
                shards = []
                for i, v in enumerate(self.shards):
                    name = shard_name(i)
                    writer = ShardWriter(os.path.join(tmp, name), dimension, dtype, v.owner is not None)
                    passages = [self.passages[j] for j in range(v.offset, v.offset + v.count)]
                    writer.append(content_hash([]), passages, np.asarray(v.embeddings), v.owner)
                    shards.append({"dir": name, "first": v.offset, "last": v.offset + v.count,
                                   "vectors": len(v.embeddings)})
                if self.bm25 is not None:
                    self.bm25.save(os.path.join(tmp, "bm25"))
                write_json_file(os.path.join(tmp, INDEX_FILE), manifest(
                    self.built_by, dtype, dimension, self.count, shards, bm25=self.bm25 is not None, complete=True))
        except OSError as err:
            raise UserError(f"{directory}: cannot write the index ({err.strerror or err})") from None

    @classmethod
    def load(cls, directory: str, retriever=None, share: tuple[int, int] | None = None) -> "Index":
        """An index saved by `save` or index_corpus.py, its shards memory-mapped, its passages read from disk as
        results need them. `share` = (process index, processes): map only this process's share of the shards (a
        search is then a collective). Every mismatch (files missing or of the wrong size, another retriever's
        encoder, settings or dimension: checked now against `retriever`, else against the retriever the index names
        when it is first needed) is a one-line UserError naming the directory."""
        meta = read_manifest(directory)
        shards = meta["shards"]
        if [s["first"] for s in shards] != [0] + [s["last"] for s in shards[:-1]] or \
                (shards and shards[-1]["last"] != meta["passages"]):
            raise UserError(f"{directory}: {INDEX_FILE}: the shards do not cover the {meta['passages']} passages")
        mine = range(len(shards)) if share is None else share_of(len(shards), *share)
        vectors, parts = [], []
        for i, s in enumerate(shards):
            emb, owner, lines = map_shard(directory, meta, s)
            if len(lines) != s["last"] - s["first"]:
                raise UserError(f"{directory}: {s['dir']} holds {len(lines)} passages, the manifest says "
                                f"{s['last'] - s['first']}")
            parts.append(lines)
            if i in mine:
                try:
                    vectors.append(Vectors(emb, owner, s["last"] - s["first"], s["first"]))
                except ValueError as err:
                    raise UserError(f"{directory}: {s['dir']}: {err}") from None
        passages = PassageStore(parts, [s["first"] for s in shards])
        bm25 = BM25.load(os.path.join(directory, "bm25"), meta["passages"]) if meta.get("bm25") else None
        built_by = {k: meta[k] for k in ("model", "passage_encoder", "settings", "precision")}
        index = cls(vectors, passages, bm25, built_by, distributed=share is not None and share[1] > 1)
        if retriever is not None:
            index.use(retriever, directory)
        return index

    # --- FAISS (utils.search.faiss_index) ---

    def to_faiss(self, kind: str = "flat", **options):
        from utils.search.faiss_index import build_faiss

        return build_faiss(self, kind, **options)

    def search_faiss(self, faiss_index, questions, k: int = 10, **options):
        from utils.search.faiss_index import search_faiss

        return search_faiss(self, faiss_index, questions, k, **options)


def manifest(built_by: dict, dtype: str, dimension: int, passages: int, shards: list[dict], bm25: bool,
             complete: bool, corpus: dict | None = None) -> dict:
    return {"format": FORMAT, **built_by, "dtype": dtype, "dimension": int(dimension), "passages": int(passages),
            "vectors": int(sum(s["vectors"] for s in shards)), "shards": shards, "bm25": bm25, "complete": complete,
            **({"corpus": corpus} if corpus else {})}


def check_index_target(directory: str, overwrite: bool, flag: str = "overwrite=True") -> None:
    """Where an index may be written: a new or empty directory, or with `overwrite` (`flag`: how the caller's user
    asks for it) one this project wrote and marked: an index (its manifest, utils.search.index_format) or a run's
    outputs (the marker of utils.loop.output_dir). Anything else, a file or a directory that merely holds a file
    named index.json, is refused even with `overwrite`: replacing it would delete a user's data (one-line errors)."""
    if os.path.lexists(directory) and not os.path.isdir(directory):
        raise UserError(f"{directory}: is a file, not a directory: save the index to a new or empty directory")
    if not os.path.isdir(directory) or not os.listdir(directory):
        return
    if holds_index_manifest(directory):
        if not overwrite:
            raise UserError(f"{directory}: holds an index already: pass {flag} to replace it")
        return
    marker = read_marker(directory)
    if isinstance(marker, dict) and "state" in marker:  # written by a run of ours (output_dir's rule)
        if not overwrite:
            raise UserError(f"{directory}: holds the outputs of a run of this project (by {marker.get('script')}): "
                            f"pass {flag} to replace them with the index")
        return
    raise UserError(f"{directory}: not empty and not an index of this project: save the index to a new or empty "
                    f"directory (a directory this project did not write is never replaced, even with {flag})")


def check_k(k) -> None:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise UserError(f"k must be a whole number of at least 1 (got {k!r})")


def passage_hit(passages, j: int, score) -> dict:
    """Passage j of the corpus as a search result: {"passage_id", "title", "text", "score"}."""
    p = passages[j]
    return {"passage_id": p["passage_id"], "title": p["title"], "text": p["text"], "score": float(score)}


def ranked_passages(passages, scores, ids) -> list[list[dict]]:
    """Per query, its ranked passage ids (-1: none) and scores as search results, best first."""
    return [[passage_hit(passages, int(j), s) for s, j in zip(row_s, row_i) if j >= 0]
            for row_s, row_i in zip(scores, ids)]

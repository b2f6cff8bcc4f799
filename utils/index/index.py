"""An index of a corpus: its vectors (in shards), its passages, optionally BM25 over them, and what made the vectors.

It takes query vectors, never a model: a retriever (utils.retriever.retriever) encodes the questions, checks that
the index holds its own passage encoder's vectors (`check_encoder`) and asks the index. `Retriever.index(passages)`
builds one in memory; `index_corpus.py` builds one on disk from every process, shard by shard, resumable; both save
the same directory layout (utils.index.format), which `Index.load` maps where it lies. The search is exact
(utils.search.exact: blockwise, never the questions x corpus matrix), each passage ranked by its best sentence
window for a sentence-trained retriever; `hybrid_search` fuses it with BM25 at a given dense weight
(utils.search.fusion). FAISS indexes for approximate search are built from the shards (utils.index.faiss_index).

    from utils.retriever import Index, Retriever
    retriever = Retriever("outputs/dpr-squad")
    index = retriever.index("corpus.jsonl")                    # or Index.load("outputs/corpus-index")
    index.save("outputs/corpus-index")
    for hits in retriever.search(index, ["Who designed the Corran lighthouse?"], k=5, hybrid=True):
        print([(h["passage_id"], round(h["score"], 3)) for h in hits])

Several processes may each load only their share of the shards (`Index.load(dir, share=(rank, world))`): a search
is then a collective that every process calls with the same queries, each searching its shards, the results
merged (utils.search.shards): the same as one process searching them all.
"""

import os
from dataclasses import asdict

import numpy as np
import torch

from utils.errors import UserError
from utils.files.jsonfiles import write_json_file
from utils.index.format import (DOCUMENTS_CORPUS, FORMAT, INDEX_FILE, PassageStore, ShardWriter, bm25_dir, content_hash,
                                holds_index_manifest, map_shard, own_entries, read_manifest, shard_name, version_of)
from utils.runtime.output_dir import holds_trained_model, read_marker, staged_directory
from utils.search.bm25 import BM25
from utils.search.exact import score_shards, search_shards
from utils.search.fusion import gather_candidates, hybrid_ranking
from utils.search.hits import ranked_passages
from utils.search.shards import shard as share_of
from utils.search.vectors import Vectors

# What an index's vectors depend on beside the passage encoder's weights: compared with the retriever searching it.
VECTOR_SETTINGS = ("pooling", "similarity", "embed_title", "window_sentences", "max_passage_length")


class Index:
    """Vectors of a corpus in shards (rows: passages, or their sentence windows), its passages (a list, or a
    PassageStore reading them from disk), optional BM25, and `built_by` ({"model", "passage_encoder" (its
    fingerprint), "settings", "precision"}), checked against every retriever that searches it (`check_encoder`)."""

    def __init__(self, shards: list[Vectors], passages, bm25: BM25 | None, built_by: dict, distributed: bool = False):
        """`shards`: Vectors with their global passage offsets; `distributed`: they are this process's share of
        the index, and a search is a collective over every process."""
        self.shards, self.passages, self.bm25, self.built_by = shards, passages, bm25, built_by
        self.model_dir, self.distributed = built_by["model"], distributed
        self.version = 1
        self.documents = None  # the folders and files its corpus was read from (index_corpus.py --documents)

    @property
    def count(self) -> int:
        return len(self.passages)

    @property
    def dimension(self) -> int | None:
        return next((np.asarray(v.embeddings).shape[1] for v in self.shards if len(v.embeddings)), None)

    @property
    def bm25_only(self) -> bool:
        """An index of the passages and BM25 alone, without vectors (index_corpus.py --retriever bm25)."""
        return self.built_by["passage_encoder"] == "bm25"

    def check_encoder(self, model_dir: str, settings, fingerprint: str, dimension: int, where: str) -> None:
        """Refuse (one line, starting with `where`) an encoder whose passage vectors are not this index's: another
        encoder (or the same directory retrained: its `fingerprint`), other `settings` (a dataclass; those of
        VECTOR_SETTINGS are compared) or another dimension. `model_dir` names it in the message."""
        if self.bm25_only:
            raise UserError(f"{where}: an index of BM25 alone, without vectors: search it with --retriever bm25")
        if self.dimension is not None and self.dimension != dimension:
            raise UserError(f"{where}: {self.dimension}-dimensional vectors, but {model_dir} embeds in {dimension}")
        ours, theirs = asdict(settings), self.built_by["settings"]
        differ = [k for k in VECTOR_SETTINGS if theirs.get(k) != ours[k]]
        if differ:
            raise UserError(f"{where}: built with other settings than {model_dir} ranks with ("
                            + ", ".join(f"{k}: {theirs.get(k)} vs {ours[k]}" for k in differ) + ")")
        if self.built_by["passage_encoder"] != fingerprint:
            raise UserError(f"{where}: its vectors were made by another passage encoder than {model_dir}'s "
                            f"(built by {self.model_dir}, encoder fingerprint {self.built_by['passage_encoder'][:12]} "
                            f"vs {fingerprint[:12]}; a retriever retrained since?): index the corpus again")

    # --- search: query vectors in, (scores, passage ids) out, best first ---

    def search(self, queries, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(scores, ids): each query vector's k best passages (global ids; fewer columns when the corpus has fewer),
        by the exact search over every shard (with `distributed`, every process's: a collective)."""
        return search_shards(torch.as_tensor(queries), self.shards, min(k, self.count), self.distributed)

    def hybrid_search(self, queries, questions: list[str], k: int, dense_weight: float,
                      candidates: int) -> tuple[np.ndarray, np.ndarray]:
        """(scores, ids, -1: none) of each question's first k hits of the dense ranking of its vector fused with
        BM25's of its text at `dense_weight`, over each ranking's first `candidates` whatever k (utils.search.fusion:
        so the first hits do not depend on k; past the candidates the dense ranking follows)."""
        if self.bm25 is None:
            raise UserError("this index has no BM25 (built with bm25=False): search with hybrid=False")
        q = torch.as_tensor(queries)
        scores, ids = self.search(q, max(k, candidates))
        head_s, head_i = scores[:, :candidates], ids[:, :candidates]
        lex_s, lex_i, _, lex_of_dense = self.bm25.search(questions, candidates, score_ids=head_i)
        dense_of_lex = score_shards(q, self.shards, lex_i, self.distributed)
        c = gather_candidates(head_s, head_i, lex_s, lex_i, lex_of_dense, dense_of_lex)
        return hybrid_ranking(c, dense_weight, scores[:, candidates:], ids[:, candidates:], k)

    def hits(self, scores, ids) -> list[list[dict]]:
        """Per query, its ranked passages (`search`'s scores and ids) as {"passage_id", "title", "text", "score"}."""
        return ranked_passages(self.passages, scores, ids)

    # --- on disk ---

    def save(self, directory: str, overwrite: bool = False) -> None:
        """The index as index_corpus.py writes one (utils.index.format), one shard per shard held. A
        directory that holds anything but an index is refused, an index only replaced with `overwrite` (what the
        old index did not write stays: `own_entries`); the new index is written beside it and swapped in as a
        whole (utils.runtime.output_dir.staged_directory), so that a crash leaves the old index or the new one,
        never none or a mix."""
        if self.distributed:
            raise UserError("this index holds one process's share of the shards: save the whole index instead")
        check_index_target(directory, overwrite)
        dimension = self.dimension or 0
        dtype = str(np.asarray(self.shards[0].embeddings).dtype) if self.shards else "float32"
        # what is not the old index's own (a user's notes put inside it) moves into the new one
        keep = set(os.listdir(directory)) - set(own_entries(directory)) if os.path.isdir(directory) else set()
        try:
            with staged_directory(directory, keep=keep, loadable=INDEX_FILE) as tmp:
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
    def load(cls, directory: str, share: tuple[int, int] | None = None) -> "Index":
        """An index saved by `save` or index_corpus.py, its shards memory-mapped, its passages read from disk as
        results need them. `share` = (process index, processes): map only this process's share of the shards (a
        search is then a collective). The version is checked whole before it is returned, reading no passage but
        each shard's last (utils.index.format.map_shard, BM25.load): every file missing, of the wrong size or
        cut short is a one-line UserError naming the directory and the file, so that a damaged version is refused
        here (serve.py then serves on the one it has), never found out by a search. Whoever searches it
        checks that the index holds its own encoder's vectors (`check_encoder`)."""
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
            if i in mine and meta["dimension"]:  # an index of BM25 alone has no vectors to search
                try:
                    vectors.append(Vectors(emb, owner, s["last"] - s["first"], s["first"]))
                except ValueError as err:
                    raise UserError(f"{directory}: {s['dir']}: {err}") from None
        passages = PassageStore(parts, [s["first"] for s in shards])
        bm25 = BM25.load(os.path.join(directory, bm25_dir(meta)), meta["passages"]) if meta.get("bm25") else None
        built_by = {k: meta[k] for k in ("model", "passage_encoder", "settings", "precision")}
        index = cls(vectors, passages, bm25, built_by, distributed=share is not None and share[1] > 1)
        index.version = version_of(meta)  # an update's number (utils.index.update)
        index.documents = meta.get("documents")
        return index


def manifest(built_by: dict, dtype: str, dimension: int, passages: int, shards: list[dict], bm25: bool,
             complete: bool, corpus: dict | None = None) -> dict:
    return {"format": FORMAT, **built_by, "dtype": dtype, "dimension": int(dimension), "passages": int(passages),
            "vectors": int(sum(s["vectors"] for s in shards)), "shards": shards, "bm25": bm25, "complete": complete,
            **({"corpus": corpus} if corpus else {})}


def check_index_target(directory: str, overwrite: bool, flag: str = "overwrite=True", own_corpus: bool = False) -> None:
    """Where an index may be written: a new or empty directory, or with `overwrite` (`flag`: how the caller's user
    asks for it) one that holds an index of this project (its manifest, utils.index.format), of which only
    what the index wrote is replaced (`own_entries`). Anything else is refused even with `overwrite`, one line each:
    a file; a directory that holds a trained model (a reader's, a retriever's: an index never replaces one) or the
    outputs of another run; one that merely holds a file named index.json. `own_corpus`: the index's corpus of
    documents (DOCUMENTS_CORPUS) is there already, written for it."""
    if os.path.lexists(directory) and not os.path.isdir(directory):
        raise UserError(f"{directory}: is a file, not a directory: save the index to a new or empty directory")
    if not os.path.isdir(directory) or set(os.listdir(directory)) <= ({DOCUMENTS_CORPUS} if own_corpus else set()):
        return
    if holds_trained_model(directory):
        raise UserError(f"{directory}: holds a trained model, which an index never replaces (even with {flag}): "
                        "give the index a directory of its own")
    if holds_index_manifest(directory):
        if not overwrite:
            raise UserError(f"{directory}: holds an index already: pass {flag} to replace it")
        return
    marker = read_marker(directory)
    if isinstance(marker, dict) and "state" in marker:  # written by a run of ours (output_dir's rule)
        raise UserError(f"{directory}: holds the outputs of a run of this project (by {marker.get('script')}), "
                        f"not an index (an index replaces only an index, even with {flag}): give another directory")
    raise UserError(f"{directory}: not empty and not an index of this project: save the index to a new or empty "
                    f"directory (a directory this project did not write is never replaced, even with {flag})")

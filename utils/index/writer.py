"""A corpus indexed on disk from every process (index_corpus.py, and qa_system.py when given passages), what
`Retriever.index` does in memory: each process checks and embeds one contiguous shard of the corpus file (its byte
range, cut at line starts), chunk by chunk, into its own shard files (utils.index.format); a killed build resumes
after each shard's last complete chunk. The corpus is streamed, never loaded whole: a process holds one chunk's
tokens and vectors. The index it writes is utils.index.index's, which `Index.load` reads.

It takes any passage encoder (`PassageEncoder`: a trained retriever is one): what makes the vectors and what
identifies them, never the model's own code."""

import contextlib
import logging
import os
import time
from typing import Protocol

import numpy as np
import torch
from accelerate.utils import broadcast_object_list, gather_object

from utils.errors import UserError
from utils.files.corpus import stream_passages
from utils.files.jsonfiles import write_json_file
from utils.index.corpus_check import CHUNK_PASSAGES, check_corpus, corpus_identity, same_corpus
from utils.index.format import (DOCUMENTS_CORPUS, INDEX_FILE, PassageStore, ShardWriter, content_hash, content_keys,
                                holds_index_manifest, map_shard, own_entries, read_manifest, shard_name, version_path)
from utils.index.index import Index, check_index_target, manifest
from utils.index.update import PreviousVectors, discard_update, finish_update, recover, remove_entries, start_update
from utils.runtime.lock import directory_lock
from utils.search.bm25 import BM25

logger = logging.getLogger("qa-amp")


class PassageEncoder(Protocol):
    """What an index is built with (utils.retriever.retriever.Retriever is one)."""
    model_dir: str  # where the model lies (an index is never written inside it)
    dimension: int
    mixed_precision: str  # the autocast it embeds under
    hybrid_by_default: bool  # whether it ranks fused with BM25 unless told: a new index then has BM25

    def built_by(self) -> dict:
        """What the index records of it, and a search checks: {"model", "passage_encoder" (a fingerprint of its
        weights), "settings" (with "window_sentences": vectors per sentence window, else per passage), "precision"}."""

    def encode_passages(self, passages: list[dict]) -> tuple[np.ndarray, np.ndarray | None]:
        """(vectors, owner): float32 rows, and with sentence windows the passage each row belongs to (else None)."""


class BM25Only:
    """The encoder of an index of the passages and BM25 alone (index_corpus.py --retriever bm25): no vectors, so a
    user without a trained retriever gets an index that is built, updated, resumed, served and reloaded as a dense
    one is, and BM25 that is built once, not at every start of a server."""
    model_dir, dimension, mixed_precision, hybrid_by_default = None, 0, "no", True

    def built_by(self) -> dict:
        return {"model": "bm25", "passage_encoder": "bm25", "settings": {}, "precision": "no"}

    def encode_passages(self, passages: list[dict]) -> tuple[np.ndarray, None]:
        return np.zeros((len(passages), 0), np.float32), None


def windows(encoder: PassageEncoder) -> bool:
    """Whether its vectors are of sentence windows (several a passage, each row's passage in the shard's owner)."""
    return bool(encoder.built_by()["settings"].get("window_sentences"))
def _resumable(out: str, existing: dict, built_by: dict, dtype: str, corpus: dict) -> tuple[str | None, dict | None]:
    """(why the index in `out` cannot be continued, or None; its manifest if it can: an unfinished one to resume, a
    complete one by this retriever, settings, precision and dtype to take as it is or to update)."""
    differ = [k for k in ("passage_encoder", "settings", "precision") if existing[k] != built_by[k]]
    differ += ["dtype"] if existing["dtype"] != dtype else []
    if differ:
        return (f"{out}: {'an' if existing['complete'] else 'an unfinished'} index built with another retriever or "
                f"settings ({', '.join(differ)} differ): give another --output_dir, or --overwrite_output_dir to start "
                "over"), None
    if existing["complete"]:
        return None, existing
    if existing["corpus"]["processes"] != corpus["processes"]:
        return (f"{out}: an unfinished index started with {existing['corpus']['processes']} processes: resume it "
                f"with as many (this run has {corpus['processes']})"), None
    same = ("bytes", "passages", "chunk_passages", "hashes")
    if any(existing["corpus"][k] != corpus[k] for k in same):
        return (f"{out}: an unfinished index of another corpus (the file changed since it was started): give "
                "another --output_dir, or --overwrite_output_dir to start over"), None
    return None, existing


def prepare_index_dir(accelerator, out: str, dtype: str, overwrite: bool, encoder: PassageEncoder, corpus: dict,
                      own_corpus: bool = False) -> tuple[dict, dict | None]:
    """(the manifest to build under, the update to make or None): a new manifest; or the unfinished one found
    (resumed: it must have been started with this retriever, its settings and precision, this dtype, this corpus
    and as many processes); or the complete one found by the same (`_resumable`), with the update that brings it
    to this corpus where it holds another (utils.index.update). `own_corpus`: the corpus is the index's own file
    (DOCUMENTS_CORPUS), written into the directory before it. One-line errors."""
    built_by = encoder.built_by()
    failure, meta, update = None, None, None
    if accelerator.is_main_process:
        try:
            if not overwrite and holds_index_manifest(out):
                recover(out)  # an update killed after its manifest was written: its old files deleted now
            # someone else's index.json is not read as a manifest: check_index_target refuses the directory below
            existing = read_manifest(out, complete=False) if holds_index_manifest(out) else None
        except UserError as err:  # an index of another format, say: with overwrite check_index_target decides
            existing, failure = None, None if overwrite else str(err)
        if existing and not overwrite:
            failure, meta = _resumable(out, existing, built_by, dtype, corpus)
            if meta and meta["complete"] and not same_corpus(meta, corpus):
                update = start_update(out, meta, corpus)
            elif meta and meta["complete"] and (abandoned := discard_update(out)) is not None:
                # an update killed, then the corpus put back as the index holds it: its files go
                accelerator.print(f"{out}: an unfinished update to version {abandoned} of a corpus changed since "
                                  "was discarded")
        if failure is None and meta is None:
            try:
                check_index_target(out, overwrite, "--overwrite_output_dir", own_corpus)
                if os.path.isdir(out) and overwrite:  # what the index there wrote, and only that (its corpus of
                    # documents, just read again for this build, kept)
                    remove_entries(out, [e for e in own_entries(out) if not (own_corpus and e == DOCUMENTS_CORPUS)])
                os.makedirs(out, exist_ok=True)
                meta = manifest(built_by, dtype, encoder.dimension, corpus["passages"], [], bm25=False,
                                complete=False, corpus=corpus)
                write_json_file(os.path.join(out, INDEX_FILE), meta)
            except UserError as err:
                failure = str(err)
            except OSError as err:
                failure = f"{out}: cannot create the index directory ({err.strerror or err})"
    if accelerator.num_processes > 1:
        failure, meta, update = broadcast_object_list([failure, meta, update])
    if failure:
        raise UserError(failure)
    return meta, update


def chunk_vectors(passages: list[dict], encoder: PassageEncoder, previous: PreviousVectors | None):
    """(vectors, owner or None, embedded): a chunk's vectors, those of the passages `previous` holds copied from it
    (as float32: exact for either dtype stored), the others embedded in one call."""
    if previous is None:
        vectors, owner = encoder.encode_passages(passages)
        return vectors, owner, len(passages)
    found = previous.find(content_keys(passages))
    new = np.flatnonzero(found < 0)
    fresh, fresh_owner = encoder.encode_passages([passages[i] for i in new]) if len(new) else (None, None)
    if fresh_owner is None and fresh is not None:
        fresh_owner = np.arange(len(new))
    fresh_starts = np.searchsorted(fresh_owner, np.arange(len(new) + 1)) if fresh is not None else None
    place = {int(i): k for k, i in enumerate(new)}
    pieces, owner = [], []
    for i in range(len(passages)):
        if found[i] >= 0:
            rows = previous.rows(int(found[i])).astype(np.float32)
        else:
            k = place[i]
            rows = fresh[fresh_starts[k]:fresh_starts[k + 1]]
        pieces.append(rows)
        owner.append(np.full(len(rows), i, np.int64))
    vectors = np.concatenate(pieces) if pieces else np.zeros((0, encoder.dimension), np.float32)
    return vectors, (np.concatenate(owner) if windows(encoder) else None), len(new)


def embed_shard(path: str, chunks: list[tuple[int, int, int]], dtype: str, encoder: PassageEncoder, directory: str,
                main: bool, previous: PreviousVectors | None = None) -> dict:
    """This process's shard: its chunks (first passage, start byte, end byte), each embedded (with `previous`, an
    update's: only the passages it does not hold) and appended after the last one recorded. Returns {"vectors",
    "passages", "embedded", "seconds"} of the shard."""
    writer = ShardWriter(directory, encoder.dimension, dtype, windows(encoder))
    done = len(writer.progress["chunks"])
    if done:
        logger.info("%s: resuming after %d chunks (%d passages, %d vectors)", directory, done,
                    writer.progress["passages"], writer.progress["vectors"])
    t0, before = time.perf_counter(), writer.progress["passages"]
    for i, (_, start, stop) in enumerate(chunks[done:], done):
        rows = list(stream_passages(path, start, stop))
        vectors, owner, embedded = chunk_vectors([p for p, _, _ in rows], encoder, previous)
        writer.append(content_hash([raw for _, raw, _ in rows]), [p for p, _, _ in rows], vectors, owner, embedded)
        if main:
            rate = (writer.progress["passages"] - before) / max(time.perf_counter() - t0, 1e-9)
            logger.info("chunk %d of %d of this shard: %d passages (%.0f passages/s)", i + 1, len(chunks),
                        writer.progress["passages"], rate)
    return {"vectors": writer.progress["vectors"], "passages": writer.progress["passages"],
            "embedded": writer.progress.get("embedded", writer.progress["passages"]),
            "seconds": time.perf_counter() - t0}


def build_index(accelerator, encoder: PassageEncoder, passages: str, output_dir: str, dtype: str = "float32",
                chunk_passages: int | None = CHUNK_PASSAGES, bm25: bool | None = None, overwrite: bool = False,
                reuse: bool = False, documents: list[str] | None = None) -> dict:
    """Index the JSON-lines corpus `passages` into `output_dir` with `encoder`, every process a contiguous run of
    the corpus's chunks (a collective: every process calls it); resumes an unfinished build of the same corpus,
    retriever and layout; updates a complete one by the same retriever whose corpus changed since
    (utils.index.update: only new and changed passages embedded). Returns the complete manifest, with
    "seconds" None where nothing was built. `bm25`: also build BM25 (default: what the index being updated has,
    else when the encoder ranks fused with it). A complete index there of the same corpus and retriever is
    returned as it is: with `reuse` silently (with BM25 where asked), else as up to date. `documents`: the folders
    and files the corpus was read from (index_corpus.py --documents), recorded in the manifest; the corpus is then
    the index's own, DOCUMENTS_CORPUS in `output_dir`. The directory is locked for the run (utils.runtime.lock): a
    second run on it meanwhile is refused."""
    corpus_path, out = os.path.realpath(passages), os.path.realpath(output_dir)
    own_corpus = documents is not None and corpus_path == os.path.join(out, DOCUMENTS_CORPUS)
    # the same answers on every process: no collective needed
    if os.path.commonpath([corpus_path, out]) == out and not own_corpus:
        raise UserError(f"{output_dir}: holds the corpus being indexed ({passages}): give another --output_dir "
                        "(replacing the directory would delete the corpus)")
    if encoder.model_dir and os.path.commonpath([os.path.realpath(encoder.model_dir), out]) == \
            os.path.realpath(encoder.model_dir):
        raise UserError(f"{output_dir}: is the retriever's directory or inside it ({encoder.model_dir}): give the "
                        "index a directory of its own (publishing a retrained retriever there would delete it)")
    with contextlib.ExitStack() as held:
        failure = None
        if accelerator.is_main_process:  # the others write only into what the main process has checked and holds
            try:
                held.enter_context(directory_lock(output_dir, "index"))
            except UserError as err:
                failure = str(err)
        if accelerator.num_processes > 1:
            failure = broadcast_object_list([failure])[0]
        if failure:
            raise UserError(failure)
        return _build_index(accelerator, encoder, passages, output_dir, dtype, chunk_passages, bm25, overwrite,
                            reuse, documents)


def _build_index(accelerator, encoder, passages, output_dir, dtype, chunk_passages, bm25, overwrite, reuse,
                 documents):
    world, rank = accelerator.num_processes, accelerator.process_index
    plan = check_corpus(accelerator, passages, chunk_passages)
    corpus = corpus_identity(passages, plan, world)
    found, update = prepare_index_dir(accelerator, output_dir, dtype, overwrite, encoder, corpus,
                                      own_corpus=documents is not None)
    if found["complete"] and update is None:  # the index of this corpus already
        if (bm25 if bm25 is not None else encoder.hybrid_by_default) and not found.get("bm25"):
            raise UserError(f"{output_dir}: a complete index without BM25, which the hybrid needs: give another "
                            "directory")
        if not reuse:
            accelerator.print(f"{output_dir}: up to date (an index of this corpus by this retriever): nothing to do")
        return {**found, "embedded": 0, "seconds": None}
    version = update["version"] if update else 1
    if bm25 is None:  # an update keeps what the index has; a new index has BM25 where the retriever fuses with it
        bm25 = bool(found.get("bm25")) if update else encoder.hybrid_by_default
    accelerator.print(f"index{f' update to version {version}' if update else ''}: {corpus['passages']} passages, "
                      f"{len(plan['chunks'])} chunks in {world} shard(s), "
                      f"{'sentence windows' if windows(encoder) else 'whole passages'}, "
                      f"precision {encoder.mixed_precision}, {dtype} vectors, "
                      f"{bm25_said(bm25, found.get('bm25') if update else None)} -> {output_dir}")
    n = len(plan["chunks"])
    mine = plan["chunks"][rank * n // world:(rank + 1) * n // world]
    previous = PreviousVectors(output_dir, found) if update else None
    with torch.no_grad():
        result = embed_shard(passages, mine, dtype, encoder,
                             os.path.join(output_dir, version_path(version, shard_name(rank))),
                             accelerator.is_main_process, previous)
    every = gather_object([result])
    shards, first = [], 0
    for i, s in enumerate(every):
        shards.append({"dir": version_path(version, shard_name(i)), "first": first, "last": first + s["passages"],
                       "vectors": s["vectors"]})
        first += s["passages"]
    if first != corpus["passages"]:
        raise UserError(f"{output_dir}: {first} passages embedded, the corpus has {corpus['passages']}")
    meta = manifest(encoder.built_by(), dtype, encoder.dimension, corpus["passages"], shards, bm25=bm25,
                    complete=True, corpus=corpus)
    meta.update(version=version, embedded=sum(s["embedded"] for s in every), bm25_dir=version_path(version, "bm25"),
                seconds=round(max(s["seconds"] for s in every), 3),
                **({"documents": [os.path.abspath(d) for d in documents]} if documents is not None else {}))
    if accelerator.is_main_process:
        if bm25:  # by this process alone (one index over every passage: bm25s builds it in one piece), the others
            # waiting below, for as long as --process_group_timeout allows
            parts = [map_shard(output_dir, meta, s)[2] for s in shards]
            BM25(list(PassageStore(parts, [s["first"] for s in shards]))).save(
                os.path.join(output_dir, meta["bm25_dir"]))
        write_json_file(os.path.join(output_dir, INDEX_FILE), meta)  # the one rename that publishes the version
        if update:
            finish_update(output_dir, update)
    accelerator.wait_for_everyone()
    return meta


def bm25_said(bm25: bool, had: bool | None) -> str:
    """What an index build says of its BM25: `had`, what the index being updated has (None: a new index)."""
    if had is None or bool(had) == bm25:
        return ("BM25" if bm25 else "no BM25") + (" (kept as the index has it)" if had is not None else "")
    return "BM25 added (--bm25 true)" if bm25 else "BM25 dropped (--bm25 false)"


def index_for_run(accelerator, encoder: PassageEncoder, passages: str, output_dir: str, bm25: bool,
                  overwrite: bool = False) -> Index:
    """The corpus `passages` indexed for one run (qa_system.py given passages, train_reader.py --retriever) into
    `output_dir` by every process, each its shard, however small the corpus (`check_corpus`'s chunks), and loaded
    with each process's share of the shards to search (a collective). An unfinished index there is resumed; a
    complete one of the same corpus and retriever is reused unless `overwrite`."""
    build_index(accelerator, encoder, passages, output_dir, chunk_passages=None, bm25=bm25, overwrite=overwrite,
                reuse=True)
    return Index.load(output_dir, share=(accelerator.process_index, accelerator.num_processes))

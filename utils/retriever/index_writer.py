"""A trained retriever indexing a corpus on disk from every process (index_corpus.py, and qa_system.py when given
passages), what `Retriever.index` does in memory: each process checks and embeds one contiguous shard of the corpus
file (its byte range, cut at line starts), chunk by chunk, into its own shard files (utils.search.index_format); a
killed build resumes after each shard's last complete chunk. The corpus is streamed, never loaded whole: a process
holds one chunk's tokens and vectors. The index it writes is utils.search.index's, which `Index.load` reads."""

import contextlib
import hashlib
import logging
import os
import time

import numpy as np
import torch
from accelerate.utils import broadcast_object_list, gather_object

from utils.errors import UserError
from utils.files.corpus import byte_ranges, count_lines, stream_passages
from utils.files.jsonfiles import json_lines, write_json_file
from utils.retriever.index_update import (PreviousVectors, chunk_vectors, discard_update, finish_update, recover,
                                          remove_entries, start_update)
from utils.retriever.retriever import Retriever
from utils.search.bm25 import BM25
from utils.runtime.lock import directory_lock
from utils.search.index import Index, check_index_target, manifest
from utils.search.index_format import (INDEX_FILE, PassageStore, ShardWriter, content_hash, holds_index_manifest,
                                       map_shard, own_entries, read_manifest, shard_name, version_path)

logger = logging.getLogger("qa-amp")
CHUNK_HASH_PASSAGES = 1024  # passages per corpus hash recorded (and compared on resume)
CHUNK_PASSAGES = 4096  # passages embedded and written at a time, by default: the unit of resuming, and of memory


def check_corpus(accelerator, path: str, chunk_passages: int | None) -> dict:
    """The corpus, checked and cut into chunks, the same on every process: {"passages", "chunk_passages", "chunks":
    [(first passage, start byte, end byte)], "hashes"}. Each process streams one byte range of the file and checks
    every passage as the one corpus loader does; the ids' hashes are gathered, so that a duplicate anywhere in the
    corpus is found before anything is written. Chunks are every `chunk_passages` passages of the whole corpus
    (whatever the number of processes), so a chunk, and the vectors it gets, do not depend on how the work is shared;
    None: CHUNK_PASSAGES, or fewer where that leaves a process without a chunk (an index built for one run, whose
    every process should embed its share however small the corpus). A UserError
    on any process stops every process with the first message."""
    world, rank = accelerator.num_processes, accelerator.process_index
    start, stop = byte_ranges(path, world)[rank]
    failure, ids, offsets, hashes, block = None, [], [], [], []
    try:
        first_line = 1 + (count_lines(path, 0, start) if rank else 0)
        for p, raw, _ in stream_passages(path, start, stop, first_line=first_line):
            ids.append(_id_hash(p["passage_id"]))
            block.append(raw)
            if len(block) == CHUNK_HASH_PASSAGES:
                hashes.append(content_hash(block))
                block = []
        if block:
            hashes.append(content_hash(block))
        offsets = _line_offsets(path, start, stop)
    except UserError as err:
        failure = str(err)
    failures = [f for f in gather_object([failure]) if f]
    if failures:
        raise UserError(failures[0])
    counts = gather_object([len(ids)])
    all_ids = gather_object([np.asarray(ids, dtype=np.int64)])
    if accelerator.is_main_process:
        failure = _duplicate(path, np.concatenate(all_ids) if all_ids else np.zeros(0, np.int64))
        if failure is None and not sum(counts):
            failure = f"{path}: no passages"
    failure = broadcast_object_list([failure])[0] if world > 1 else failure
    if failure:
        raise UserError(failure)
    total = int(sum(counts))
    if chunk_passages is None:
        chunk_passages = max(1, min(CHUNK_PASSAGES, -(-total // world)))
    mine = int(np.sum(counts[:rank]))  # the global position of this range's first passage
    starts = [(g, int(offsets[g - mine])) for g in range(-(-mine // chunk_passages) * chunk_passages,
                                                           mine + len(ids), chunk_passages)]
    starts = sorted(x for part in gather_object([starts]) for x in part)
    ends = [b for _, b in starts[1:]] + [os.path.getsize(path)]
    return {"passages": total, "chunk_passages": chunk_passages,
            "chunks": [(g, b, e) for (g, b), e in zip(starts, ends)],
            "hashes": [h for part in gather_object([hashes]) for h in part]}


def _line_offsets(path: str, start: int, stop: int) -> np.ndarray:
    """The byte offset of every non-blank line between two offsets (where each passage of the range starts)."""
    return np.asarray([at for _, at, _ in json_lines(path, start, stop)], dtype=np.int64)


def _id_hash(ident: str) -> int:
    return int.from_bytes(hashlib.blake2b(ident.encode(), digest_size=8).digest(), "little", signed=True)


def _duplicate(path: str, hashes: np.ndarray) -> str | None:
    """The one-line error for the first duplicate passage_id of the corpus, found from the ids' hashes (the lines
    are then read to name them exactly), or None."""
    order = np.argsort(hashes, kind="stable")
    same = np.flatnonzero(hashes[order][1:] == hashes[order][:-1])
    if not len(same):
        return None
    suspects = {int(order[i]) for i in same} | {int(order[i + 1]) for i in same}
    seen, position = {}, 0
    for p, _, line in stream_passages(path, 0, os.path.getsize(path)):
        if position in suspects:
            if p["passage_id"] in seen:
                return (f"{path}: line {line}: duplicate passage_id {p['passage_id']!r} "
                        f"(first at line {seen[p['passage_id']]})")
            seen[p["passage_id"]] = line
        position += 1
    return None  # a hash collision of different ids


def corpus_identity(path: str, plan: dict, processes: int) -> dict:
    """What an unfinished index records of its corpus and layout, compared on resume."""
    return {"path": os.path.abspath(path), "bytes": os.path.getsize(path), "passages": plan["passages"],
            "processes": processes, "chunk_passages": plan["chunk_passages"], "hashes": plan["hashes"]}


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


def same_corpus(meta: dict, corpus: dict) -> bool:
    """Whether a complete index holds this corpus (the same passages, however many processes built it)."""
    return all(meta.get("corpus", {}).get(k) == corpus[k] for k in ("bytes", "passages", "hashes"))


def prepare_index_dir(accelerator, out: str, dtype: str, overwrite: bool, retriever: Retriever,
                      corpus: dict) -> tuple[dict, dict | None]:
    """(the manifest to build under, the update to make or None): a new manifest; or the unfinished one found
    (resumed: it must have been started with this retriever, its settings and precision, this dtype, this corpus
    and as many processes); or the complete one found by the same (`_resumable`), with the update that brings it
    to this corpus where it holds another (utils.retriever.index_update). One-line errors."""
    built_by = retriever.built_by()
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
                check_index_target(out, overwrite, "--overwrite_output_dir")
                if os.path.isdir(out) and overwrite:  # what the index there wrote, and only that
                    remove_entries(out, own_entries(out))
                os.makedirs(out, exist_ok=True)
                meta = manifest(built_by, dtype, retriever.dimension, corpus["passages"], [], bm25=False,
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


def embed_shard(path: str, chunks: list[tuple[int, int, int]], dtype: str, retriever: Retriever, directory: str,
                main: bool, previous: PreviousVectors | None = None) -> dict:
    """This process's shard: its chunks (first passage, start byte, end byte), each embedded (with `previous`, an
    update's: only the passages it does not hold) and appended after the last one recorded. Returns {"vectors",
    "passages", "embedded", "seconds"} of the shard."""
    writer = ShardWriter(directory, retriever.dimension, dtype, bool(retriever.settings.window_sentences))
    done = len(writer.progress["chunks"])
    if done:
        logger.info("%s: resuming after %d chunks (%d passages, %d vectors)", directory, done,
                    writer.progress["passages"], writer.progress["vectors"])
    t0, before = time.perf_counter(), writer.progress["passages"]
    for i, (_, start, stop) in enumerate(chunks[done:], done):
        rows = list(stream_passages(path, start, stop))
        vectors, owner, embedded = chunk_vectors([p for p, _, _ in rows], retriever, previous)
        writer.append(content_hash([raw for _, raw, _ in rows]), [p for p, _, _ in rows], vectors, owner, embedded)
        if main:
            rate = (writer.progress["passages"] - before) / max(time.perf_counter() - t0, 1e-9)
            logger.info("chunk %d of %d of this shard: %d passages (%.0f passages/s)", i + 1, len(chunks),
                        writer.progress["passages"], rate)
    return {"vectors": writer.progress["vectors"], "passages": writer.progress["passages"],
            "embedded": writer.progress.get("embedded", writer.progress["passages"]),
            "seconds": time.perf_counter() - t0}


def build_index(accelerator, retriever: Retriever, passages: str, output_dir: str, dtype: str = "float32",
                chunk_passages: int | None = CHUNK_PASSAGES, bm25: bool | None = None, overwrite: bool = False,
                reuse: bool = False) -> dict:
    """Index the JSON-lines corpus `passages` into `output_dir` with `retriever`, every process a contiguous run of
    the corpus's chunks (a collective: every process calls it); resumes an unfinished build of the same corpus,
    retriever and layout; updates a complete one by the same retriever whose corpus changed since
    (utils.retriever.index_update: only new and changed passages embedded). Returns the complete manifest, with
    "seconds" None where nothing was built. `bm25`: also build BM25 (default: what the index being updated has,
    else when the retriever has a hybrid weight). A complete index there of the same corpus and retriever is
    returned as it is: with `reuse` silently (with BM25 where asked), else as up to date. The directory is locked
    for the run (utils.runtime.lock): a second run on it meanwhile is refused."""
    corpus_path, out = os.path.realpath(passages), os.path.realpath(output_dir)
    # the same answers on every process: no collective needed
    if os.path.commonpath([corpus_path, out]) == out:
        raise UserError(f"{output_dir}: holds the corpus being indexed ({passages}): give another --output_dir "
                        "(replacing the directory would delete the corpus)")
    if os.path.commonpath([os.path.realpath(retriever.model_dir), out]) == os.path.realpath(retriever.model_dir):
        raise UserError(f"{output_dir}: is the retriever's directory or inside it ({retriever.model_dir}): give the "
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
        return _build_index(accelerator, retriever, passages, output_dir, dtype, chunk_passages, bm25, overwrite,
                            reuse)


def _build_index(accelerator, retriever, passages, output_dir, dtype, chunk_passages, bm25, overwrite, reuse):
    world, rank = accelerator.num_processes, accelerator.process_index
    plan = check_corpus(accelerator, passages, chunk_passages)
    corpus = corpus_identity(passages, plan, world)
    found, update = prepare_index_dir(accelerator, output_dir, dtype, overwrite, retriever, corpus)
    if found["complete"] and update is None:  # the index of this corpus already
        if (bm25 if bm25 is not None else retriever.settings.hybrid_by_default) and not found.get("bm25"):
            raise UserError(f"{output_dir}: a complete index without BM25, which the hybrid needs: give another "
                            "directory")
        if not reuse:
            accelerator.print(f"{output_dir}: up to date (an index of this corpus by this retriever): nothing to do")
        return {**found, "embedded": 0, "seconds": None}
    version = update["version"] if update else 1
    if bm25 is None:  # an update keeps what the index has; a new index has BM25 where the retriever fuses with it
        bm25 = bool(found.get("bm25")) if update else retriever.settings.hybrid_by_default
    accelerator.print(f"index{f' update to version {version}' if update else ''}: {corpus['passages']} passages, "
                      f"{len(plan['chunks'])} chunks in {world} shard(s), "
                      f"{'sentence windows' if retriever.settings.window_sentences else 'whole passages'}, "
                      f"precision {retriever.precision}, {dtype} vectors, "
                      f"{bm25_said(bm25, found.get('bm25') if update else None)} -> {output_dir}")
    n = len(plan["chunks"])
    mine = plan["chunks"][rank * n // world:(rank + 1) * n // world]
    previous = PreviousVectors(output_dir, found) if update else None
    with torch.no_grad():
        result = embed_shard(passages, mine, dtype, retriever,
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
    meta = manifest(retriever.built_by(), dtype, retriever.dimension, corpus["passages"], shards, bm25=bm25,
                    complete=True, corpus=corpus)
    meta.update(version=version, embedded=sum(s["embedded"] for s in every), bm25_dir=version_path(version, "bm25"),
                seconds=round(max(s["seconds"] for s in every), 3))
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


def index_for_run(accelerator, retriever: Retriever, passages: str, output_dir: str, bm25: bool,
                  overwrite: bool = False) -> Index:
    """The corpus `passages` indexed for one run (qa_system.py given passages, train_reader.py --retriever) into
    `output_dir` by every process, each its shard, however small the corpus (`check_corpus`'s chunks), and loaded
    with each process's share of the shards to search (a collective). An unfinished index there is resumed; a
    complete one of the same corpus and retriever is reused unless `overwrite`."""
    build_index(accelerator, retriever, passages, output_dir, chunk_passages=None, bm25=bm25, overwrite=overwrite,
                reuse=True)
    return Index.load(output_dir, share=(accelerator.process_index, accelerator.num_processes))


def ranking_for_run(accelerator, retriever_dir: str, passages: str | None, index_dir: str | None, into: str,
                    overwrite: bool = False):
    """A trained retriever's ranking of a corpus for one training run (train_reader.py --retriever), as the QA
    system ranks with it (hybrid where it recorded a dense weight): (the corpus as its index holds it,
    `rank(questions, depth)` -> (scores, ids)). The index is `index_dir`, or `passages` indexed by every process,
    each its shard, into `into` (index_for_run: a killed run's is resumed; with `overwrite` an earlier run's is
    built anew); every process searches its share of the shards for every question (a collective): no process
    embeds or searches the whole corpus alone."""
    retriever = Retriever(retriever_dir, device=str(accelerator.device))
    hybrid = retriever.settings.hybrid_by_default
    if index_dir is None:
        index = index_for_run(accelerator, retriever, passages, into, hybrid, overwrite)
    else:
        index = Index.load(index_dir, share=(accelerator.process_index, accelerator.num_processes))
        retriever.check_index(index, f"--index {index_dir}")
    return index.passages, lambda questions, depth: retriever.rank(index, questions, depth, hybrid)

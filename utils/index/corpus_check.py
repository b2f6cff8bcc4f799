"""The corpus an index is built from, checked and cut into chunks the same way on every process, before anything is
written: each process streams one byte range of the JSON-lines file (cut at line starts) and checks every passage
as the one corpus loader does; the ids' hashes are gathered, so that a duplicate anywhere is found at once; chunks
are every N passages of the whole corpus, whatever the number of processes, so that a chunk and its vectors do not
depend on how the work is shared. What an index records of its corpus (`corpus_identity`) is what a resume and an
update compare."""

import hashlib
import os

import numpy as np
from accelerate.utils import broadcast_object_list, gather_object

from utils.errors import UserError
from utils.files.corpus import byte_ranges, count_lines, stream_passages
from utils.files.jsonfiles import json_lines
from utils.index.format import content_hash

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


def same_corpus(meta: dict, corpus: dict) -> bool:
    """Whether a complete index holds this corpus (the same passages, however many processes built it)."""
    return all(meta.get("corpus", {}).get(k) == corpus[k] for k in ("bytes", "passages", "hashes"))

"""An index brought up to date with its corpus as it is now: index_corpus.py run again on a complete index, by the
same retriever, of a corpus whose documents were added, changed or removed since.

The rule: a passage whose title and text are unchanged (its content key, utils.index.format.content_keys)
keeps its vectors, copied bit for bit from the index as it was; every other passage is embedded; a passage no longer
in the corpus is dropped; BM25 is built again over the passages as they are (its term statistics are corpus-wide:
one changed document moves every score). The update is written as the index's next version beside the current one
(IDX/v<N>/, each process its shard, chunk by chunk as a first build is, so it resumes after a kill and is the same
from any number of processes), then the manifest is replaced in one rename, and only then are the previous
version's files, named by its manifest, deleted. A reader (serve.py) has the old version or the new one, never a mix.

    IDX/update.json   the update under way: its version, its corpus and layout (a resumed update must match them, or
                      it is started again), the previous version's files to delete once the manifest names the new
"""

import os
import shutil

import numpy as np

from utils.files.jsonfiles import read_json, write_json_file
from utils.index.format import (INDEX_FILE, UPDATE_FILE, files_of, map_shard, read_manifest, shard_keys, version_dir,
                                version_of)
from utils.search.vectors import Vectors


class PreviousVectors:
    """The vectors of the index an update starts from, found by their passage's content key. Holds 32 bytes a
    passage (its key, 16, and the keys' sorted order) and maps the shards where they lie: no vector is read that is
    not copied."""

    def __init__(self, directory: str, meta: dict):
        self.shards, keys = [], []
        for s in meta["shards"]:
            vectors, owner, lines = map_shard(directory, meta, s)
            self.shards.append(Vectors(vectors, owner, s["last"] - s["first"], s["first"]))
            keys.append(shard_keys(directory, s, lines))
        self.keys = np.concatenate(keys) if keys else np.zeros((0, 2), np.int64)
        self.order = np.argsort(self.keys[:, 0], kind="stable")
        self.sorted = self.keys[self.order, 0]
        self.firsts = np.asarray([v.offset for v in self.shards], dtype=np.int64)

    def find(self, keys: np.ndarray) -> np.ndarray:
        """The previous index's position of each key's passage, -1 where it has none (a new or changed passage)."""
        if not len(self.sorted):
            return np.full(len(keys), -1, np.int64)
        at = np.minimum(np.searchsorted(self.sorted, keys[:, 0]), len(self.sorted) - 1)
        j = self.order[at]
        return np.where((self.keys[j, 0] == keys[:, 0]) & (self.keys[j, 1] == keys[:, 1]), j, -1)

    def rows(self, j: int) -> np.ndarray:
        """The vectors of the previous index's passage j (its sentence windows' rows, or its one row), as stored."""
        v = self.shards[int(np.searchsorted(self.firsts, j, side="right")) - 1]
        local = j - v.offset
        return np.asarray(v.embeddings[v.starts[local]:v.starts[local + 1]])


def start_update(out: str, current: dict, corpus: dict) -> dict:
    """The update to build (by the main process): the one under way in `out` if it was started for this corpus and
    layout from the current version (resumed), else a new one (what an unfinished one of another corpus wrote,
    which update.json names, is deleted first). Returns update.json's record."""
    version = version_of(current) + 1
    path = os.path.join(out, UPDATE_FILE)
    record = _read(path)
    if record and record.get("version") == version and record.get("corpus") == corpus:
        return record
    discard_update(out)
    record = {"version": version, "corpus": corpus, "previous": files_of(current)}
    write_json_file(path, record)
    return record


def finish_update(out: str, record: dict) -> None:
    """After the manifest names the new version: delete the previous version's files and the update's record."""
    remove_entries(out, record["previous"])
    version_dirs = {os.path.dirname(name) for name in record["previous"]} - {""}
    for d in version_dirs:  # a version's own directory, once empty
        if os.path.isdir(os.path.join(out, d)) and not os.listdir(os.path.join(out, d)):
            os.rmdir(os.path.join(out, d))
    os.remove(os.path.join(out, UPDATE_FILE))


def discard_update(out: str) -> int | None:
    """An update under way that will not be published (the corpus changed again, or back to what the index holds):
    the version it was writing and its record deleted. Returns that version, None where there was none."""
    record = _read(os.path.join(out, UPDATE_FILE))
    if record is None:
        return None
    version = record.get("version")
    remove_entries(out, ([version_dir(version)] if version_dir(version) else []) + [UPDATE_FILE])
    return version


def recover(out: str) -> None:
    """An update killed after its manifest was written but before the old files were deleted: finish it."""
    record = _read(os.path.join(out, UPDATE_FILE))
    if record and os.path.isfile(os.path.join(out, INDEX_FILE)):
        meta = read_manifest(out, complete=False)
        if version_of(meta) == record.get("version"):
            finish_update(out, record)


def _read(path: str) -> dict | None:
    return read_json(path) if os.path.isfile(path) else None


def remove_entries(out: str, names: list[str]) -> None:
    """Delete the named entries of the index `out` (each one this project wrote: a manifest or update.json names it)."""
    for name in names:
        path = os.path.join(out, name)
        if os.path.isdir(path):
            shutil.rmtree(path)
        elif os.path.lexists(path):
            os.remove(path)

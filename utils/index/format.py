"""An index on disk: a manifest and shards, each written as it goes and read where it lies.

    IDX/index.json              the manifest: what made the vectors (the passage encoder's fingerprint, settings,
                                precision), dtype, dimension, the corpus (its passages and fingerprint), the shards
                                (their passage ranges and vector counts), whether BM25 is there, whether complete
    IDX/shard-00000/vectors.bin the shard's vectors, rows x dimension of dtype, appended chunk by chunk
    IDX/shard-00000/owner.bin   with sentence windows: int32, row -> the shard's passage it belongs to
    IDX/shard-00000/passages.jsonl, offsets.bin   the shard's passages (one JSON line each) and where each starts
    IDX/shard-00000/keys.bin    each passage's content key (16 bytes of a hash of its title and text): what an update
                                compares to keep a passage's vectors (utils.index.update)
    IDX/shard-00000/progress.json the chunks done so far and the files' lengths after them (a killed job resumes
                                after the last; anything written past it is cut off)
    IDX/bm25/                   BM25 over every passage (for the hybrid), where built
    IDX/v2/shard-00000/, v2/bm25/  the same, of the index's second version (an update: the manifest names its files)
    IDX/.qa-amp-corpus.jsonl    the corpus of an index of documents (index_corpus.py --documents reads them into it)
    IDX/update.json             an update under way (utils.index.update): its version, the files of
                                the version before it

An index deletes only what it wrote and names (`own_entries`): a user's file put inside an index directory stays.

Every shard is one contiguous range of the corpus's passages. Readers map the files (numpy memmap): a process
searching its own shards touches only their pages, and a passage's text is read from its line when a result
needs it (`PassageStore`), so no process holds the corpus in memory.
"""

import hashlib
import json
import os

import numpy as np

from utils.errors import UserError
from utils.files.jsonfiles import json_line, read_json, write_json_file

INDEX_FILE, FORMAT, UPDATE_FILE = "index.json", 3, "update.json"
DOCUMENTS_CORPUS = ".qa-amp-corpus.jsonl"  # an index of a folder's documents keeps their corpus here (--documents)
MANIFEST_FIELDS = ("model", "passage_encoder", "settings", "precision", "dimension", "dtype", "passages", "shards",
                   "complete")
VECTORS, OWNER, PASSAGES, OFFSETS, PROGRESS, KEYS = ("vectors.bin", "owner.bin", "passages.jsonl", "offsets.bin",
                                                     "progress.json", "keys.bin")


def shard_name(i: int) -> str:
    return f"shard-{i:05d}"


def bm25_dir(meta: dict) -> str:
    """Where an index's BM25 is, relative to it: its version's (the first version's at the top, as before updates)."""
    return meta.get("bm25_dir", "bm25")


def version_of(meta: dict) -> int:
    return meta.get("version", 1)


def version_dir(version) -> str | None:
    """The directory of a version after the first (which keeps its files at the top, as before updates), relative to
    the index; None for the first, or for what is not a version number (a record of someone else's)."""
    return f"v{version}" if isinstance(version, int) and not isinstance(version, bool) and version > 1 else None


def version_path(version: int, name: str) -> str:
    """Where version `version` keeps a shard or BM25, relative to the index."""
    return f"{version_dir(version)}/{name}" if version_dir(version) else name


def files_of(meta: dict) -> list[str]:
    """The directories of an index version that its manifest names (its shards, its BM25)."""
    return [s["dir"] for s in meta["shards"]] + ([bm25_dir(meta)] if meta.get("bm25") else [])


def own_entries(directory: str) -> list[str]:
    """The entries of an index directory that the index wrote, manifest first (deleted in this order, a crash
    part way leaves no manifest naming what is gone): its manifest and update record, the files of the version its
    manifest names, the shards of a build not finished (one per process its manifest records, each holding the
    progress record a shard writer leaves) and the version an update under way writes (update.json names it).
    Anything else in it (a user's notes, say) is not the index's."""
    meta = _json_object(os.path.join(directory, INDEX_FILE))
    record = _json_object(os.path.join(directory, UPDATE_FILE))
    names = [INDEX_FILE, UPDATE_FILE, DOCUMENTS_CORPUS]
    if meta is not None:
        names += [path.split("/")[0] for path in files_of({"shards": [], **meta})]
        version, processes = version_of(meta), (meta.get("corpus") or {}).get("processes", 0)
        names += [version_path(version, shard_name(i)).split("/")[0] for i in range(processes)
                  if os.path.isfile(os.path.join(directory, version_path(version, shard_name(i)), PROGRESS))]
    if record is not None and version_dir(record.get("version")):
        names.append(version_dir(record["version"]))
    return [n for n in dict.fromkeys(names) if os.path.lexists(os.path.join(directory, n))]


def _json_object(path: str) -> dict | None:
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def holds_index_manifest(directory: str) -> bool:
    """Whether `directory` holds an index manifest of this project (of any format version: an index to build
    again is still ours): index.json parses to an object with "format" and every field `read_manifest` needs. A
    file that is merely named index.json (a web app's, say) is not one."""
    meta = _json_object(os.path.join(directory, INDEX_FILE))
    return meta is not None and "format" in meta and all(k in meta for k in MANIFEST_FIELDS)


def read_manifest(directory: str, complete: bool = True) -> dict:
    """index.json of an index directory; a one-line UserError when it is missing, malformed, of another format or
    (with `complete`) still being built."""
    path = os.path.join(directory, INDEX_FILE)
    if not os.path.isfile(path):
        raise UserError(f"{directory}: not an index (no {INDEX_FILE})")
    try:
        with open(path) as f:
            meta = json.load(f)
    except ValueError as err:
        raise UserError(f"{path}: malformed ({err})") from None
    if not isinstance(meta, dict) or "format" not in meta:  # someone else's index.json (a web app's, say)
        raise UserError(f"{directory}: not an index of this project ({INDEX_FILE} is not an index manifest)")
    if meta["format"] != FORMAT:
        raise UserError(f"{path}: index format {meta['format']}, this version reads {FORMAT}: index the corpus again")
    missing = [k for k in MANIFEST_FIELDS if k not in meta]
    if missing:
        raise UserError(f"{path}: malformed (missing {', '.join(missing)})")
    if complete and not meta["complete"]:
        raise UserError(f"{directory}: the index is not complete (being built, or the job was killed): run "
                        "index_corpus.py again to finish it")
    return meta


class ShardWriter:
    """One shard's files, appended chunk by chunk; `progress` says what is durably written. Re-opened on a shard
    with progress, it cuts every file back to the last recorded chunk and continues after it."""

    def __init__(self, directory: str, dimension: int, dtype: str, windows: bool):
        self.directory, self.dimension, self.dtype, self.windows = directory, dimension, np.dtype(dtype), windows
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, PROGRESS)
        # "keys": this shard has keys.bin (a shard begun by an older version has not: an update computes its keys)
        self.progress = {"chunks": [], "passages": 0, "vectors": 0, "passage_bytes": 0, "keys": True, "embedded": 0}
        if os.path.isfile(path):
            with open(path) as f:
                self.progress = json.load(f)
        p = self.progress
        self._open(VECTORS, p["vectors"] * self.dimension * self.dtype.itemsize)
        self._open(OFFSETS, p["passages"] * 8)
        self._open(PASSAGES, p["passage_bytes"])
        if windows:
            self._open(OWNER, p["vectors"] * 4)
        if p.get("keys"):
            self._open(KEYS, p["passages"] * 16)

    def _open(self, name: str, length: int) -> None:
        path = os.path.join(self.directory, name)
        with open(path, "ab") as f:  # create if missing, then cut back to what progress.json vouches for
            f.truncate(length)

    def append(self, chunk_hash: str, passages: list[dict], vectors: np.ndarray, owner: np.ndarray | None,
               embedded: int | None = None) -> None:
        """One chunk: its passages, their vectors (and, with windows, each vector's passage within the chunk), made
        durable before the progress that counts them. `embedded`: how many of the passages were embedded (the
        others' vectors kept from the index an update started from); all of them by default."""
        p = self.progress
        assert vectors.shape[1] == self.dimension
        lines = [(json_line(x) + "\n").encode("utf-8") for x in passages]
        starts = p["passage_bytes"] + np.concatenate([[0], np.cumsum([len(line) for line in lines])[:-1]])
        self._write(VECTORS, np.ascontiguousarray(vectors, dtype=self.dtype).tobytes())
        self._write(OFFSETS, starts.astype(np.int64).tobytes())
        self._write(PASSAGES, b"".join(lines))
        if self.windows:
            self._write(OWNER, (np.asarray(owner, dtype=np.int64) + p["passages"]).astype(np.int32).tobytes())
        if p.get("keys"):
            self._write(KEYS, content_keys(passages).tobytes())
        p["chunks"].append(chunk_hash)
        p["embedded"] = p.get("embedded", 0) + (len(passages) if embedded is None else embedded)
        p["passages"] += len(passages)
        p["vectors"] += len(vectors)
        p["passage_bytes"] += sum(len(line) for line in lines)
        write_json_file(os.path.join(self.directory, PROGRESS), p)

    def _write(self, name: str, data: bytes) -> None:
        with open(os.path.join(self.directory, name), "ab") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())


def map_shard(directory: str, meta: dict, shard: dict):
    """(vectors memmap, owner memmap or None, PassageLines) of one shard of a complete index, every file checked
    whole first, no passage read but the last (`PassageLines.check_whole`): one missing, of another size than the
    manifest says or cut short is a one-line UserError naming it."""
    path = os.path.join(directory, shard["dir"])
    rows, count = shard["vectors"], shard["last"] - shard["first"]
    dtype, dim = np.dtype(meta["dtype"]), meta["dimension"]

    def mapped(name, dt, shape):
        file = os.path.join(path, name)
        if not os.path.isfile(file):
            raise UserError(f"{directory}: {shard['dir']}/{name} is missing")
        want = int(np.prod(shape)) * np.dtype(dt).itemsize
        if os.path.getsize(file) != want:
            raise UserError(f"{directory}: {shard['dir']}/{name} holds {os.path.getsize(file)} bytes, the manifest "
                            f"says {want}")
        return np.memmap(file, dtype=dt, mode="r", shape=shape) if want else np.zeros(shape, dtype=dt)

    vectors = mapped(VECTORS, dtype, (rows, dim))
    owner = mapped(OWNER, np.int32, (rows,)) if meta["settings"].get("window_sentences") else None
    offsets = mapped(OFFSETS, np.int64, (count,))
    if not os.path.isfile(os.path.join(path, PASSAGES)):
        raise UserError(f"{directory}: {shard['dir']}/{PASSAGES} is missing")
    lines = PassageLines(os.path.join(path, PASSAGES), offsets)
    progress = os.path.join(path, PROGRESS)  # the passages' length as written, where the shard's record is kept
    lines.check_whole(f"{directory}: {shard['dir']}/",
                      read_json(progress).get("passage_bytes") if os.path.isfile(progress) else None)
    return vectors, owner, lines


class PassageLines:
    """A shard's passages, read from their lines on demand."""

    def __init__(self, path: str, offsets: np.ndarray):
        # opened now, not at the first read: an index replaced by an update after this one was loaded (serve.py
        # reloading) is still read whole from the files it was loaded from, never from the new ones
        self.path, self.offsets = path, offsets
        self._file = open(path, "rb")

    def check_whole(self, where: str, recorded: int | None) -> None:
        """A one-line UserError (`where`: the shard's files, as messages name them) unless the file holds these
        passages whole: their offsets rise from 0, the last passage is one whole JSON line that ends the file, and
        the file is `recorded` bytes long where that is known. Only the offsets (8 bytes a passage, compared in one
        vectorised pass) and the last passage are read: a file cut short, by a copy that ran out of space say, is
        refused when the index is loaded, not when a search reaches a passage past its end."""
        size = os.fstat(self._file.fileno()).st_size
        if recorded is not None and size != recorded:
            raise UserError(f"{where}{PASSAGES} holds {size} bytes, its {PROGRESS} says {recorded}")
        if not len(self.offsets):
            return
        if self.offsets[0] != 0 or not np.all(self.offsets[1:] > self.offsets[:-1]):
            raise UserError(f"{where}{OFFSETS}: the passages' offsets do not rise from 0")
        last = int(self.offsets[-1])
        self._file.seek(last)
        line = self._file.read(max(size - last, 0))
        try:  # one line, "\n" at the end of the file only, holding one passage
            whole = line.endswith(b"\n") and b"\n" not in line[:-1] and isinstance(json.loads(line), dict)
        except ValueError:
            whole = False
        if not whole:
            raise UserError(f"{where}{PASSAGES} is cut short or damaged: its last passage, from byte {last}, is not "
                            f"a whole JSON line ending the file ({size} bytes)")

    def __len__(self):
        return len(self.offsets)

    def __getitem__(self, j: int) -> dict:
        self._file.seek(int(self.offsets[j]))
        return json.loads(self._file.readline())

    def __iter__(self):
        for j in range(len(self)):
            yield self[j]


class PassageStore:
    """Every passage of an index, by its global position, from the shards' lines (a list-like: len, [j], iter)."""

    def __init__(self, parts: list[PassageLines], firsts: list[int]):
        self.parts, self.firsts = parts, np.asarray(firsts + [firsts[-1] + len(parts[-1])] if parts else [0])

    def __len__(self):
        return int(self.firsts[-1])

    def __getitem__(self, j: int) -> dict:
        j = int(j)
        if not 0 <= j < len(self):
            raise IndexError(j)
        s = int(np.searchsorted(self.firsts, j, side="right")) - 1
        return self.parts[s][j - int(self.firsts[s])]

    def __iter__(self):
        for part in self.parts:
            yield from part


def content_hash(lines: list[bytes]) -> str:
    """A chunk's identity: a hash of its raw corpus lines (a changed corpus is refused on resume)."""
    h = hashlib.blake2b(digest_size=12)
    for line in lines:
        h.update(line)
    return h.hexdigest()


def content_keys(passages: list[dict]) -> np.ndarray:
    """Each passage's content key, int64 (n, 2): 16 bytes of a hash of its title and text, all that its vectors
    depend on beside the encoder and its settings (its id and source fields do not enter them)."""
    keys = [hashlib.blake2b(json.dumps([p["title"], p["text"]], ensure_ascii=False).encode(), digest_size=16).digest()
            for p in passages]
    return np.frombuffer(b"".join(keys), dtype=np.int64).reshape(len(passages), 2).copy()


def shard_keys(directory: str, shard: dict, lines: "PassageLines") -> np.ndarray:
    """The content keys of a complete shard's passages: its keys.bin, or computed from its passages where an older
    version wrote the shard without one."""
    path = os.path.join(directory, shard["dir"], KEYS)
    count = shard["last"] - shard["first"]
    if os.path.isfile(path) and os.path.getsize(path) == count * 16:
        return np.fromfile(path, dtype=np.int64).reshape(count, 2)
    return content_keys(list(lines)) if count else np.zeros((0, 2), np.int64)

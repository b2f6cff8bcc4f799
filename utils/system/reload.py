"""serve.py's reload: what it serves from, the --index and the --reader, each published whole by the script that
writes it (index_corpus.py's manifest, train_reader.py's directory, utils.runtime.output_dir), checked between
passes; a new version is loaded on the watching thread while the current one answers, then swapped in whole: a
pass, and so every request, is answered by one index and one reader, those it started with (an index's files are
opened when it is loaded and stay readable after an update deletes them; a reader is in memory).

A version on disk that cannot be loaded (a file missing or cut short: `Index.load` checks an index whole first; a
reader's weights that do not load) is never swapped in: the current one serves on, `failed` says which version and
why (/health's "index_failed", "reader_failed"), the log says it once per version on disk (per publication), and
every check tries it again (its files may still be arriving) until it loads or a newer one is published; a version
that loads clears it."""

import json
import logging
import os

from utils.errors import UserError
from utils.index.format import INDEX_FILE, version_of
from utils.index.index import Index
from utils.reader.trained import Reader
from utils.runtime.output_dir import MARKER

logger = logging.getLogger("qa-amp")


def stamp(paths: list[str]):
    """What tells a publication from the one before: each file's inode, time and size (every manifest and marker is
    written to a temporary name and renamed, so a new one is a new inode); None while one is missing (between an
    overwrite's deletion and its new files: keep serving)."""
    try:
        return tuple((st.st_ino, st.st_mtime_ns, st.st_size) for st in map(os.stat, paths))
    except OSError:
        return None


class Watch:
    """A published directory, as last loaded: `check(system)` returns the system over its new version when the files
    that mark a publication (`marks`) changed since (None otherwise, or when the new version cannot be loaded: the
    current one goes on serving, `failed` says why, and the next check tries again). `swap(system)`: the system over
    the version on disk; `version(system)`: the version a system serves, as /health and the log name it; `on_disk()`:
    the version on disk (None where it cannot be told)."""

    what = "version"

    def __init__(self, directory: str, marks: list[str]):
        self.directory, self.marks = directory, marks
        self.seen = stamp(marks)  # taken before the first load: a version published during it is loaded next
        self.failed = None  # {"version": what is on disk (None: unknown), "error": the one-line reason}: the last try's
        self._reported = None  # the stamp of the publication whose failure was logged

    def check(self, system):
        now = stamp(self.marks)
        if now is None or now == self.seen:
            return None
        try:
            new = self.swap(system)
        except Exception as err:  # noqa: BLE001 - not complete yet, damaged, or replaced as it was read: serve on
            reason = str(err) if isinstance(err, UserError) else f"{type(err).__name__}: {err}"
            if now != self._reported:  # once per publication: the checks after it try again without a word
                self._reported, self.failed = now, {"version": self.on_disk(), "error": reason}
                logger.warning("the %s %s on disk cannot be loaded (%s): serving %s, trying it again at every check",
                               self.what, self.failed["version"], reason, self.version(system),
                               exc_info=not isinstance(err, (UserError, OSError)))  # a bug's traceback, once
            self.failed["error"] = reason
            return None
        self.seen, self.failed = now, None
        logger.info("reloaded the %s %s: %s", self.what, self.directory, self.version(new))
        return new


class IndexWatch(Watch):
    """The --index directory: its manifest marks a new version (index_corpus.py run again on it)."""

    what = "index"

    def __init__(self, directory: str):
        super().__init__(directory, [os.path.join(directory, INDEX_FILE)])

    def swap(self, system):
        return system.with_index(Index.load(self.directory), self.directory)

    def version(self, system) -> str:
        return f"version {system.index.version}, {len(system.passages)} passages"

    def on_disk(self):
        """The version number the manifest on disk gives, None where it cannot be read."""
        try:
            with open(os.path.join(self.directory, INDEX_FILE), encoding="utf-8") as f:
                meta = json.load(f)
        except (OSError, ValueError):
            return None
        return version_of(meta) if isinstance(meta, dict) else None


class ReaderWatch(Watch):
    """The --reader directory: its config.json and run marker mark a new reader (train_reader.py published into it
    again; the marker is written last, config.json just before it); `load_reader(directory)` loads one as the
    server's first was loaded."""

    what = "reader"

    def __init__(self, directory: str, load_reader):
        super().__init__(directory, [os.path.join(directory, name) for name in ("config.json", MARKER)
                                     if os.path.exists(os.path.join(directory, name))])
        self.load_reader = load_reader

    def swap(self, system):
        reader = self.load_reader(self.directory)
        reader.fingerprint  # noqa: B018 - computed here, on the watching thread, not in a pass
        return system.with_reader(reader)

    def version(self, system) -> str:
        return f"fingerprint {system.reader.fingerprint}"

    def on_disk(self):
        try:
            return Reader.files_fingerprint(self.directory)
        except OSError:
            return None

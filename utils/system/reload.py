"""serve.py's reload: the --index manifest checked between passes; a new version (index_corpus.py updated the index)
is loaded on the watching thread while the current one answers, then swapped in whole: a pass, and so every request,
is answered from one index, the one it started with (an index's files are opened when it is loaded and stay readable
after an update deletes them).

A version on disk that cannot be loaded (a file missing or cut short: `Index.load` checks it whole first) is never
swapped in: the current one serves on, `failed` says which version and why (/health's "index_failed"), the log says
it once per version on disk (per manifest written), and every check tries it again (its files may still be arriving)
until it loads or a newer one is published; a version that loads clears it."""

import json
import logging
import os

from utils.errors import UserError
from utils.index.format import INDEX_FILE, version_of
from utils.index.index import Index

logger = logging.getLogger("qa-amp")


class IndexWatch:
    """The index directory's manifest, as last loaded: `check(system)` returns the system over the new version when
    the manifest was replaced since (None otherwise, or when the new version cannot be loaded: the current one
    goes on serving, `failed` says why, and the next check tries again)."""

    def __init__(self, directory: str):
        self.directory = directory
        self.seen = self._stamp()  # taken before the first load: a version published during it is loaded next
        self.failed = None  # {"version": N or None (unreadable), "error": the one-line reason}: the last try's
        self._reported = None  # the stamp of the manifest whose failure was logged

    def _stamp(self):
        try:  # every manifest is written to a temporary name and renamed: a new one is a new inode
            st = os.stat(os.path.join(self.directory, INDEX_FILE))
        except OSError:
            return None  # between an overwrite's deletion and its new manifest: keep serving
        return st.st_ino, st.st_mtime_ns, st.st_size

    def _version(self):
        """The version number the manifest on disk gives, None where it cannot be read."""
        try:
            with open(os.path.join(self.directory, INDEX_FILE), encoding="utf-8") as f:
                meta = json.load(f)
        except (OSError, ValueError):
            return None
        return version_of(meta) if isinstance(meta, dict) else None

    def check(self, system):
        stamp = self._stamp()
        if stamp is None or stamp == self.seen:
            return None
        try:
            new = system.with_index(Index.load(self.directory), self.directory)
        except Exception as err:  # noqa: BLE001 - not complete yet, damaged, or replaced as it was read: serve on
            reason = str(err) if isinstance(err, UserError) else f"{type(err).__name__}: {err}"
            self.failed = {"version": self._version(), "error": reason}
            if stamp != self._reported:  # once per manifest: the checks after it try again without a word
                self._reported = stamp
                logger.warning("the index's version %s on disk cannot be loaded (%s): serving version %d, trying "
                               "it again at every check", self.failed["version"], reason, system.index.version,
                               exc_info=not isinstance(err, (UserError, OSError)))  # a bug's traceback, once
            return None
        self.seen, self.failed = stamp, None
        logger.info("reloaded the index %s: version %d, %d passages", self.directory, new.index.version,
                    len(new.passages))
        return new

"""serve.py's reload: the --index manifest checked between passes; a new version (index_corpus.py updated the index)
is loaded on the watching thread while the current one answers, then swapped in whole: a pass, and so every request,
is answered from one index, the one it started with (an index's files are opened when it is loaded and stay readable
after an update deletes them)."""

import logging
import os

from utils.errors import UserError
from utils.search.index import Index
from utils.search.index_format import INDEX_FILE

logger = logging.getLogger("qa-amp")


class IndexWatch:
    """The index directory's manifest, as last loaded: `check(system)` returns the system over the new version when
    the manifest was replaced since (None otherwise, or when the new version cannot be loaded: the current one
    goes on serving and the next check tries again)."""

    def __init__(self, directory: str):
        self.directory = directory
        self.seen = self._stamp()  # taken before the first load: a version published during it is loaded next

    def _stamp(self):
        try:  # every manifest is written to a temporary name and renamed: a new one is a new inode
            st = os.stat(os.path.join(self.directory, INDEX_FILE))
        except OSError:
            return None  # between an overwrite's deletion and its new manifest: keep serving
        return st.st_ino, st.st_mtime_ns, st.st_size

    def check(self, system):
        stamp = self._stamp()
        if stamp is None or stamp == self.seen:
            return None
        try:
            new = system.with_index(Index.load(self.directory), self.directory)
        except (UserError, OSError, ValueError) as err:  # not complete yet, or a version replaced as it was read
            logger.warning("the index changed but cannot be loaded yet (%s): serving the version loaded before", err)
            return None
        self.seen = stamp
        logger.info("reloaded the index %s: version %d, %d passages", self.directory, new.index.version,
                    len(new.passages))
        return new

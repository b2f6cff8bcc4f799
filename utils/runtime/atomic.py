"""The one atomic writer: a file replaced as a whole or not at all, so that a reader (or a resumed job after a crash)
never sees half a file, and nothing but the file named is ever touched.

The new contents go to a temporary file of a name of their own in the same folder (hidden, unique: a user's
`corpus.jsonl.tmp` beside `corpus.jsonl` is never written over), made durable (fsync: a manifest or progress record
must not vouch for data a power cut loses), then renamed into place. On every way out but success (an exception,
Ctrl-C, SIGTERM) the temporary file is removed and the file named is left as it was. A name that cannot be written
(a folder that does not exist or takes no files, no permission, a name too long) is a one-line UserError naming it,
before anything is written."""

import contextlib
import os
import secrets
import signal
import threading

from utils.errors import UserError


@contextlib.contextmanager
def atomic_file(path: str):
    """Yield a text file (UTF-8) whose contents replace `path` when the block ends without an exception."""
    directory, name = os.path.split(os.path.abspath(path))
    try:
        if len(os.fsencode(name)) > os.pathconf(directory, "PC_NAME_MAX"):  # the rename at the end would fail
            raise UserError(f"{path}: cannot write it (the file name is too long)")
        temporary, fd = _temporary(directory, name)
    except OSError as err:
        raise UserError(f"{path}: cannot write it ({err.strerror or err})") from None
    try:
        with _sigterm_raises(), os.fdopen(fd, "w", encoding="utf-8") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
            os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(temporary)
        raise


def _temporary(directory: str, name: str) -> tuple[str, int]:
    """(path, descriptor) of a new, empty file of a name no other file has, created here and only here (O_EXCL),
    with the permissions a new file gets (umask)."""
    while True:
        path = os.path.join(directory, f".{name[:200]}.{secrets.token_hex(4)}.tmp")
        try:
            return path, os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
        except FileExistsError:
            continue


@contextlib.contextmanager
def _sigterm_raises():
    """SIGTERM as an exception (SystemExit, status 143 as a shell reports the signal) while a file is written, so that
    its temporary file is removed. Only where SIGTERM would otherwise kill the process unhandled (its default), and
    only on the main thread (the only one a handler can be set from)."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return

    def terminated(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)

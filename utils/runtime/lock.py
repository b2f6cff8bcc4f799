"""One writer at a time: a directory that a run writes over several steps (an index built or updated chunk by chunk)
is locked for the run, so that a second run started on it meanwhile (two cron jobs) is refused in one line instead
of appending to the same files. The lock is the kernel's (flock on the directory itself): it writes nothing into the
directory, and it is released when the run ends however it ends, so no stale lock is ever left behind."""

import contextlib
import fcntl
import os

from utils.errors import UserError


@contextlib.contextmanager
def directory_lock(directory: str, what: str):
    """Hold `directory` (created if it does not exist; removed again if the run fails with it still empty) for
    this process's run; another run holding it is a UserError naming it (`what`: what is written there). A path
    that is not a directory is left to the caller's checks."""
    if os.path.lexists(directory) and not os.path.isdir(directory):
        yield
        return
    created = not os.path.exists(directory)
    try:
        os.makedirs(directory, exist_ok=True)
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as err:
        raise UserError(f"{directory}: cannot create the {what} directory ({err.strerror or err})") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise UserError(f"{directory}: another run is writing this {what} now: wait for it to end, or give "
                        "another directory") from None
    try:
        yield
    except BaseException:
        if created:
            with contextlib.suppress(OSError):  # only while it is empty: nothing of anybody's is deleted
                os.rmdir(directory)
        raise
    finally:
        os.close(fd)  # releases the lock

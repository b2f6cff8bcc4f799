"""User errors: problems with the command line or the input files, reported as one line, never a traceback."""

import functools
import sys


class UserError(Exception):
    """Something the user can fix (a flag, a path, a malformed example). The message is the whole report."""


def exit_on_user_error(main):
    """Run `main`; a UserError becomes `error: <message>` on stderr and exit status 2."""

    @functools.wraps(main)
    def wrapper(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except UserError as err:
            print(f"error: {err}", file=sys.stderr, flush=True)
            sys.exit(2)

    return wrapper

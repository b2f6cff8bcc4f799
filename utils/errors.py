"""User errors: problems with the command line or the input files, reported as one line, never a traceback; and a
bad request to the server, refused naming its field."""

import functools
import os
import sys


class UserError(Exception):
    """Something the user can fix (a flag, a path, a malformed example). The message is the whole report."""


def check_at_least_one(settings, *names: str) -> None:
    """Count settings must be at least 1 where given (None: not given): the one check of counts, for flags and
    configs alike (a config's fields are named as its flags, so the error names the flag)."""
    for name in names:
        value = getattr(settings, name)
        if value is not None and value < 1:
            raise UserError(f"--{name} must be at least 1 (got {value})")


class BadRequest(Exception):
    """A request to the server that it refuses: the field that is wrong and what is wrong with it, with its HTTP
    status (utils.system.requests answers it as {"error", "field"})."""

    def __init__(self, field: str, message: str, status: int = 422):
        self.field, self.message, self.status = field, message, status


class Interrupted(Exception):
    """Ctrl-C during training. The message says where the run stopped and how to resume it."""


def exit_on_user_error(main):
    """Run `main`; a UserError becomes `error: <message>` on stderr and exit status 2, Ctrl-C one line and exit
    status 130 (what a shell reports for SIGINT), printed by the first process only."""

    @functools.wraps(main)
    def wrapper(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except UserError as err:
            print(f"error: {err}", file=sys.stderr, flush=True)
            sys.exit(2)
        except (Interrupted, KeyboardInterrupt) as err:
            if os.environ.get("RANK", "0") == "0":
                # str(), not the exception itself: a bare KeyboardInterrupt() is truthy and prints as ""
                print(f"\n{str(err) or 'interrupted: nothing was written'}", file=sys.stderr, flush=True)
            sys.exit(130)

    return wrapper

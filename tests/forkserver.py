"""Run project scripts as forks of an interpreter that has already imported the heavy libraries.

Most of a test that runs a script is the new interpreter importing torch, transformers and accelerate, over and
over. This server imports them once, then for each request forks a child that becomes the script: its own
process, arguments, environment, working directory, stdout and stderr, run as `python script.py ...` runs it
(`__main__`, SystemExit's status as the exit status). The parent never runs a torch operation, so no thread or
OpenMP pool exists at the fork. What a fork cannot change is what the libraries read from the environment when
they were imported (OpenMP's thread count, the hub's offline switch): `run_script` (tests/conftest.py) starts a
real interpreter instead whenever a test asks for other values of those.

Protocol, one JSON line each way: {"argv", "env", "cwd", "stdout", "stderr"} -> {"pid"}, then {"status"} when
the child ends (a negative status: killed by that signal, as subprocess reports it).
"""

import atexit
import importlib
import json
import os
import runpy
import sys
import threading
import traceback

# What the scripts import that takes time; importing it here is all the warming there is.
import accelerate  # noqa: F401
import numpy  # noqa: F401
import safetensors.torch  # noqa: F401
import torch  # noqa: F401
import transformers  # noqa: F401

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The project's own modules too: through them transformers loads its model classes, datasets and the server's
# libraries, as long again as the imports above. Imported as the scripts import them (the repository root first),
# so a fork finds them loaded; a script itself still runs anew as __main__ in each child.
sys.path.insert(0, ROOT)
for script in ("train_reader", "train_dpr", "index_corpus", "qa_system", "serve", "make_dpr_data"):
    importlib.import_module(script)
sys.path.remove(ROOT)


def child(request: dict) -> None:
    os.setpgid(0, 0)  # its own process group, so that a timeout kills what it started too
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(target, fd)
        os.close(target)
    sys.stdin = open(os.devnull)
    os.dup2(sys.stdin.fileno(), 0)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # line-buffered, as PYTHONUNBUFFERED asks
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    sys.argv = list(request["argv"])
    sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[0]))
    status = 0
    try:
        runpy.run_path(sys.argv[0], run_name="__main__")
    except SystemExit as exit_:
        code = exit_.code
        if code is None:
            status = 0
        elif isinstance(code, int):
            status = code
        else:
            print(code, file=sys.stderr)
            status = 1
    except BaseException:  # as the interpreter does: the traceback, status 1
        traceback.print_exc()
        status = 1
    try:  # what the interpreter does on its way out: wait for threads, run atexit, flush
        threading._shutdown()
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(status & 0xFF)


def main() -> None:
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            child(request)
        print(json.dumps({"pid": pid}), flush=True)
        _, raw = os.waitpid(pid, 0)
        status = -os.WTERMSIG(raw) if os.WIFSIGNALED(raw) else os.WEXITSTATUS(raw)
        print(json.dumps({"status": status}), flush=True)


if __name__ == "__main__":
    main()

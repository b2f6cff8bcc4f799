"""The output directory's life: refused when it would destroy something, published as a whole.

A run marks its output directory with `.qa-amp.json` ({"script", "state"}: "training", "published" or
"evaluation"). That is how a later run tells its own directories from anybody else's:
* a directory that holds a published model, or that is not empty and carries neither a marker nor checkpoints of
  ours (not written by a run of ours), is refused unless --overwrite_output_dir: a second run must not silently
  replace a finished model;
* one with checkpoints of an unfinished run is refused unless --resume_from_checkpoint or --overwrite_output_dir.

Publishing replaces the directory as a whole. The new model and its outputs are written to a hidden sibling,
which is swapped with the output directory in one atomic rename (Linux renameat2 RENAME_EXCHANGE); the run's own
state (checkpoints, best model, training log, tracker logs) then moves into the new directory, and the old
contents, leftovers of earlier runs included, are deleted. A crash at any point leaves either the old or the new
model, never a mix; checkpoints left in the sibling by a crash between the swap and the move are moved back by
the next run. Where the swap is impossible (a mount point, a file system without RENAME_EXCHANGE) the directory is
replaced entry by entry, its old entries removed first and config.json moved in last, so that it is never a
loadable mix of old and new.
"""

import ctypes
import errno
import json
import os
import shutil
import sys
from contextlib import contextmanager

from accelerate.utils import broadcast_object_list

from utils.loop.errors import UserError

MARKER = ".qa-amp.json"
CHECKPOINTS = "checkpoints"
BEST_MODEL = "best_model"
TRAIN_LOG = "train_log.jsonl"


def read_marker(directory: str) -> dict | None:
    try:
        with open(os.path.join(directory, MARKER)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def write_marker(directory: str, script: str, state: str) -> None:
    with open(os.path.join(directory, MARKER + ".tmp"), "w") as f:
        json.dump({"script": script, "state": state}, f)
    os.replace(os.path.join(directory, MARKER + ".tmp"), os.path.join(directory, MARKER))


def script_name() -> str:
    return os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"


def _refusal(args, mode: str) -> str | None:
    """Why `args.output_dir` must not be used as it is (None: it may)."""
    out = args.output_dir
    if not os.path.isdir(out) or not os.listdir(out) or args.overwrite_output_dir:
        return None
    marker = read_marker(out)
    ckpt_dir = os.path.join(out, CHECKPOINTS)
    checkpoints = os.path.isdir(ckpt_dir) and any(  # a checkpoint copied in, or written before markers existed
        os.path.isfile(os.path.join(ckpt_dir, n, "loop_state.json")) for n in os.listdir(ckpt_dir))
    if marker is None and not checkpoints:
        return (f"{out} is not empty and was not written by a run of this project: give a new or empty "
                "--output_dir, or --overwrite_output_dir to replace its contents")
    marker = marker or {}
    if mode == "train" and args.resume_from_checkpoint is None and checkpoints:
        return (f"{out} holds checkpoints of an earlier run; pass --resume_from_checkpoint latest to continue it, "
                "or --overwrite_output_dir to start over")
    if marker.get("state") == "published" and (mode != "train" or args.resume_from_checkpoint is None):
        return (f"{out} holds a trained model (published by {marker.get('script', 'an earlier run')}): give another "
                "--output_dir, or --overwrite_output_dir to replace it")
    return None


def prepare_output_dir(accelerator, args, mode: str) -> None:
    """Refuse an output directory the run would destroy, then create and mark it. `mode`: "train" or "evaluate".
    With --overwrite_output_dir a training run deletes the earlier run's checkpoints and best model at once;
    everything else in the directory is replaced when the new model is published."""
    failure = None
    if accelerator.is_main_process:
        try:
            recover_interrupted_publish(args.output_dir)
            failure = _refusal(args, mode)
            if failure is None:
                os.makedirs(args.output_dir, exist_ok=True)
                if mode == "train" and args.overwrite_output_dir:
                    for name in (CHECKPOINTS, BEST_MODEL):
                        shutil.rmtree(os.path.join(args.output_dir, name), ignore_errors=True)
                marker = read_marker(args.output_dir)
                if marker is None or (marker.get("state") != "published" and mode == "train"):
                    write_marker(args.output_dir, script_name(), "training" if mode == "train" else "evaluation")
        except OSError as err:  # under a regular file, no permission, read-only file system, ...
            failure = f"{args.output_dir}: cannot create the output directory ({err.strerror or err})"
    if accelerator.num_processes > 1:  # every process stops, not only the one that tried
        failure = broadcast_object_list([failure])[0]
    if failure:
        raise UserError(failure)
    accelerator.wait_for_everyone()


def _sibling(target: str) -> str:
    target = os.path.abspath(target)
    return os.path.join(os.path.dirname(target), f".{os.path.basename(target)}.publishing")


def _staging(target: str) -> tuple[str, bool]:
    """(where to write the new contents, whether it can be swapped with `target` in one rename): a hidden sibling
    on the same file system, else (a mount point, a parent we cannot write) a hidden directory inside `target`."""
    parent, sibling = os.path.dirname(os.path.abspath(target)), _sibling(target)
    try:
        same_fs = os.stat(parent).st_dev == os.stat(target).st_dev
    except OSError:
        same_fs = False
    if same_fs and not os.path.ismount(target) and os.access(parent, os.W_OK):
        return sibling, True
    return os.path.join(target, ".publishing"), False


def _exchange(a: str, b: str) -> bool:
    """Swap two directories atomically (renameat2 with RENAME_EXCHANGE); False where unsupported."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):  # not glibc >= 2.28
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EXDEV, errno.EBUSY, errno.EPERM, errno.ENOTSUP):
        return False
    raise OSError(code, os.strerror(code), b)


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.remove(path)


def recover_interrupted_publish(target: str) -> None:
    """Clean up after a publish that was killed. Its staging directory is deleted: it holds either a new model
    never swapped in or, after the swap, the old contents, with whatever of the run's state (checkpoints...) had
    not yet moved back, which is moved back first."""
    if not os.path.isdir(target):
        return
    shutil.rmtree(os.path.join(target, ".publishing"), ignore_errors=True)
    sibling = _sibling(target)
    if os.path.isdir(sibling):
        for name in _run_state_names(sibling):
            if os.path.lexists(os.path.join(sibling, name)) and not os.path.lexists(os.path.join(target, name)):
                os.replace(os.path.join(sibling, name), os.path.join(target, name))
        shutil.rmtree(sibling)


def _run_state_names(directory: str) -> set[str]:
    """What a run keeps across publishing: checkpoints, the best model, the training log and tracker logs."""
    names = {CHECKPOINTS, BEST_MODEL, TRAIN_LOG}
    return names | {n for n in os.listdir(directory) if n.startswith("qa-amp")}


@contextmanager
def publish_dir(accelerator, target: str, script: str | None = None):
    """Write the model and outputs into the yielded directory; on success it replaces `target` as a whole (see the
    module docstring), keeping the run's checkpoints, best model and logs. On error nothing is replaced."""
    staging, swappable = _staging(target)
    if accelerator.is_main_process:
        shutil.rmtree(staging, ignore_errors=True)
        os.makedirs(staging)
    try:
        yield staging
    except BaseException:
        if accelerator.is_main_process:
            shutil.rmtree(staging, ignore_errors=True)
        raise
    if accelerator.is_main_process:
        write_marker(staging, script or script_name(), "published")
        keep = _run_state_names(target)
        if swappable and _exchange(staging, target):
            for name in keep:  # the swap put them in `staging`, with the old contents
                if os.path.lexists(os.path.join(staging, name)):
                    os.replace(os.path.join(staging, name), os.path.join(target, name))
            shutil.rmtree(staging)
        else:
            _replace_entries(staging, target, keep)
    accelerator.wait_for_everyone()


def _replace_entries(staging: str, target: str, keep: set[str]) -> None:
    """Replace `target`'s contents entry by entry: config.json (what makes a directory a loadable model) goes first,
    then every other old entry, then the new entries with config.json last."""
    old = [n for n in os.listdir(target) if n not in keep and os.path.join(target, n) != staging]
    for name in sorted(old, key=lambda n: n != "config.json"):
        _remove(os.path.join(target, name))
    for name in sorted(os.listdir(staging), key=lambda n: (n == MARKER, n == "config.json")):
        os.replace(os.path.join(staging, name), os.path.join(target, name))
    os.rmdir(staging)

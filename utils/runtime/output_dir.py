"""The output directory's life: refused when it would destroy something, published as a whole.

A run marks its output directory with `.qa-amp.json` ({"script", "state"}): "training" (a training run's
checkpoints), "published" (a trained model) or "evaluated" (the results of an evaluation or of the QA system).
That is how a later run tells its own directories from anybody else's:
* a directory that is not empty and carries neither a marker nor checkpoints of ours (not written by a run of
  ours) is refused unless --overwrite_output_dir;
* one that holds a trained model or the results of an earlier evaluation is refused unless --overwrite_output_dir:
  a second run must not silently replace a finished one;
* one with checkpoints of an unfinished run is refused unless --resume_from_checkpoint or --overwrite_output_dir;
* a resume into one that holds a trained model must continue a checkpoint of that directory's own run: with
  'latest' and no checkpoint, or another directory's checkpoint, it would publish a new model over the finished one.

Publishing replaces the directory as a whole (`staged_directory`). The new contents are written to a hidden
sibling, which is swapped with the output directory in one atomic rename (Linux renameat2 RENAME_EXCHANGE); a
training run's own state (checkpoints, best model, training log, tracker logs) then moves into the new directory,
and the old contents, leftovers of earlier runs included, are deleted. A crash at any point leaves either the old
or the new contents, never a mix; checkpoints left in the sibling by a crash between the swap and the move are
moved back by the next run. Where the swap is impossible (a mount point, a file system without RENAME_EXCHANGE)
the directory is replaced entry by entry, the entry that makes it loadable (config.json for a model, index.json for
an index) removed first and moved in last, so that it is never a loadable mix of old and new. An evaluation
creates nothing before it publishes: interrupted, it leaves nothing behind.
"""

import ctypes
import errno
import json
import os
import shutil
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Optional

from accelerate.utils import broadcast_object_list

from utils.errors import UserError
from utils.runtime.atomic import atomic_file
from utils.runtime.flags import arg

@dataclass(frozen=True)
class OutputConfig:
    """Where a run writes, declared once for every script that writes a directory (the training scripts through
    LoopConfig, index_corpus.py, qa_system.py); a script moves the default aside in a subclass of its own."""
    output_dir: Optional[str] = arg(None, "The directory this run writes its outputs to.")
    overwrite_output_dir: bool = arg(
        False, "Use --output_dir even if it holds what an earlier run wrote or files of no run of this project. "
        "Training deletes the earlier checkpoints at the start and the rest when the new model is published; an "
        "evaluation (--do_train false, qa_system.py) replaces everything when it writes its results; an index "
        "replaces only an index (what it wrote), never a trained model.")


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


# What a trained model's directory holds, whatever wrote it: a transformers model (a reader, an encoder), the
# settings of a reader or a retriever of this project, a retriever's two encoders.
MODEL_ENTRIES = ("config.json", "model.safetensors", "pytorch_model.bin", "reader_settings.json",
                 "retriever_settings.json", "query_encoder", "passage_encoder")


def holds_trained_model(directory: str) -> bool:
    """Whether `directory` holds a trained model: published by a run of ours (its marker), or any of MODEL_ENTRIES."""
    marker = read_marker(directory)
    return (isinstance(marker, dict) and marker.get("state") == "published") or any(
        os.path.lexists(os.path.join(directory, name)) for name in MODEL_ENTRIES)


def write_marker(directory: str, script: str, state: str) -> None:
    with atomic_file(os.path.join(directory, MARKER)) as f:
        json.dump({"script": script, "state": state}, f)


def script_name() -> str:
    return os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"


def _holds_checkpoints(directory: str) -> bool:
    ckpt_dir = os.path.join(directory, CHECKPOINTS)
    return os.path.isdir(ckpt_dir) and any(  # a checkpoint copied in, or written before markers existed
        os.path.isfile(os.path.join(ckpt_dir, n, "loop_state.json")) for n in os.listdir(ckpt_dir))


def _resumes_own_checkpoint(out: str, resume: str | None) -> bool:
    """Whether --resume_from_checkpoint `resume` continues a checkpoint of `out`'s own run ('latest' with one there,
    or a path inside its checkpoints/)."""
    if resume == "latest":
        return _holds_checkpoints(out)
    own = os.path.realpath(os.path.join(out, CHECKPOINTS))
    return resume is not None and os.path.commonpath([own, os.path.realpath(resume)]) == own


def _refusal(out: str, mode: str, overwrite: bool, resume: str | None) -> str | None:
    """Why output directory `out` must not be used as it is (None: it may). `mode`: "train" or "evaluate";
    `overwrite`: --overwrite_output_dir; `resume`: --resume_from_checkpoint."""
    if os.path.lexists(out) and not os.path.isdir(out):
        return f"{out}: is a file, not a directory: give a new or empty --output_dir"
    if not os.path.isdir(out) or not os.listdir(out) or overwrite:
        return None
    marker, checkpoints = read_marker(out), _holds_checkpoints(out)
    if marker is None and not checkpoints:
        return (f"{out} is not empty and was not written by a run of this project: give a new or empty "
                "--output_dir, or --overwrite_output_dir to replace its contents")
    marker = marker or {}
    by = marker.get("script", "an earlier run")
    if mode == "train" and checkpoints and resume is None:
        return (f"{out} holds checkpoints of an earlier run; pass --resume_from_checkpoint latest to continue it, "
                "or --overwrite_output_dir to start over")
    if marker.get("state") == "published" and (mode != "train" or resume is None):
        return (f"{out} holds a trained model (published by {by}): give another --output_dir, or "
                "--overwrite_output_dir to replace it")
    if marker.get("state") == "published" and not _resumes_own_checkpoint(out, resume):
        # 'latest' with no checkpoint starts from scratch, and another directory's checkpoint is another run: either
        # would publish a new model over the finished one
        return (f"{out} holds a trained model (published by {by}) and no checkpoint of its own to resume "
                f"(--resume_from_checkpoint {resume}): give another --output_dir, or --overwrite_output_dir to "
                "replace it")
    if mode == "evaluate" and checkpoints:
        return (f"{out} holds checkpoints of a training run: give another --output_dir, or --overwrite_output_dir "
                "to replace them")
    if marker.get("state") in ("evaluated", "evaluation") or (mode == "evaluate" and set(os.listdir(out)) != {MARKER}):
        return (f"{out} holds the outputs of an earlier run (by {by}): give another --output_dir, or "
                "--overwrite_output_dir to replace them")
    return None


def prepare_output_dir(accelerator, output_dir: str, mode: str, overwrite: bool = False,
                       resume: str | None = None) -> None:
    """Refuse an output directory the run would destroy. `mode` "train": then create and mark it (checkpoints go
    there); with `overwrite` (--overwrite_output_dir) the earlier run's checkpoints and best model are deleted at once,
    everything else when the new model is published. `mode` "evaluate": nothing is created; the results are
    published with `publish_dir(..., state="evaluated")`."""
    failure = None
    if accelerator.is_main_process:
        try:
            recover_interrupted_publish(output_dir)
            failure = _refusal(output_dir, mode, overwrite, resume)
            if failure is None and mode == "train":
                os.makedirs(output_dir, exist_ok=True)
                if overwrite:
                    for name in (CHECKPOINTS, BEST_MODEL):
                        shutil.rmtree(os.path.join(output_dir, name), ignore_errors=True)
                marker = read_marker(output_dir)
                if marker is None or marker.get("state") != "published":
                    write_marker(output_dir, script_name(), "training")
            elif failure is None:
                failure = _not_creatable(output_dir)
        except OSError as err:  # under a regular file, no permission, read-only file system, ...
            failure = f"{output_dir}: cannot create the output directory ({err.strerror or err})"
    if accelerator.num_processes > 1:  # every process stops, not only the one that tried
        failure = broadcast_object_list([failure])[0]
    if failure:
        raise UserError(failure)
    accelerator.wait_for_everyone()


def _not_creatable(target: str) -> str | None:
    """Why `target` could not be created or written (None: it can), checked without creating anything."""
    path = os.path.abspath(target)
    while not os.path.exists(path):  # the nearest existing ancestor must be a directory we may write
        path = os.path.dirname(path)
    if not os.path.isdir(path):
        return f"{target}: cannot create the output directory ({path} is a file)"
    if not os.access(path, os.W_OK):
        return f"{target}: cannot create the output directory (no permission to write {path})"
    return None


def _sibling(target: str) -> str:
    target = os.path.abspath(target)
    return os.path.join(os.path.dirname(target), f".{os.path.basename(target)}.publishing")


def _staging(target: str) -> tuple[str, bool]:
    """(where to write the new contents, whether it can be swapped with (or renamed to) `target` in one rename): a
    hidden sibling on the same file system, else (a mount point, a parent we cannot write) a hidden directory inside
    `target`."""
    parent, sibling = os.path.dirname(os.path.abspath(target)), _sibling(target)
    if not os.path.lexists(target):
        return sibling, True
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
    """Clean up after a publish that was killed. Its staging directory is deleted: it holds either new contents
    never swapped in or, after the swap, the old contents, with whatever of the run's state (checkpoints...) had
    not yet moved back, which is moved back first."""
    if os.path.isdir(target):
        shutil.rmtree(os.path.join(target, ".publishing"), ignore_errors=True)
    sibling = _sibling(target)
    if os.path.isdir(sibling):
        if os.path.isdir(target):
            for name in _run_state_names(sibling):
                if os.path.lexists(os.path.join(sibling, name)) and not os.path.lexists(os.path.join(target, name)):
                    os.replace(os.path.join(sibling, name), os.path.join(target, name))
        shutil.rmtree(sibling)


def _run_state_names(directory: str) -> set[str]:
    """What a training run keeps across publishing: checkpoints, the best model, the training log and tracker
    logs."""
    names = {CHECKPOINTS, BEST_MODEL, TRAIN_LOG}
    return names | {n for n in os.listdir(directory) if n.startswith("qa-amp")} if os.path.isdir(directory) else names


@contextmanager
def staged_directory(target: str, keep: set[str] = frozenset(), loadable: str = "config.json"):
    """Write new contents into the yielded (empty, hidden) directory; on success they replace `target` as a whole
    (see the module docstring; `target` is created if it does not exist), keeping the entries of `target` named in
    `keep`. `loadable`: the entry that makes the directory usable, swapped last where entries are replaced one by
    one. On error, or Ctrl-C, the staging directory is removed and `target` is untouched."""
    staging, swappable = _staging(target)
    recover_interrupted_publish(target)
    if not swappable:
        _remove(staging)
    os.makedirs(staging)
    try:
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    swap_in(staging, target, swappable, keep, loadable)


def swap_in(staging: str, target: str, swappable: bool, keep: set[str], loadable: str) -> None:
    """Replace `target` by `staging` (see `staged_directory`)."""
    if swappable and not os.path.lexists(target):
        os.rename(staging, target)
        return
    if swappable and _exchange(staging, target):
        for name in keep:  # the swap put them in `staging`, with the old contents
            if os.path.lexists(os.path.join(staging, name)):
                os.replace(os.path.join(staging, name), os.path.join(target, name))
        shutil.rmtree(staging)
    else:
        _replace_entries(staging, target, keep, loadable)


# A script that runs as one process without an Accelerator (export_feedback.py, scripts/finetune_on_labels.py): what
# prepare_output_dir and publish_dir ask of one
ONE_PROCESS = SimpleNamespace(is_main_process=True, num_processes=1, wait_for_everyone=lambda: None)


@contextmanager
def publish_dir(accelerator, target: str, script: str | None = None, state: str = "published"):
    """Write the outputs into the yielded directory (the main process writes; every process gets its path); on
    success they replace `target` as a whole (`staged_directory`), marked `state` ("published": a trained model,
    which keeps the run's checkpoints, best model and logs; "evaluated": an evaluation's results, which keep
    nothing of what was there). On error nothing is replaced."""
    keep = _run_state_names(target) if state == "published" else set()
    if not accelerator.is_main_process:
        staging = broadcast_object_list([None])[0] if accelerator.num_processes > 1 else None
        yield staging
        accelerator.wait_for_everyone()
        return
    with staged_directory(target, keep) as staging:
        if accelerator.num_processes > 1:
            broadcast_object_list([staging])
        yield staging
        write_marker(staging, script or script_name(), state)
    accelerator.wait_for_everyone()


def _replace_entries(staging: str, target: str, keep: set[str], loadable: str = "config.json") -> None:
    """Replace `target`'s contents entry by entry: `loadable` (what makes a directory usable: a model's config.json)
    goes first, then every other old entry, then the new entries with `loadable` last."""
    old = [n for n in os.listdir(target) if n not in keep and os.path.join(target, n) != staging]
    for name in sorted(old, key=lambda n: n != loadable):
        _remove(os.path.join(target, name))
    for name in sorted(os.listdir(staging), key=lambda n: (n == MARKER, n == loadable)):
        os.replace(os.path.join(staging, name), os.path.join(target, name))
    os.rmdir(staging)

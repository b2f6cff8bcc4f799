"""Checkpoints: written to a temporary directory and renamed into place (a run killed mid-save never leaves a
checkpoint that resume would pick up), pruned to --checkpoints_total_limit, resumed from (the latest or a given
one), and the best model restored with its checkpoint."""

import json
import logging
import os
import re
import shutil

import torch
from safetensors.torch import load_file

from utils.errors import UserError
from utils.files.jsonfiles import json_safe

logger = logging.getLogger("qa-amp")


_STEP_DIR = re.compile(r"^step_(\d+)$")


def checkpoint_dir(output_dir: str) -> str:
    return os.path.join(output_dir, "checkpoints")


def list_checkpoints(ckpt_dir: str) -> list[str]:
    """Complete checkpoints (renamed into place) in step order; temporary directories are ignored."""
    if not os.path.isdir(ckpt_dir):
        return []
    steps = sorted((int(m.group(1)), name) for name in os.listdir(ckpt_dir) if (m := _STEP_DIR.match(name)))
    return [os.path.join(ckpt_dir, name) for _, name in steps]


def resolve_resume(output_dir: str, want: str | None) -> str | None:
    """Path of the checkpoint to resume from (`want`: a checkpoint, "latest" or None), None to start fresh (an
    explicit path was checked by LoopConfig)."""
    if want == "latest":
        found = list_checkpoints(checkpoint_dir(output_dir))
        return found[-1] if found else None
    return want


def check_resume_fixed(output_dir: str, want: str | None, fixed: dict) -> None:
    """Refuse (one line naming the flag) to resume a checkpoint whose run recorded other `fixed` settings (run's
    `fixed`, utils.loop.run): a run resumed with another teacher, or none, would go on learning from something else
    than it started with, or die deep in Accelerate's load_state. A checkpoint that recorded none (an older version)
    is not checked; one whose loop_state.json cannot be read is refused: what it would resume is unknown."""
    path = resolve_resume(output_dir, want)
    if not path:
        return
    try:
        with open(os.path.join(path, "loop_state.json")) as f:
            state = json.load(f)
    except (OSError, ValueError) as err:
        reason = err.strerror if isinstance(err, OSError) and err.strerror else f"not JSON: {err}"
        raise UserError(f"{path}: loop_state.json cannot be read ({reason}): the checkpoint is damaged; resume "
                        "another one (--resume_from_checkpoint PATH) or start over in another --output_dir") from None
    if not isinstance(state, dict):
        raise UserError(f"{path}: loop_state.json is not a JSON object: the checkpoint is damaged; resume another "
                        "one (--resume_from_checkpoint PATH) or start over in another --output_dir")
    recorded = state.get("fixed")
    if not isinstance(recorded, dict):
        return
    for flag in list(recorded) + [k for k in fixed if k not in recorded]:  # the model first, as recorded
        old, new = recorded.get(flag), json_safe(fixed.get(flag))
        if _identity(old) != _identity(new):
            raise UserError(f"--{flag}: the checkpoint's run had {_shown(old)}, this run has {_shown(new)}: resume "
                            f"{path} with the same --{flag}, or start over in another --output_dir")


def _identity(value):
    """What makes two recorded values the same: a model by its weights hash, wherever it lies now."""
    return value.get("weights_sha256") if isinstance(value, dict) and "weights_sha256" in value else value


def _shown(value) -> str:
    if value is None:
        return "none"
    if isinstance(value, dict) and "weights_sha256" in value:
        return f"{value.get('model')} (weights sha256 {str(value['weights_sha256'])[:12]})"
    return str(value)


def save_checkpoint(accelerator, output_dir: str, step: int, loop_state: dict, best_dir: str, keep: int | None,
                    fixed: dict | None = None) -> str:
    """accelerator.save_state into a temporary directory, then rename; keep the newest `keep` (None: all). `fixed`:
    the settings a resume must share (run's `fixed`, utils.loop.run), recorded beside the loop state
    (check_resume_fixed).

    The best model so far goes into the checkpoint too (hard links, no copy): the loop state names its update,
    so resuming from any checkpoint, into any directory, must bring back exactly that model."""
    ckpt_dir = checkpoint_dir(output_dir)
    final = os.path.join(ckpt_dir, f"step_{step}")
    tmp = os.path.join(ckpt_dir, f".tmp-step_{step}")
    if accelerator.is_main_process:
        os.makedirs(ckpt_dir, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(tmp)  # model, optimizer, scheduler, loss scaler, RNG of every process
    accelerator.wait_for_everyone()  # every process has written its RNG state before the rename
    if accelerator.is_main_process:
        with open(os.path.join(tmp, "loop_state.json"), "w") as f:
            json.dump(json_safe({**loop_state, "fixed": fixed or {}}), f, indent=1)  # human-readable copy;
            # load_state uses the pickled one
        if loop_state["best_step"] is not None and os.path.isdir(best_dir):
            shutil.copytree(best_dir, os.path.join(tmp, "best_model"), copy_function=_link_or_copy)
        replace_dir(tmp, final)
        if keep:
            for old in list_checkpoints(ckpt_dir)[: -keep]:
                shutil.rmtree(old)
    accelerator.wait_for_everyone()
    return final


def supersede_later_checkpoints(accelerator, output_dir: str, step: int) -> list[str]:
    """A run resumed from update `step` abandons the checkpoints of this output directory beyond it: move them to
    checkpoints/superseded/, so that `--resume_from_checkpoint latest` continues this run and pruning by step
    order never deletes the checkpoint this run writes next (nothing is deleted). Returns their names."""
    later = [path for path in list_checkpoints(checkpoint_dir(output_dir)) if int(path.rsplit("_", 1)[1]) > step]
    if accelerator.is_main_process and later:
        aside = os.path.join(checkpoint_dir(output_dir), "superseded")
        os.makedirs(aside, exist_ok=True)
        for path in later:
            dest, n = os.path.join(aside, os.path.basename(path)), 1
            while os.path.exists(dest):
                n += 1
                dest = os.path.join(aside, f"{os.path.basename(path)}.{n}")
            os.replace(path, dest)
    accelerator.wait_for_everyone()
    return [os.path.basename(p) for p in later]


def restore_best_model(accelerator, checkpoint: str, best_dir: str, best_step: int | None) -> None:
    """Make `best_dir` the best model saved with `checkpoint`, whatever an interrupted run left there: a best
    model saved after the checkpoint is not the one its loop state (`best_step`) describes."""
    if accelerator.is_main_process:
        saved = os.path.join(checkpoint, "best_model")
        if os.path.isdir(saved):
            shutil.rmtree(best_dir + ".tmp", ignore_errors=True)
            shutil.copytree(saved, best_dir + ".tmp")
            replace_dir(best_dir + ".tmp", best_dir)
        elif best_step is None:
            shutil.rmtree(best_dir, ignore_errors=True)
        else:  # a checkpoint from before best models travelled with checkpoints
            logger.warning("%s holds no best_model; keeping %s as the best model (update %d)", checkpoint, best_dir,
                           best_step)
    accelerator.wait_for_everyone()


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:  # no hard links on this file system (some network and FUSE mounts)
        shutil.copy2(src, dst)


def replace_dir(new: str, final: str) -> None:
    """Move the finished directory `new` to `final`. An existing `final` is moved aside first and only
    deleted once the new one is in place, so a crash at any point leaves one complete copy."""
    if os.path.exists(final):
        os.replace(final, new + ".old")
    os.replace(new, final)
    shutil.rmtree(new + ".old", ignore_errors=True)


def load_weights(module: torch.nn.Module, path: str) -> None:
    """Load a safetensors file into `module`, every key accounted for. A lenient load would make restoring
    the best model a silent no-op if the names did not fit (a wrapper's renamed weights)."""
    loaded = load_file(path)
    missing, unexpected = module.load_state_dict(loaded, strict=False)
    # save_pretrained leaves out tied tensors (BART's embed_tokens share the shared embedding): a missing key
    # whose storage is a loaded key's was loaded with it.
    own = module.state_dict()
    loaded_storage = {own[k].data_ptr() for k in loaded if k in own}
    missing = [k for k in missing if own[k].data_ptr() not in loaded_storage]
    if missing or unexpected:
        raise RuntimeError(f"{path} does not fit {type(module).__name__}: missing {sorted(missing)[:5]}, "
                           f"unexpected {sorted(unexpected)[:5]}")

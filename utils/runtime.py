"""Process setup, checkpoints and outputs: the parts of a run that touch the hardware and the disk.

Accelerate owns the hardware: `Accelerator(mixed_precision=...)` does autocast and (fp16) loss scaling,
device placement and distribution. Here we only refuse what Accelerate would silently get wrong
(fp16 on a CPU trains in fp32), and make every write crash-safe: checkpoints and the final model are
written to a hidden temporary directory and renamed into place, so a run killed mid-save never
leaves something that looks finished or that `--resume_from_checkpoint latest` would pick up.
"""

import ctypes
import json
import logging
import math
import os
import re
import resource
import shutil
import sys
import warnings

import datasets
import numpy as np
import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType, set_seed

from utils.args import as_config
from utils.errors import UserError
from utils.output_dir import prepare_output_dir

logger = logging.getLogger("qa-amp")
_STEP_DIR = re.compile(r"^step_(\d+)$")


def keep_freed_memory(device: torch.device) -> None:
    """On CPU, stop glibc from handing freed memory back to the kernel.

    A training step allocates and frees the same large activation and gradient buffers every time, and
    their shapes change with each batch's padded length. glibc serves blocks over 32 MiB with fresh
    mmap()s and trims the heap top after frees, so every step re-faults the same memory page by page:
    16% of the CPU time of a reader run went to page faults. Serving everything from the heap and never
    trimming it cut minor page faults over 60 reader steps from ~10M to ~1.5M and raised throughput from
    8.8-9.2 to 9.9-11.1 windows/s (MiniLM bf16 on 2 cores, noisy short runs) for ~1 GiB more peak RSS. CUDA memory has its own caching allocator, so this is CPU-only.
    """
    if device.type != "cpu" or not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL("libc.so.6")
        m_trim_threshold, m_top_pad, m_mmap_max = -1, -2, -4  # <malloc.h>
        ok = (libc.mallopt(m_mmap_max, 0) and libc.mallopt(m_trim_threshold, 2**31 - 1)
              and libc.mallopt(m_top_pad, 256 * 2**20))
    except (OSError, AttributeError):  # not glibc (musl, ...): nothing to tune
        return
    if not ok:
        logger.warning("mallopt refused the CPU memory settings; training runs slower")


def setup(args) -> Accelerator:
    """Create the Accelerator, check the precision is real on this device, seed, and print the run summary."""
    trackers = {"none": None, "all": "all"}.get(args.report_to, [args.report_to])
    accelerator = Accelerator(
        mixed_precision=args.requested_precision,  # None: the launcher's / config's choice
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        log_with=trackers,
        project_dir=args.output_dir,
        dynamo_backend="inductor" if args.torch_compile else None,  # None: the launcher's / config's setting
    )
    logging.basicConfig(format="%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S",
                        level=logging.INFO if accelerator.is_main_process else logging.ERROR)
    datasets.disable_progress_bars()  # one bar per tokenisation pass and cache load: noise, not information
    logging.getLogger("accelerate").setLevel(logging.WARNING)  # one line per saved file is noise
    warnings.filterwarnings("ignore", message=".*TypedStorage is deprecated.*")

    launched = int(os.environ.get("WORLD_SIZE", "1"))
    if launched > 1 and accelerator.num_processes == 1:
        raise UserError(f"{launched} processes were launched but Accelerate is not distributing them (no GPU found), "
                        "so each would train alone: on CPUs set ACCELERATE_USE_CPU=1 (MULTI_CPU, gloo)")
    if accelerator.mixed_precision == "fp16" and not accelerator.native_amp \
            and accelerator.distributed_type != DistributedType.DEEPSPEED:  # DeepSpeed runs its own fp16
        raise UserError("fp16 mixed precision needs a GPU: on a CPU Accelerate would silently train in fp32. "
                        "Use --mixed_precision bf16 (CPUs with AVX512-BF16/AMX run it fast) or 'no'.")
    check_layout(args, accelerator.distributed_type, getattr(accelerator.state.deepspeed_plugin, "zero_stage", None))
    keep_freed_memory(accelerator.device)
    set_seed(args.seed)
    prepare_output_dir(accelerator, args, "train" if getattr(args, "do_train", True) else "evaluate")
    n = accelerator.num_processes
    layout = (f"run: precision={accelerator.mixed_precision} device={accelerator.device.type} "
              f"distributed={accelerator.distributed_type.value} processes={n}")
    if getattr(args, "do_train", True):
        bs, k = args.per_device_train_batch_size, args.gradient_accumulation_steps
        layout += (f" batch={bs} per process x {k} accumulation step{'s' * (k > 1)} x {n} process{'es' * (n > 1)} "
                   f"= {bs * k * n} per update")
    accelerator.print(f"{layout}, output_dir={args.output_dir}")
    return accelerator


def check_layout(args, distributed_type, zero_stage) -> None:
    """Refuse what a hardware layout would break only at the end of a run, after the training time is spent."""
    if args.eval_steps and (distributed_type == DistributedType.FSDP
                            or (distributed_type == DistributedType.DEEPSPEED and zero_stage == 3)):
        # Parameters are sharded (FSDP's flat parameters, ZeRO-3's empty placeholders): the best model's full
        # weights cannot be loaded back into the unwrapped model, so the run would fail before publishing.
        raise UserError("--eval_steps keeps the best model, which cannot be restored into FSDP/ZeRO-3 sharded "
                        "parameters yet: drop --eval_steps (evaluate the saved checkpoints instead) or use DDP/ZeRO-2")


def full_state_dict(accelerator, model) -> dict:
    """The whole model's weights on every process (a collective: gathers FSDP/DeepSpeed shards), named as in the
    uncompiled model: torch.compile's wrapper prefixes every name with `_orig_mod.`, and save_pretrained would
    silently write nothing for names it does not know."""
    return {k.replace("_orig_mod.", ""): v for k, v in accelerator.get_state_dict(model).items()}


def bare_model(accelerator, model):
    """The model without Accelerate's wrappers (DDP, ...) and without torch.compile's: its weights are named as
    saved (`_orig_mod.` prefixes would make a strict load of the best model fail)."""
    return accelerator.unwrap_model(model, keep_torch_compile=False)


def peak_memory_mb(accelerator) -> float:
    """Peak memory of this process: CUDA max allocated on a GPU, peak resident set size on a CPU."""
    if accelerator.device.type == "cuda":
        return round(torch.cuda.max_memory_allocated(accelerator.device) / 2**20, 1)
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)  # Linux reports KiB


def finish(accelerator) -> None:
    """End of a run: every process reaches this point before trackers close and the process group goes.

    A multi-process run then leaves with os._exit, skipping interpreter finalization, because of a race
    in torch's gloo backend (caught under gdb, ~1 exit in 7 in a bare 2-process probe, also after
    destroy_process_group): a gloo worker thread ('pt_gloo_runloop') drops its reference to a finished
    collective only after the caller has seen it complete. If the main thread is already in Py_FinalizeEx by
    then and that reference is the last one to a tensor owned by Python, the destructor (~AsyncWork) takes
    the GIL, CPython ends a non-main thread that asks for the GIL during finalization with pthread_exit,
    and that unwind through a noexcept destructor is std::terminate: "terminate called without an active
    exception", SIGABRT. destroy_process_group does not stop the threads (they were still running after it,
    after dropping the model and optimizer, and after gc.collect()), so the only point we control is to
    not finalize while they run. Everything the
    run writes is closed before this point; stdout, stderr and logging are flushed here.
    """
    accelerator.wait_for_everyone()
    accelerator.end_training()
    if accelerator.num_processes > 1:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def checkpoint_dir(args) -> str:
    return os.path.join(args.output_dir, "checkpoints")


def list_checkpoints(ckpt_dir: str) -> list[str]:
    """Complete checkpoints (renamed into place) in step order; temporary directories are ignored."""
    if not os.path.isdir(ckpt_dir):
        return []
    steps = sorted((int(m.group(1)), name) for name in os.listdir(ckpt_dir) if (m := _STEP_DIR.match(name)))
    return [os.path.join(ckpt_dir, name) for _, name in steps]


def resolve_resume(args) -> str | None:
    """Path of the checkpoint to resume from, None to start fresh (an explicit path was checked by TrainArgs)."""
    want = args.resume_from_checkpoint
    if want == "latest":
        found = list_checkpoints(checkpoint_dir(args))
        return found[-1] if found else None
    return want


def save_checkpoint(accelerator, args, step: int, loop_state: dict, best_dir: str) -> str:
    """accelerator.save_state into a temporary directory, then rename; keep --checkpoints_total_limit.

    The best model so far goes into the checkpoint too (hard links, no copy): the loop state names its update,
    so resuming from any checkpoint, into any directory, must bring back exactly that model."""
    ckpt_dir = checkpoint_dir(args)
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
            json.dump(json_safe(loop_state), f, indent=1)  # human-readable copy; load_state uses the pickled one
        if loop_state["best_step"] is not None and os.path.isdir(best_dir):
            shutil.copytree(best_dir, os.path.join(tmp, "best_model"), copy_function=_link_or_copy)
        replace_dir(tmp, final)
        if args.checkpoints_total_limit:
            for old in list_checkpoints(ckpt_dir)[: -args.checkpoints_total_limit]:
                shutil.rmtree(old)
    accelerator.wait_for_everyone()
    return final


def supersede_later_checkpoints(accelerator, args, step: int) -> list[str]:
    """A run resumed from update `step` abandons the checkpoints of this output directory beyond it: move them to
    checkpoints/superseded/, so that `--resume_from_checkpoint latest` continues this run and pruning by step
    order never deletes the checkpoint this run writes next (nothing is deleted). Returns their names."""
    later = [path for path in list_checkpoints(checkpoint_dir(args)) if int(path.rsplit("_", 1)[1]) > step]
    if accelerator.is_main_process and later:
        aside = os.path.join(checkpoint_dir(args), "superseded")
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


def json_safe(obj):
    """`obj` with every non-finite float (inf, -inf, NaN) as None: what JSON calls null. Python's json would write
    Infinity and NaN, which most JSON readers reject."""
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    if isinstance(obj, (float, np.floating)):
        return float(obj) if math.isfinite(obj) else None
    if isinstance(obj, np.integer):
        return int(obj)
    return obj


def json_line(obj) -> str:
    return json.dumps(json_safe(obj), allow_nan=False, ensure_ascii=False)


def write_json(accelerator, path: str, obj) -> None:
    """Strict JSON (non-finite numbers as null), written to a temporary file and renamed into place."""
    if accelerator.is_main_process:
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            json.dump(json_safe(obj), f, indent=1, ensure_ascii=False, allow_nan=False)
        os.replace(path + ".tmp", path)


def tracker_config(args) -> dict:
    """Trackers (TensorBoard hparams) take only scalars and strings."""
    return {k: (v if isinstance(v, (int, float, str, bool)) else str(v)) for k, v in as_config(args).items()}

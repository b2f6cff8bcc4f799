"""Processes and their Accelerator: making it, work done by the main process alone, layout checks, CPU memory
settings, the model as saved, peak memory, the machine, and a clean exit of multi-process runs."""

import ctypes
import logging
import os
import resource
import sys
from datetime import timedelta

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType, InitProcessGroupKwargs, broadcast_object_list

from utils.errors import UserError

logger = logging.getLogger("qa-amp")


def keep_freed_memory(device: torch.device) -> None:
    """On CPU (Linux, glibc), stop glibc from handing freed memory back to the kernel; warns if refused."""
    # CUDA memory has its own caching allocator.
    if device.type != "cpu" or not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL("libc.so.6")
        m_trim_threshold, m_top_pad, m_mmap_max = -1, -2, -4  # <malloc.h>
        # Each step allocates and frees the same large buffers, shaped by the batch's padded length; glibc would mmap
        # blocks over 32 MiB afresh and trim the heap top after frees, re-faulting them page by page every step. No
        # mmap and no trimming trades some peak RSS for far fewer page faults.
        ok = (libc.mallopt(m_mmap_max, 0) and libc.mallopt(m_trim_threshold, 2**31 - 1)
              and libc.mallopt(m_top_pad, 256 * 2**20))
    except (OSError, AttributeError):  # not glibc (musl, ...): nothing to tune
        return
    if not ok:
        logger.warning("mallopt refused the CPU memory settings; training runs slower")


def make_accelerator(process_group_timeout: int, **kwargs) -> Accelerator:
    """The Accelerator of every script: its process group waits `process_group_timeout` minutes in a collective
    (work the main process does alone must fit in it); `kwargs` go to Accelerator."""
    timeout = InitProcessGroupKwargs(timeout=timedelta(minutes=process_group_timeout))
    return Accelerator(kwargs_handlers=[timeout], **kwargs)


def main_process_result(accelerator, compute):
    """`compute()` run by the main process alone, its result broadcast to every process (e.g. ranking a corpus). The
    others wait in the broadcast, for as long as --process_group_timeout allows."""
    result = compute() if accelerator.is_main_process else None
    return broadcast_object_list([result])[0] if accelerator.num_processes > 1 else result


def shards_parameters(distributed_type, zero_stage) -> bool:
    """Whether a layout keeps only a shard of each parameter on a process outside the model's forward pass (FSDP's
    flat parameters, ZeRO-3's empty placeholders)."""
    return distributed_type == DistributedType.FSDP or (distributed_type == DistributedType.DEEPSPEED
                                                        and zero_stage == 3)


def check_layout(eval_steps: int | None, distributed_type, zero_stage) -> None:
    """Refuse what a hardware layout would break only at the end of a run, after the training time is spent."""
    if eval_steps and shards_parameters(distributed_type, zero_stage):
        # Parameters are sharded (FSDP's flat parameters, ZeRO-3's empty placeholders): the best model's full
        # weights cannot be loaded back into the unwrapped model, so the run would fail before publishing.
        raise UserError("--eval_steps keeps the best model, which cannot be restored into FSDP/ZeRO-3 sharded "
                        "parameters yet: drop --eval_steps (evaluate the saved checkpoints instead) or use DDP/ZeRO-2")


def bare_model(accelerator, model):
    """The model without Accelerate's wrappers (DDP, ...) and torch.compile's, its weights named as saved."""
    # torch.compile's `_orig_mod.` prefixes would make a strict load of the best model fail.
    return accelerator.unwrap_model(model, keep_torch_compile=False)


def full_state_dict(accelerator, model) -> dict:
    """The whole model's weights on every process (a collective: gathers FSDP/DeepSpeed shards), named as in the
    uncompiled model."""
    # torch.compile prefixes every name with `_orig_mod.`, and save_pretrained silently writes nothing for names it
    # does not know.
    return {k.replace("_orig_mod.", ""): v for k, v in accelerator.get_state_dict(model).items()}


def peak_memory_mb(accelerator) -> float:
    """Peak memory of this process: CUDA max allocated on a GPU, peak resident set size on a CPU."""
    if accelerator.device.type == "cuda":
        return round(torch.cuda.max_memory_allocated(accelerator.device) / 2**20, 1)
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)  # Linux reports KiB


def machine_kind(device) -> dict:
    """What a run's numbers depend on besides code, data and flags: the device's name, or on CPU the torch threads and
    the bf16 kernels (amx, avx512_bf16)."""
    if device.type != "cpu":
        return {"device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else device.type}
    # CPU results are bit-identical from run to run only on the same kind of CPU with the same number of threads.
    flags = set()
    try:
        with open("/proc/cpuinfo") as f:
            flags = set(next((line for line in f if line.startswith("flags")), "").split())
    except OSError:
        pass
    bf16 = "amx" if "amx_bf16" in flags else "avx512_bf16" if "avx512_bf16" in flags else "none or unknown"
    return {"torch_threads": torch.get_num_threads(), "cpu_bf16": bf16}


def finish(accelerator) -> None:
    """End of a run: waits for every process, closes the trackers, and exits a multi-process run at once (os._exit,
    after flushing logging, stdout and stderr). Everything else the run writes must be closed before this call."""
    accelerator.wait_for_everyone()
    accelerator.end_training()
    if accelerator.num_processes > 1:
        # Skip interpreter finalization: gloo worker threads can drop a finished collective's last tensor reference
        # while the main thread finalizes, and that destructor needing the GIL aborts the process ("terminate called
        # without an active exception"); destroy_process_group does not stop them. See docs/RESULTS.md.
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def tracker_config(hparams: dict) -> dict:
    """Trackers (TensorBoard hparams) take only scalars and strings."""
    return {k: (v if isinstance(v, (int, float, str, bool)) else str(v)) for k, v in hparams.items()}

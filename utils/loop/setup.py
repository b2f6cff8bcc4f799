"""A run of the loop begins: its Accelerator (utils.runtime.process), the checks of what Accelerate would silently
get wrong, the seed, the output directory and the resume checked before any model or data is loaded."""

import logging
import os
import warnings

from accelerate import Accelerator
from accelerate.utils import DistributedType, set_seed

from utils.errors import UserError
from utils.loop.checkpoints import check_resume_fixed
from utils.loop.config import LoopConfig
from utils.runtime.output_dir import prepare_output_dir
from utils.runtime.process import check_layout, keep_freed_memory, make_accelerator


def setup(config: LoopConfig, training: bool = True, fixed: dict | None = None) -> Accelerator:
    """Create the Accelerator, check the precision is real on this device, seed, refuse an output directory the
    run would destroy (utils.runtime.output_dir), and print the run summary. `training` False: the run evaluates a
    trained model (train_reader.py / train_dpr.py --do_train false). `fixed`: what a resumed run must share with
    the run it continues (run's `fixed`), compared before any model or data is loaded."""
    trackers = {"none": None, "all": "all"}.get(config.report_to, [config.report_to])
    accelerator = make_accelerator(
        config.process_group_timeout,
        mixed_precision=config.requested_precision,  # None: the launcher's / config's choice
        gradient_accumulation_steps=config.gradient_accumulation_steps,
        log_with=trackers,
        project_dir=config.output_dir,
        dynamo_backend="inductor" if config.torch_compile else None,  # None: the launcher's / config's setting
    )
    logging.basicConfig(format="%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S",
                        level=logging.INFO if accelerator.is_main_process else logging.ERROR)
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
    check_layout(config.eval_steps, accelerator.distributed_type,
                 getattr(accelerator.state.deepspeed_plugin, "zero_stage", None))
    keep_freed_memory(accelerator.device)
    set_seed(config.seed)
    prepare_output_dir(accelerator, config.output_dir, "train" if training else "evaluate",
                       overwrite=config.overwrite_output_dir, resume=config.resume_from_checkpoint)
    if training:  # before any model or data is loaded
        check_resume_fixed(config.output_dir, config.resume_from_checkpoint, fixed or {})
    n = accelerator.num_processes
    layout = (f"run: precision={accelerator.mixed_precision} device={accelerator.device.type} "
              f"distributed={accelerator.distributed_type.value} processes={n}")
    if training:
        bs, k = config.per_device_train_batch_size, config.gradient_accumulation_steps
        layout += (f" batch={bs} per process x {k} accumulation step{'s' * (k > 1)} x {n} process{'es' * (n > 1)} "
                   f"= {bs * k * n} per update")
    accelerator.print(f"{layout}, output_dir={config.output_dir}")
    return accelerator

"""What the shared training loop takes, parsed from the command line of both training scripts: `OptimizerConfig`
(AdamW and its learning-rate schedule) and `LoopConfig` (the process, the updates, evaluation, checkpoints and the
output directory), each field a flag of its name with its help string and checks beside it (the errors name the
flag). A script subclasses both for the few settings whose default and meaning are its task's (output_dir,
learning_rate, num_train_epochs, per_device_train_batch_size, group_by_length, metric_for_best_model): a field
declared here without a help string is one of those. Where a run writes is OutputConfig's, which every script
that writes a directory shares.
"""

import os
from dataclasses import dataclass
from typing import Literal, Optional

from utils.errors import UserError, check_at_least_one
from utils.runtime.flags import arg, process_group_timeout_arg
from utils.runtime.output_dir import OutputConfig


@dataclass(frozen=True)
class OptimizerConfig:
    learning_rate: float  # the script's: its default is its task's
    weight_decay: float = arg(0.01, "AdamW weight decay (not applied to biases and LayerNorm weights).")
    warmup_ratio: float = arg(0.1, "Fraction of the optimizer updates spent warming the learning rate up.")
    lr_scheduler_type: Literal["linear", "cosine", "constant_with_warmup"] = arg(
        "linear", "Learning-rate schedule, sized in optimizer updates (not micro-batches).")
    freeze_word_embeddings: bool = arg(
        False, "Keep the pretrained word-embedding matrix fixed: about half of a small encoder's parameters, which "
        "AdamW would update densely every step, so each step gets cheaper (docs/AMP.md: by how much).")

    def __post_init__(self):
        if self.learning_rate <= 0:
            raise UserError(f"--learning_rate must be positive (got {self.learning_rate})")
        if not 0 <= self.warmup_ratio < 1:
            raise UserError(f"--warmup_ratio must be in [0, 1) (got {self.warmup_ratio})")


@dataclass(frozen=True)
class LoopConfig(OutputConfig):
    # output_dir (OutputConfig's) and these are the script's: their defaults and words are its task's
    metric_for_best_model: str = None
    num_train_epochs: Optional[float] = None  # None until the script resolves it (its data says how many)
    per_device_train_batch_size: int = 16
    group_by_length: bool = False
    do_train: bool = arg(True, "Train. With false, only evaluate (--validation_file; the reader also predicts, "
                               "--predict_file) the trained model of --model_name_or_path, as it was trained: its "
                               "recorded settings (reader_settings.json, retriever_settings.json) apply.")
    # --- precision -------------------------------------------------------------------------------
    mixed_precision: Optional[Literal["no", "fp16", "bf16"]] = arg(
        None, "Autocast precision. Default: training, what `accelerate config` / `accelerate launch` set, else 'no'; "
        "--do_train false, the precision the model was trained at (as trained).")
    use_amp: bool = arg(False, "Shorthand for --mixed_precision fp16 (the FARM/Haystack flag).")
    # --- optimisation ----------------------------------------------------------------------------
    seed: int = arg(42, "Seed for model initialisation, data order and dropout.")
    per_device_eval_batch_size: int = arg(64, "Evaluation batch size per process.")
    gradient_accumulation_steps: int = arg(1, "Micro-batches summed into one optimizer update.")
    torch_compile: bool = arg(
        False, "Compile the model with torch.compile (inductor, through Accelerate). Compiling takes a while and "
        "recompiles for new input shapes: see docs/AMP.md for where it pays off.")
    max_grad_norm: float = arg(1.0, "Clip the global gradient norm to this (0 disables clipping).")
    max_train_steps: Optional[int] = arg(None, "Total optimizer updates; overrides --num_train_epochs.")
    # --- evaluation, checkpoints, logging ---------------------------------------------------------
    eval_before_training: bool = arg(True, "Evaluate the starting model, so the gain from training is visible.")
    eval_steps: Optional[int] = arg(None, "Evaluate every N optimizer updates (always at the end).")
    early_stopping_patience: Optional[int] = arg(
        None, "Stop after N evaluations without improvement of --metric_for_best_model (needs --eval_steps).")
    checkpointing_steps: Optional[int] = arg(None, "Save the full training state every N optimizer updates.")
    checkpoints_total_limit: Optional[int] = arg(2, "Keep at most this many checkpoints (oldest deleted first).")
    resume_from_checkpoint: Optional[str] = arg(
        None, "Checkpoint directory to continue from, or 'latest' for the newest one in output_dir/checkpoints.")
    logging_steps: int = arg(10, "Log loss and learning rate every N optimizer updates.")
    report_to: Literal["none", "tensorboard", "wandb", "all"] = arg("none", "Experiment trackers (via Accelerate).")
    process_group_timeout: int = process_group_timeout_arg()

    def __post_init__(self):
        check_at_least_one(self, "per_device_train_batch_size", "per_device_eval_batch_size",
                           "gradient_accumulation_steps", "logging_steps", "max_train_steps", "eval_steps",
                           "checkpointing_steps", "checkpoints_total_limit", "early_stopping_patience",
                           "process_group_timeout")
        if self.use_amp and self.mixed_precision not in (None, "fp16"):
            raise UserError(f"--use_amp means fp16 but --mixed_precision {self.mixed_precision} was also given")
        # also with --max_train_steps: a negative count is a typo, not "ignore"
        if self.num_train_epochs is not None and not self.num_train_epochs > 0:
            raise UserError(f"--num_train_epochs must be positive (got {self.num_train_epochs})")
        if self.max_grad_norm < 0:
            raise UserError(f"--max_grad_norm must be >= 0 (got {self.max_grad_norm})")
        if self.early_stopping_patience is not None and self.eval_steps is None:
            raise UserError("--early_stopping_patience needs --eval_steps (early stopping compares evaluations)")
        if self.resume_from_checkpoint is not None and self.overwrite_output_dir:
            raise UserError("--resume_from_checkpoint and --overwrite_output_dir contradict each other")
        want = self.resume_from_checkpoint
        if want not in (None, "latest") and not os.path.isfile(os.path.join(want, "loop_state.json")):
            raise UserError(f"--resume_from_checkpoint {want}: " + (
                "not a checkpoint directory written by this project (no loop_state.json)" if os.path.isdir(want)
                else "no such directory"))

    @property
    def requested_precision(self) -> Optional[str]:
        """The precision asked for on the command line; None defers to the Accelerate config / launcher."""
        return "fp16" if self.use_amp else self.mixed_precision


def max_train_samples_arg():
    """--max_train_samples, the same in both training scripts (each passes it to the loading of its data)."""
    return arg(None, "Train on the first N examples only (quick runs).")


def max_eval_samples_arg():
    """--max_eval_samples, the same in both training scripts."""
    return arg(None, "Evaluate on the first N examples only (quick runs).")

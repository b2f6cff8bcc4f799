"""What the shared training loop takes, as two small typed configs built at the edge (a script's flags,
utils.loop.args.TrainArgs.loop_config) with their checks beside them: `OptimizerConfig` (AdamW and its
learning-rate schedule) and `LoopConfig` (the process, the updates, evaluation, checkpoints and the output
directory). Code below the scripts reads its settings by name from these, never from the command line's namespace.
A field's flag has the field's name (`--eval_steps` is `LoopConfig.eval_steps`): the errors name the flag.
"""

import os
from dataclasses import dataclass, field
from typing import Optional

from utils.errors import UserError, check_at_least_one


@dataclass(frozen=True)
class OptimizerConfig:
    learning_rate: float
    """Peak learning rate of AdamW, reached after the warm-up."""
    weight_decay: float = 0.01
    """AdamW weight decay (not applied to biases and LayerNorm weights)."""
    warmup_ratio: float = 0.1
    """Fraction of the optimizer updates spent warming the learning rate up."""
    lr_scheduler_type: str = "linear"
    """The schedule after the warm-up (a transformers scheduler name), sized in optimizer updates."""
    freeze_word_embeddings: bool = False
    """Keep the word-embedding matrices out of the optimizer (and without gradient)."""

    def __post_init__(self):
        if self.learning_rate <= 0:
            raise UserError(f"--learning_rate must be positive (got {self.learning_rate})")
        if not 0 <= self.warmup_ratio < 1:
            raise UserError(f"--warmup_ratio must be in [0, 1) (got {self.warmup_ratio})")


@dataclass(frozen=True)
class LoopConfig:
    output_dir: str
    """Where checkpoints, the best model, the training log and finally the published model go."""
    metric_for_best_model: str
    """The evaluation metric that picks the best model and drives early stopping (the task says its direction)."""
    optimizer: OptimizerConfig
    """AdamW and its schedule (the schedule is sized by the loop, from the prepared loader)."""
    num_train_epochs: float = 1.0
    """Epochs to train (fractions allowed); ignored with max_train_steps."""
    max_train_steps: Optional[int] = None
    """Total optimizer updates, instead of epochs."""
    per_device_train_batch_size: int = 1
    """Micro-batch size per process (what one loader batch holds: for the run's summary line)."""
    gradient_accumulation_steps: int = 1
    """Micro-batches summed into one optimizer update."""
    max_grad_norm: float = 1.0
    """Clip the global gradient norm to this on every update (0: no clipping)."""
    requested_precision: Optional[str] = None
    """"no", "fp16" or "bf16"; None defers to the Accelerate config or launcher."""
    torch_compile: bool = False
    """Compile the model with torch.compile (inductor) through Accelerate."""
    seed: int = 42
    """Seed of initialisation, data order and dropout."""
    process_group_timeout: int = 60
    """Minutes a process waits in a collective for the others."""
    eval_before_training: bool = True
    """Evaluate the starting model (not when resuming), so the gain from training is visible."""
    eval_steps: Optional[int] = None
    """Evaluate (and keep the best model) every N updates; always at the end."""
    early_stopping_patience: Optional[int] = None
    """Stop after N evaluations without improvement (needs eval_steps)."""
    logging_steps: int = 10
    """A training-log record every N updates."""
    checkpointing_steps: Optional[int] = None
    """Save the whole training state every N updates."""
    checkpoints_total_limit: Optional[int] = 2
    """Keep at most this many checkpoints, oldest deleted first (None: all)."""
    resume_from_checkpoint: Optional[str] = None
    """A checkpoint directory to continue from, "latest" (the newest in output_dir), or None: start fresh."""
    overwrite_output_dir: bool = False
    """Use output_dir even if it holds an earlier run's model, outputs or files of no run of this project."""
    report_to: str = "none"
    """Experiment trackers through Accelerate: none, tensorboard, wandb or all."""
    hparams: dict = field(default_factory=dict, compare=False)
    """The run's settings as trackers record them (the script's flags)."""
    fixed: dict = field(default_factory=dict)
    """{flag: value} that a resumed run must share with the run it continues (what teaches it: a teacher's weights
    hash, its weight and temperature): recorded in every checkpoint, compared before anything is loaded."""

    def __post_init__(self):
        check_at_least_one(self, "per_device_train_batch_size", "gradient_accumulation_steps", "logging_steps",
                           "max_train_steps", "eval_steps", "checkpointing_steps", "checkpoints_total_limit",
                           "early_stopping_patience", "process_group_timeout")
        if not self.num_train_epochs > 0:  # also with --max_train_steps: a negative count is a typo, not "ignore"
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

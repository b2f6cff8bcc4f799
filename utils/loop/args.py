"""The flags of the shared training loop: `TrainArgs` holds the settings of the loop, precision handling and
checkpointing that mean the same in every task. Each script subclasses it with its data and model fields and
with the loop settings whose default depends on the task: output_dir, learning_rate, num_train_epochs,
per_device_train_batch_size, metric_for_best_model and group_by_length (the loop reads them; a task's Args must
declare them)."""

from dataclasses import dataclass
from typing import Literal, Optional

from utils.errors import UserError
from utils.loop.config import LoopConfig, OptimizerConfig
from utils.runtime.flags import Flags, arg, process_group_timeout_arg


@dataclass
class TrainArgs(Flags):
    overwrite_output_dir: bool = arg(
        False, "Use output_dir even if it holds a trained model, checkpoints or outputs of an earlier run, or files of "
        "no run of this project: training deletes the checkpoints at the start and everything else when the new model "
        "is published; --do_train false replaces everything when it writes its results."
    )
    # --- precision -------------------------------------------------------------------------------
    mixed_precision: Optional[Literal["no", "fp16", "bf16"]] = arg(
        None, "Autocast precision. Default: training, what `accelerate config` / `accelerate launch` set, else 'no'; "
        "--do_train false, the precision the model was trained at (as trained)."
    )
    use_amp: bool = arg(False, "Shorthand for --mixed_precision fp16 (the FARM/Haystack flag).")
    # --- optimisation ----------------------------------------------------------------------------
    seed: int = arg(42, "Seed for model initialisation, data order and dropout.")
    weight_decay: float = arg(0.01, "AdamW weight decay (not applied to biases and LayerNorm weights).")
    warmup_ratio: float = arg(0.1, "Fraction of the optimizer updates spent warming the learning rate up.")
    lr_scheduler_type: Literal["linear", "cosine", "constant_with_warmup"] = arg(
        "linear", "Learning-rate schedule, sized in optimizer updates (not micro-batches)."
    )
    per_device_eval_batch_size: int = arg(64, "Evaluation batch size per process.")
    gradient_accumulation_steps: int = arg(1, "Micro-batches summed into one optimizer update.")
    freeze_word_embeddings: bool = arg(
        False, "Keep the pretrained word-embedding matrix fixed: about half of a small encoder's parameters, which "
        "AdamW would update densely every step, so each step gets cheaper (docs/AMP.md: by how much)."
    )
    torch_compile: bool = arg(
        False, "Compile the model with torch.compile (inductor, through Accelerate). Compiling takes a while and "
        "recompiles for new input shapes: see docs/AMP.md for where it pays off.")
    max_grad_norm: float = arg(1.0, "Clip the global gradient norm to this (0 disables clipping).")
    max_train_steps: Optional[int] = arg(None, "Total optimizer updates; overrides --num_train_epochs.")
    max_train_samples: Optional[int] = arg(None, "Train on the first N examples only (quick runs).")
    max_eval_samples: Optional[int] = arg(None, "Evaluate on the first N examples only (quick runs).")
    # --- evaluation, checkpoints, logging ---------------------------------------------------------
    eval_before_training: bool = arg(True, "Evaluate the starting model, so the gain from training is visible.")
    eval_steps: Optional[int] = arg(None, "Evaluate every N optimizer updates (always at the end).")
    early_stopping_patience: Optional[int] = arg(
        None, "Stop after N evaluations without improvement of --metric_for_best_model (needs --eval_steps)."
    )
    checkpointing_steps: Optional[int] = arg(None, "Save the full training state every N optimizer updates.")
    checkpoints_total_limit: Optional[int] = arg(2, "Keep at most this many checkpoints (oldest deleted first).")
    resume_from_checkpoint: Optional[str] = arg(
        None, "Checkpoint directory to continue from, or 'latest' for the newest one in output_dir/checkpoints."
    )
    logging_steps: int = arg(10, "Log loss and learning rate every N optimizer updates.")
    report_to: Literal["none", "tensorboard", "wandb", "all"] = arg("none", "Experiment trackers (via Accelerate).")
    process_group_timeout: int = process_group_timeout_arg()

    def validate(self) -> None:
        """The checks of the flags that build no config; the loop's own checks run as its config is built
        (utils.loop.config). Subclasses extend it and call it last, once their defaults are filled in."""
        self.check_at_least_one("per_device_eval_batch_size", "max_train_samples", "max_eval_samples")
        if self.use_amp and self.mixed_precision not in (None, "fp16"):
            raise UserError(f"--use_amp means fp16 but --mixed_precision {self.mixed_precision} was also given")
        self.loop_config()

    def optimizer_config(self) -> OptimizerConfig:
        return OptimizerConfig(learning_rate=self.learning_rate, weight_decay=self.weight_decay,
                               warmup_ratio=self.warmup_ratio, lr_scheduler_type=self.lr_scheduler_type,
                               freeze_word_embeddings=self.freeze_word_embeddings)

    def loop_config(self) -> LoopConfig:
        """What the shared loop takes (utils.loop.config), from these flags."""
        return LoopConfig(
            output_dir=self.output_dir, metric_for_best_model=self.metric_for_best_model,
            optimizer=self.optimizer_config(), num_train_epochs=self.num_train_epochs,
            max_train_steps=self.max_train_steps, per_device_train_batch_size=self.per_device_train_batch_size,
            gradient_accumulation_steps=self.gradient_accumulation_steps, max_grad_norm=self.max_grad_norm,
            requested_precision=self.requested_precision, torch_compile=self.torch_compile, seed=self.seed,
            process_group_timeout=self.process_group_timeout, eval_before_training=self.eval_before_training,
            eval_steps=self.eval_steps, early_stopping_patience=self.early_stopping_patience,
            logging_steps=self.logging_steps, checkpointing_steps=self.checkpointing_steps,
            checkpoints_total_limit=self.checkpoints_total_limit, resume_from_checkpoint=self.resume_from_checkpoint,
            overwrite_output_dir=self.overwrite_output_dir, report_to=self.report_to, hparams=self.as_dict(),
            fixed=self.fixed_on_resume())

    def fixed_on_resume(self) -> dict:
        """{flag: value} a resumed run must share with the run it continues (LoopConfig.fixed); a script adds what
        teaches its runs."""
        return {}

    @property
    def requested_precision(self) -> Optional[str]:
        """The precision asked for on the command line; None defers to the Accelerate config / launcher."""
        return "fp16" if self.use_amp else self.mixed_precision

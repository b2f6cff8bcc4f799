"""Print docs/FLAGS.md, the flag tables of every script, from the dataclasses each script parses its command line
into (its FLAGS; make_dpr_data.py's argparse parser): the manual says what --help says.

    python scripts/flag_tables.py > docs/FLAGS.md      # after changing a flag (tests/test_configs_and_docs.py checks)
"""

import dataclasses
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import index_corpus  # noqa: E402
import ingest_documents  # noqa: E402
import qa_system  # noqa: E402
import serve  # noqa: E402
import train_dpr  # noqa: E402
import train_reader  # noqa: E402
from make_dpr_data import arguments as make_dpr_data_arguments  # noqa: E402
from utils.runtime.flags import packaged_minilm  # noqa: E402

INTROS = {"shared": "Shared flags (both scripts):", "reader": "Reader flags:",
          "dpr": "DPR flags (plus the shared flags above):", "qa": "QA system flags (`qa_system.py`, its own):",
          "serve": "Server flags (`serve.py`, its own):", "index": "Index flags (`index_corpus.py`, its own):",
          "ingest": "Documents to passages flags (`ingest_documents.py`, its own):",
          "make_dpr_data": "SQuAD -> DPR converter flags (`make_dpr_data.py`, its own):"}


def default(f) -> str:
    value = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
    if isinstance(value, list):
        return " ".join(map(str, value))
    if value is None:
        return "—"
    if value == packaged_minilm():
        return "packaged MiniLM"
    return str(value)


def table(fields) -> str:
    rows = ["| flag | default | meaning |", "|---|---|---|"]
    rows += [f"| `--{f.name}` | {default(f)} | {f.metadata['help']} |" for f in fields]
    return "\n".join(rows)


def argparse_table(parser) -> str:
    """The arguments of a plain argparse command line (make_dpr_data.py's), positional ones first, as in --help."""
    rows = ["| flag | default | meaning |", "|---|---|---|"]
    for a in parser._actions:
        if a.dest == "help":
            continue
        name = f"`{a.option_strings[0]}`" if a.option_strings else f"`{a.dest}` (positional)"
        default = "required" if a.required or not a.option_strings else "—" if a.default is None else a.default
        rows.append(f"| {name} | {default} | {a.help[0].upper() + a.help[1:]}. |")
    return "\n".join(rows)


def flags(script) -> list:
    """A script's flags as fields of the dataclasses it parses (its FLAGS), in the order --help lists them."""
    return [f for cls in script.FLAGS for f in dataclasses.fields(cls) if f.init]


def shared_training_flags() -> list:
    """The flags both training scripts take with the same default and meaning: the loop's, and the few both
    declare alike (--max_train_samples); output_dir and the like each script declares with its own."""
    dpr = {(f.name, default(f), f.metadata["help"]) for f in flags(train_dpr)}
    return [f for f in flags(train_reader) if (f.name, default(f), f.metadata["help"]) in dpr]


def tables() -> dict[str, str]:
    """{intro line: its table}, the fields in the order --help lists them."""
    shared = shared_training_flags()
    own = lambda script: [f for f in flags(script) if f.name not in {g.name for g in shared}]  # noqa: E731
    return {INTROS["shared"]: table(shared), INTROS["reader"]: table(own(train_reader)),
            INTROS["dpr"]: table(own(train_dpr)), INTROS["qa"]: table(flags(qa_system)),
            INTROS["serve"]: table(flags(serve)), INTROS["ingest"]: table(flags(ingest_documents)),
            INTROS["index"]: table(flags(index_corpus)),
            INTROS["make_dpr_data"]: argparse_table(make_dpr_data_arguments())}


HEADING = """# Flags

Every flag of every script, generated from the dataclasses each script parses into (make_dpr_data.py's parser) by
`python scripts/flag_tables.py > docs/FLAGS.md` (do not edit by hand): what `--help` says. Back to the
[README](../README.md)."""


def page() -> str:
    """docs/FLAGS.md: the heading, then each intro line and its table."""
    return "\n\n".join([HEADING] + [f"{intro}\n\n{body}" for intro, body in tables().items()])


if __name__ == "__main__":
    print(page())

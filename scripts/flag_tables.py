"""Print docs/FLAGS.md, the flag tables of every script, from the dataclasses each script parses its command line
into (its FLAGS): the manual says what --help says. A renamed flag's old spelling, which still works, is named
beside it.

    python scripts/flag_tables.py > docs/FLAGS.md      # after changing a flag (tests/test_configs_and_docs.py checks)
"""

import dataclasses
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import export_feedback  # noqa: E402
import index_corpus  # noqa: E402
import ingest_documents  # noqa: E402
import make_dpr_data  # noqa: E402
import qa_system  # noqa: E402
import serve  # noqa: E402
import train_dpr  # noqa: E402
import train_reader  # noqa: E402
from utils.runtime.flags import packaged_minilm  # noqa: E402

INTROS = {"shared": "Shared flags (both scripts):", "reader": "Reader flags:",
          "dpr": "DPR flags (plus the shared flags above):", "qa": "QA system flags (`qa_system.py`, its own):",
          "serve": "Server flags (`serve.py`, its own):", "index": "Index flags (`index_corpus.py`, its own):",
          "ingest": "Documents to passages flags (`ingest_documents.py`, its own):",
          "make_dpr_data": "SQuAD -> DPR converter flags (`make_dpr_data.py`, its own):",
          "export_feedback": "Feedback export flags (`export_feedback.py`, its own):"}


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
    rows += [f"| `--{f.name}`{old_spellings(f)} | {default(f)} | {f.metadata['help']} |" for f in fields]
    return "\n".join(rows)


def old_spellings(f) -> str:
    """A renamed flag's old names (their dashed forms, which every flag has, left out)."""
    aliases = [a for a in f.metadata.get("aliases", ()) if "-" not in a[2:]]
    return f" (was {', '.join(f'`{a}`' for a in aliases)})" if aliases else ""


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
            INTROS["make_dpr_data"]: table(flags(make_dpr_data)),
            INTROS["export_feedback"]: table(flags(export_feedback))}


HEADING = """# Flags

Every flag of every script, generated from the dataclasses each script parses into by
`python scripts/flag_tables.py > docs/FLAGS.md` (do not edit by hand): what `--help` says. Back to the
[README](../README.md)."""


def page() -> str:
    """docs/FLAGS.md: the heading, then each intro line and its table."""
    return "\n\n".join([HEADING] + [f"{intro}\n\n{body}" for intro, body in tables().items()])


if __name__ == "__main__":
    print(page())

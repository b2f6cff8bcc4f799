"""accelerate_configs/ load with Accelerate's own loader; every flag of both scripts is documented."""

import dataclasses
import glob
import os
import subprocess

import pytest
from accelerate.commands.config.config_args import load_config_from_file
from conftest import ROOT

EXPECTED = {  # file -> (distributed type, processes, mixed precision, cpu)
    "default.yaml": ("NO", 1, "no", False),
    "single_gpu.yaml": ("NO", 1, "fp16", False),
    "multi_gpu.yaml": ("MULTI_GPU", 4, "bf16", False),
    "multi_node.yaml": ("MULTI_GPU", 8, "bf16", False),
    "fsdp.yaml": ("FSDP", 4, "bf16", False),
    "deepspeed_zero2.yaml": ("DEEPSPEED", 4, "bf16", False),
    "multi_cpu.yaml": ("MULTI_CPU", 2, "bf16", True),
}


def test_every_layout_has_a_config():
    assert sorted(os.path.basename(p) for p in glob.glob(f"{ROOT}/accelerate_configs/*.yaml")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_config_loads_with_accelerate_and_has_the_fields_that_matter(name):
    path = f"{ROOT}/accelerate_configs/{name}"
    config = load_config_from_file(path)
    dist, processes, precision, cpu = EXPECTED[name]
    assert (config.distributed_type.value, config.num_processes, str(config.mixed_precision), config.use_cpu) == \
        (dist, processes, precision, cpu)
    first = open(path).read().splitlines()
    assert first[0].startswith("#") and any(line.lstrip("# ").startswith(("accelerate launch", "ACCELERATE_USE_CPU"))
                                            for line in first[:8]), "each file starts with its launch command"
    if name == "multi_node.yaml":
        assert config.num_machines == 2 and config.main_process_ip and config.main_process_port
    if name == "fsdp.yaml":
        assert config.fsdp_config["fsdp_state_dict_type"] == "FULL_STATE_DICT"
    if name == "deepspeed_zero2.yaml":
        assert config.deepspeed_config["zero_stage"] == 2


def flag_tables(text: str) -> dict[str, list[str]]:
    """docs/FLAGS.md's tables of flags, by the line that introduces each: {intro: [flag names in its rows]}."""
    tables, intro = {}, None
    for line in text.splitlines():
        if line.startswith("| `--"):
            tables.setdefault(intro, []).append(line.split("`--", 1)[1].split("`", 1)[0])
        elif line.strip() and not line.startswith("|"):
            intro = line.strip()
    return tables


def flag_names(script) -> list[str]:
    """The flags of a script: the fields of the dataclasses it parses its command line into (its FLAGS)."""
    return [f.name for cls in script.FLAGS for f in dataclasses.fields(cls) if f.init]


def test_every_flag_is_declared_once_and_in_the_table_of_the_script_that_has_it():
    import export_feedback
    import index_corpus
    import ingest_documents
    import make_dpr_data
    import qa_system
    import serve
    import train_dpr
    import train_reader

    scripts = (train_reader, train_dpr, qa_system, serve, index_corpus, ingest_documents, make_dpr_data,
               export_feedback)
    for script in scripts:  # one declaration per setting: no two of a script's configs share a field
        assert len(set(flag_names(script))) == len(flag_names(script)), script.__name__
    tables = flag_tables(open(f"{ROOT}/docs/FLAGS.md").read())
    shared = set(tables["Shared flags (both scripts):"])
    assert shared and shared <= set(flag_names(train_reader)) & set(flag_names(train_dpr))
    want = {"Shared flags (both scripts):": shared,
            "Reader flags:": set(flag_names(train_reader)) - shared,
            "DPR flags (plus the shared flags above):": set(flag_names(train_dpr)) - shared,
            "QA system flags (`qa_system.py`, its own):": set(flag_names(qa_system)),
            "Server flags (`serve.py`, its own):": set(flag_names(serve)),
            "Index flags (`index_corpus.py`, its own):": set(flag_names(index_corpus)),
            "Documents to passages flags (`ingest_documents.py`, its own):": set(flag_names(ingest_documents)),
            "SQuAD -> DPR converter flags (`make_dpr_data.py`, its own):": set(flag_names(make_dpr_data)),
            "Feedback export flags (`export_feedback.py`, its own):": set(flag_names(export_feedback))}
    assert {intro: sorted(tables.get(intro, [])) for intro in want} == {k: sorted(v) for k, v in want.items()}


def test_the_flag_tables_say_what_help_says():
    """docs/FLAGS.md is generated from the scripts' dataclasses (scripts/flag_tables.py > docs/FLAGS.md): a help
    text changed without the page fails here."""
    import subprocess
    import sys

    generated = subprocess.run([sys.executable, f"{ROOT}/scripts/flag_tables.py"], capture_output=True, text=True,
                               check=True).stdout.strip()
    assert generated == open(f"{ROOT}/docs/FLAGS.md").read().strip()


def python_files() -> list[str]:
    """The project's .py files, relative to ROOT: git's tracked ones, or (no git, not a checkout) the tree's, dot
    directories (.venv, .git) left out."""
    try:
        files = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True,
                               check=True).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        files = []
    if not files:
        for top, dirs, names in os.walk(ROOT):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            files += [os.path.relpath(os.path.join(top, n), ROOT) for n in sorted(names) if n.endswith(".py")]
    return [f for f in files if os.path.isfile(os.path.join(ROOT, f))]


def test_no_line_of_the_projects_python_is_over_120_characters():
    files = python_files()
    assert "tests/test_configs_and_docs.py" in files
    long = [f"{path}:{n}" for path in files
            for n, line in enumerate(open(os.path.join(ROOT, path), encoding="utf-8"), 1)
            if len(line.rstrip("\n")) > 120]
    assert not long, "lines over 120 characters: " + ", ".join(long)


def test_a_flag_the_scripts_share_is_declared_once():
    """--passages was declared 4 times, --index, --retriever, --output_dir and --overwrite_output_dir 3 times each,
    each with its own help: one declaration now, in the config the scripts share (issue 59)."""
    import export_feedback
    import index_corpus
    import qa_system
    import serve
    import train_dpr
    import train_reader

    declared = {}
    for script in (train_reader, train_dpr, qa_system, serve, index_corpus, export_feedback):
        for cls in script.FLAGS:
            for base in cls.__mro__:
                for name in base.__dict__.get("__annotations__", {}):
                    first = next(b for b in reversed(base.__mro__) if name in b.__dict__.get("__annotations__", {}))
                    declared.setdefault(name, set()).add(first.__qualname__)
    for name in ("passages", "index", "retriever", "batch_size", "output_dir", "overwrite_output_dir", "k",
                 "do_train", "group_by_length"):
        assert len(declared[name]) == 1, (name, declared[name])


def test_a_renamed_flag_keeps_its_old_spelling_and_says_the_new_name_once(capsys, tmp_path):
    import make_dpr_data
    import qa_system
    import serve
    from utils.runtime.flags import parse_args

    (tmp_path / "config.json").write_text("{}")  # a model directory, as the reader's check reads one
    corpus = ["--passages", f"{ROOT}/data/sample/dpr_passages.jsonl", "--reader", tmp_path, "--retriever", "bm25"]
    corpus = list(map(str, corpus))
    (args, config, _) = parse_args(qa_system.FLAGS, ["--questions", f"{ROOT}/data/sample/dev.json", *corpus,
                                                     "--top_k", "3"])
    assert config.k == 3
    (config, _, args, limits, _) = parse_args(serve.FLAGS, [*corpus, "--max_questions", "4",
                                                            "--index_check_seconds", "2"])
    assert limits.max_questions_per_request == 4 and args.reload_check_seconds == 2
    (convert,) = parse_args(make_dpr_data.FLAGS, ["a.json", "b.json", "--out", "dpr.json"])
    assert convert.output == "dpr.json" and convert.squad_files == ["a.json", "b.json"]
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("note:")]
    assert notes == ["note: --top_k is now --k (the old spelling still works)",
                     "note: --index_check_seconds is now --reload_check_seconds (the old spelling still works)",
                     "note: --max_questions is now --max_questions_per_request (the old spelling still works)",
                     "note: --out is now --output (the old spelling still works)"]

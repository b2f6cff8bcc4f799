"""The output directory: never silently replaced, published as a whole, checkpoints never lost."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
from accelerate import Accelerator
from conftest import ROOT, as_from_a_shell, assert_user_error, run_killed_at_checkpoint, run_script

from utils.errors import UserError
from utils.loop.checkpoints import check_resume_fixed
from utils.runtime.output_dir import MARKER, prepare_output_dir, publish_dir, read_marker


def tiny_reader(model_dir, out, *extra):
    return ["--model_name_or_path", model_dir, "--output_dir", out, "--per_device_train_batch_size", 8,
            "--max_eval_samples", 8, "--eval_before_training", "false", *extra]


def tiny_dpr(model_dir, out, *extra):
    return ["--query_model_name_or_path", model_dir, "--passage_model_name_or_path", model_dir, "--output_dir", out,
            "--per_device_train_batch_size", 8, "--max_eval_samples", 8, "--eval_before_training", "false", *extra]


def test_a_second_run_does_not_silently_replace_a_finished_model(tiny_bert_dir, tmp_path):
    out = str(tmp_path / "out")
    run_script("train_reader.py", *tiny_reader(tiny_bert_dir, out, "--max_train_steps", 3))
    before = open(os.path.join(out, "model.safetensors"), "rb").read()
    proc = run_script("train_reader.py", *tiny_reader(tiny_bert_dir, out, "--max_train_steps", 1), check=False)
    assert_user_error(proc, f"{out} holds a trained model (published by train_reader.py)")
    assert open(os.path.join(out, "model.safetensors"), "rb").read() == before
    # 'latest' with no checkpoint to continue is a fresh start: it must not train over the finished model either
    proc = run_script("train_reader.py", *tiny_reader(tiny_bert_dir, out, "--max_train_steps", 1,
                                                      "--resume_from_checkpoint", "latest"), check=False)
    assert_user_error(proc, f"{out} holds a trained model (published by train_reader.py) and no checkpoint")
    assert open(os.path.join(out, "model.safetensors"), "rb").read() == before
    run_script("train_reader.py", *tiny_reader(tiny_bert_dir, out, "--max_train_steps", 1, "--overwrite_output_dir"))
    assert json.load(open(os.path.join(out, "eval_results.json")))["updates"] == 1


def test_a_directory_not_written_by_a_run_of_ours_is_refused(tiny_bert_dir, tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("my own file")
    proc = run_script("train_dpr.py", *tiny_dpr(tiny_bert_dir, out, "--max_train_steps", 1), check=False)
    assert_user_error(proc, f"{out} is not empty and was not written by a run of this project")
    assert os.listdir(out) == ["notes.txt"]


def test_publishing_replaces_the_directory_as_a_whole_and_keeps_the_runs_state(tiny_bert_dir, tmp_path):
    """An --export_dpr run, then one without it: no dpr_*_encoder/ of the first run stays beside the new encoders;
    the second run's checkpoints and log are kept."""
    out = str(tmp_path / "out")
    run_script("train_dpr.py", *tiny_dpr(tiny_bert_dir, out, "--max_train_steps", 1, "--export_dpr"))
    assert os.path.isdir(os.path.join(out, "dpr_question_encoder"))
    run_script("train_dpr.py", *tiny_dpr(tiny_bert_dir, out, "--max_train_steps", 2, "--checkpointing_steps", 2,
                                          "--overwrite_output_dir"))
    assert sorted(os.listdir(out)) == sorted([MARKER, "checkpoints", "eval_results.json", "passage_encoder",
                                              "query_encoder", "rankings.jsonl", "retriever_settings.json",
                                              "train_log.jsonl"])
    assert os.listdir(os.path.join(out, "checkpoints")) == ["step_2"] and read_marker(out)["state"] == "published"
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".")]  # no staging directory left behind


def accelerator_and_args(out, **kw):
    return Accelerator(cpu=True), SimpleNamespace(output_dir=str(out), overwrite_output_dir=False,
                                                  resume_from_checkpoint=None, **kw)


def prepare(accelerator, args, mode):
    """prepare_output_dir as a script calls it, from its --output_dir, --overwrite_output_dir and
    --resume_from_checkpoint."""
    prepare_output_dir(accelerator, args.output_dir, mode, overwrite=args.overwrite_output_dir,
                       resume=args.resume_from_checkpoint)


def test_a_failed_publish_leaves_the_old_model_and_a_killed_one_gives_the_checkpoints_back(tmp_path):
    out = tmp_path / "out"
    accelerator, args = accelerator_and_args(out)
    prepare(accelerator, args, "train")
    (out / "checkpoints" / "step_5").mkdir(parents=True)
    (out / "checkpoints" / "step_5" / "loop_state.json").write_text("{}")  # what makes it a checkpoint
    with publish_dir(accelerator, str(out)) as staging:
        open(os.path.join(staging, "config.json"), "w").write("old")
    with pytest.raises(RuntimeError):
        with publish_dir(accelerator, str(out)) as staging:
            open(os.path.join(staging, "config.json"), "w").write("new")
            raise RuntimeError("the save failed")
    assert (out / "config.json").read_text() == "old" and (out / "checkpoints" / "step_5").is_dir()
    # As a publish killed right after its swap leaves it: the old contents and the checkpoints in the staging sibling.
    staging = tmp_path / ".out.publishing"
    (out / "checkpoints").rename(staging / "checkpoints") if staging.is_dir() else None
    staging.mkdir(exist_ok=True)
    (out / "checkpoints").rename(staging / "checkpoints")
    (staging / "config.json").write_text("older")
    args.resume_from_checkpoint = "latest"
    prepare(accelerator, args, "train")
    assert (out / "checkpoints" / "step_5").is_dir() and not staging.exists()
    assert (out / "config.json").read_text() == "old"


def test_a_published_model_is_trained_over_only_to_continue_its_own_checkpoints(tmp_path):
    """A resume into a directory that holds a trained model continues that directory's own run; with nothing of its
    own to resume ('latest' and no checkpoint, or a checkpoint of another directory) the finished model would be
    replaced by a new one: refused, as a fresh run into it is."""
    out, other = tmp_path / "out", tmp_path / "other"
    accelerator, args = accelerator_and_args(out)
    prepare(accelerator, args, "train")
    with publish_dir(accelerator, str(out)) as staging:
        open(os.path.join(staging, "config.json"), "w").write("{}")
    elsewhere = other / "checkpoints" / "step_3"
    elsewhere.mkdir(parents=True)
    (elsewhere / "loop_state.json").write_text("{}")
    for resume in ("latest", str(elsewhere)):
        args.resume_from_checkpoint = resume
        with pytest.raises(UserError, match="holds a trained model .* and no checkpoint of its own to resume"):
            prepare(accelerator, args, "train")
    own = out / "checkpoints" / "step_2"
    own.mkdir(parents=True)
    (own / "loop_state.json").write_text("{}")
    for resume in ("latest", str(own)):  # continuing the run that published it
        args.resume_from_checkpoint = resume
        prepare(accelerator, args, "train")
    assert read_marker(str(out))["state"] == "published" and (out / "config.json").read_text() == "{}"


def test_resuming_from_an_older_checkpoint_keeps_the_later_ones_aside_and_its_own(tiny_bert_dir, tmp_path):
    """Resumed from step_4 while step_8 and step_12 exist (limit 2): its own step_6 was written, then pruned as
    the oldest, and 'latest' would have resumed the abandoned run."""
    out = str(tmp_path / "out")
    run_script("train_reader.py", *tiny_reader(tiny_bert_dir, out, "--max_train_steps", 12, "--checkpointing_steps", 4,
                                                "--checkpoints_total_limit", 3))
    assert sorted(os.listdir(os.path.join(out, "checkpoints"))) == ["step_12", "step_4", "step_8"]
    proc = run_script("train_reader.py", *tiny_reader(tiny_bert_dir, out, "--max_train_steps", 12,
                                                       "--checkpointing_steps", 6, "--checkpoints_total_limit", 2,
                                                       "--resume_from_checkpoint",
                                                       os.path.join(out, "checkpoints", "step_4")))
    assert "abandons the later checkpoints step_8, step_12 of this directory" in proc.stderr
    assert sorted(os.listdir(os.path.join(out, "checkpoints"))) == ["step_12", "step_6", "superseded"]
    assert sorted(os.listdir(os.path.join(out, "checkpoints", "superseded"))) == ["step_12", "step_8"]


def read_log(out):
    return [json.loads(line) for line in open(os.path.join(out, "train_log.jsonl"))]


def test_a_resumed_run_logs_each_update_once_and_keeps_the_starting_metrics(tiny_bert_dir, tmp_path):
    out = str(tmp_path / "out")
    args = tiny_reader(tiny_bert_dir, out, "--max_train_steps", 8, "--checkpointing_steps", 4, "--logging_steps", 1,
                       "--eval_before_training", "true")
    run_killed_at_checkpoint("train_reader.py", args, out, step=4)
    with open(os.path.join(out, "train_log.jsonl"), "a") as f:  # as if killed after logging past its checkpoint
        f.write(json.dumps({"step": 7, "loss": 1.0}) + "\n")
    run_script("train_reader.py", *args, "--resume_from_checkpoint", "latest")
    assert [r["step"] for r in read_log(out)] == list(range(1, 9))
    before = json.load(open(os.path.join(out, "eval_results.json")))["metrics_before_training"]
    assert before is not None and "f1" in before


def test_ctrl_c_is_one_line_that_says_how_to_resume(tiny_bert_dir, tmp_path):
    out = str(tmp_path / "out")
    cmd = [sys.executable, os.path.join(ROOT, "train_reader.py"),
           *map(str, tiny_reader(tiny_bert_dir, out, "--max_train_steps", 400, "--checkpointing_steps", 3))]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=as_from_a_shell)
    deadline = time.time() + 120
    while not os.path.isdir(os.path.join(out, "checkpoints", "step_3")) and time.time() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr[-3000:]
    assert "Traceback" not in stderr
    last = stderr.strip().splitlines()[-1]
    assert re.fullmatch(r"interrupted at update (\d+); the last checkpoint is step_(\d+); resume with "
                        r"--resume_from_checkpoint latest", last), last
    assert not os.path.exists(os.path.join(out, "model.safetensors"))


def test_results_are_strict_json(tiny_bert_dir, tmp_path):
    """A question with no span candidate has null_minus_best = inf: written as null, not as Infinity."""
    def strict(text):
        return json.loads(text, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))

    out = str(tmp_path / "out")
    run_script("train_reader.py", *tiny_reader(tiny_bert_dir, out, "--max_train_steps", 2, "--logging_steps", 1))
    pred = str(tmp_path / "pred")
    run_script("train_reader.py", "--model_name_or_path", out, "--do_train", "false", "--predict_file",
               os.path.join(ROOT, "data/sample/dev.json"), "--output_dir", pred, "--n_best_size", 1)
    nbest = strict(open(os.path.join(pred, "nbest.json")).read())
    assert any(entry["null_minus_best"] is None and entry["nbest"] == [] for entry in nbest.values())
    for name in ("eval_results.json", "null_scores.json", "predictions.json"):
        strict(open(os.path.join(out, name)).read())
    for line in open(os.path.join(out, "train_log.jsonl")):
        strict(line)


def test_an_evaluation_creates_nothing_until_it_publishes_and_a_finished_one_is_never_silently_reused(tmp_path):
    from utils.errors import UserError
    from utils.runtime.output_dir import write_marker

    out = tmp_path / "eval"
    accelerator, args = accelerator_and_args(out)
    prepare(accelerator, args, "evaluate")
    assert not out.exists()  # checked, not created: an interrupted evaluation leaves nothing
    with pytest.raises(KeyboardInterrupt):
        with publish_dir(accelerator, str(out), state="evaluated") as staging:
            open(os.path.join(staging, "predictions.json"), "w").write("{}")
            raise KeyboardInterrupt
    assert os.listdir(tmp_path) == []
    with publish_dir(accelerator, str(out), state="evaluated") as staging:
        open(os.path.join(staging, "null_scores.json"), "w").write("{}")
    assert read_marker(out) == {"script": read_marker(out)["script"], "state": "evaluated"}
    for mode in ("evaluate", "train"):
        with pytest.raises(UserError, match="holds the outputs of an earlier run"):
            prepare(accelerator, args, mode)
    args.overwrite_output_dir = True
    prepare(accelerator, args, "evaluate")
    with publish_dir(accelerator, str(out), state="evaluated") as staging:
        open(os.path.join(staging, "predictions.json"), "w").write("{}")
    assert sorted(os.listdir(out)) == [MARKER, "predictions.json"]  # nothing of the earlier run stays
    model = tmp_path / "model"
    model.mkdir()
    write_marker(str(model), "train_reader.py", "published")
    accelerator, args = accelerator_and_args(model)
    with pytest.raises(UserError, match="holds a trained model"):
        prepare(accelerator, args, "evaluate")
    (tmp_path / "file").write_text("x")
    accelerator, args = accelerator_and_args(tmp_path / "file" / "sub")
    with pytest.raises(UserError, match="cannot create the output directory"):
        prepare(accelerator, args, "evaluate")


@pytest.mark.parametrize("script", ["train_reader.py", "train_dpr.py", "index_corpus.py", "qa_system.py"])
def test_every_script_waits_in_a_collective_as_long_as_process_group_timeout_says(script):
    """The main process alone builds BM25 over the corpus (index_corpus.py) or ranks the reader's passage pools while
    the others wait in a collective: at DPR's scale longer than NCCL's default timeout, which killed the job. Every
    script builds its Accelerator (utils.runtime.process.make_accelerator) with the process group's timeout from
    --process_group_timeout (minutes)."""
    import importlib
    import inspect
    from datetime import timedelta

    from accelerate.utils import InitProcessGroupKwargs

    from utils.loop import setup
    from utils.runtime import process

    module = importlib.import_module(script[:-3])
    timeout = next(cls.__dataclass_fields__["process_group_timeout"] for cls in module.FLAGS
                   if "process_group_timeout" in cls.__dataclass_fields__)  # the flag, declared once
    assert timeout.default > 10  # beyond NCCL's default
    builds = inspect.getsource(setup.setup) if script.startswith("train_") else inspect.getsource(module.main)
    assert "make_accelerator(" in builds and "Accelerator(" not in builds.replace("make_accelerator(", "")
    handler = process.make_accelerator(90, cpu=True).init_handler
    assert isinstance(handler, InitProcessGroupKwargs) and handler.timeout == timedelta(minutes=90)


def test_a_resume_must_share_what_teaches_the_run_a_model_known_by_its_weights(tmp_path):
    """check_resume_fixed: a model recorded by its weights hash is the same wherever it lies now; another hash,
    another value, or a setting the checkpoint's run did not have is refused naming the flag; a checkpoint of an
    older version (no record) is not checked."""
    step = tmp_path / "out" / "checkpoints" / "step_4"
    step.mkdir(parents=True)
    teacher = {"model": "/old/place", "weights_sha256": "ab" * 32}
    (step / "loop_state.json").write_text(json.dumps({"step": 4, "fixed": {"teacher": teacher, "weight": 0.5}}))
    out = str(tmp_path / "out")
    check_resume_fixed(out, "latest", {"teacher": {**teacher, "model": "/new/place"}, "weight": 0.5})
    for fixed, flag in (({"teacher": {**teacher, "weights_sha256": "cd" * 32}, "weight": 0.5}, "--teacher"),
                        ({"teacher": teacher, "weight": 0.7}, "--weight"), ({"teacher": None}, "--teacher"),
                        ({"teacher": teacher, "weight": 0.5, "layers": "0:0"}, "--layers")):
        with pytest.raises(UserError, match=f"^{flag}: the checkpoint's run had"):
            check_resume_fixed(out, "latest", fixed)
    (step / "loop_state.json").write_text(json.dumps({"step": 4}))
    check_resume_fixed(out, str(step), {"teacher": None})


def test_a_checkpoint_whose_loop_state_cannot_be_read_is_refused_not_resumed_unchecked(tmp_path):
    """check_resume_fixed skipped its check when loop_state.json could not be read: a damaged checkpoint was resumed
    with whatever it had learnt from, unchecked."""
    step = tmp_path / "out" / "checkpoints" / "step_4"
    step.mkdir(parents=True)
    for damaged, reason in (('{"step": 4, "fix', "not JSON"), ("[4]", "not a JSON object"),
                            (None, "No such file or directory")):
        if damaged is None:
            (step / "loop_state.json").unlink()
        else:
            (step / "loop_state.json").write_text(damaged)
        with pytest.raises(UserError, match=f"step_4: loop_state.json .*{reason}.*the checkpoint is damaged"):
            check_resume_fixed(str(tmp_path / "out"), "latest", {"teacher": None})

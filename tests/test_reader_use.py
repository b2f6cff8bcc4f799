"""Using a trained reader: the evaluation mode, the predict mode and the Python API answer exactly as the
training run's own predictions.json did (its recorded null threshold and decoding settings travel with it)."""

import json
import logging
import os
import shutil

import pytest
import torch
from conftest import SAMPLE, assert_user_error, run_script
from safetensors.torch import load_file, save_file

from utils.reader import Reader, ReaderSettings


@pytest.fixture(scope="module")
def trained(tiny_bert_dir, tmp_path_factory):
    """A reader trained on the shipped sample (fp32: the API runs in fp32 too)."""
    out = str(tmp_path_factory.mktemp("reader") / "out")
    run_script("train_reader.py", "--model_name_or_path", tiny_bert_dir, "--output_dir", out,
               "--per_device_train_batch_size", 8, "--learning_rate", 1e-3, "--max_train_steps", 40,
               "--eval_before_training", "false", "--n_best_size", 5, "--max_answer_length", 12)
    return out


def dev_examples():
    return [{"id": q["id"], "question": q["question"], "context": p["context"]}
            for a in json.load(open(f"{SAMPLE}/dev.json"))["data"] for p in a["paragraphs"] for q in p["qas"]]


def test_the_saved_directory_records_threshold_and_decoding_settings(trained):
    settings = ReaderSettings.load(trained)
    results = json.load(open(f"{trained}/eval_results.json"))
    assert settings.null_threshold == results["metrics"]["null_threshold"] == results["predictions_null_threshold"]
    assert (settings.n_best_size, settings.max_answer_length, settings.max_seq_length) == (5, 12, 384)


def test_evaluation_mode_reproduces_the_runs_predictions_and_scores(trained, tmp_path):
    out = str(tmp_path / "eval")
    proc = run_script("train_reader.py", "--model_name_or_path", trained, "--validation_file", f"{SAMPLE}/dev.json",
                      "--do_train", "false", "--output_dir", out)
    assert "at the model's recorded null threshold" in proc.stdout and "an upper bound" in proc.stdout
    assert json.load(open(f"{out}/predictions.json")) == json.load(open(f"{trained}/predictions.json"))
    run, now = (json.load(open(f"{d}/eval_results.json"))["metrics"] for d in (trained, out))
    for name in ("exact", "f1", "HasAns_f1", "NoAns_f1"):
        assert now[f"recorded_{name}"] == run[f"tuned_{name}"]  # the run's predictions.json used its tuned threshold
        assert now[name] == run[name]  # threshold 0
    assert not os.path.exists(f"{out}/model.safetensors")


def test_python_api_answers_as_the_run_did(trained):
    examples = dev_examples()
    reader = Reader(trained, device="cpu")
    answers = reader.answer([(ex["question"], ex["context"]) for ex in examples])
    predictions = json.load(open(f"{trained}/predictions.json"))
    assert {ex["id"]: a["answer"] for ex, a in zip(examples, answers)} == predictions
    for ex, a in zip(examples, answers):
        if a["answer"]:
            assert ex["context"][a["start"]:a["end"]] == a["answer"]
        assert len(a["nbest"]) <= 5 and [s["score"] for s in a["nbest"]] == sorted((s["score"] for s in a["nbest"]),
                                                                                    reverse=True)


@pytest.mark.parametrize("head, described, setting", [
    ("passage_selection", "a passage-selection head", {"passage_selection": True}),
    ("answerability", "an answerability verifier", {"verifier_weight": 0.0}),
])
def test_an_older_versions_head_is_ignored_and_the_reader_answers_as_without_it(trained, tmp_path, caplog, head,
                                                                                 described, setting):
    """An older version could train a passage-selection head or an answerability verifier (`head`.* in
    model.safetensors, and its setting in reader_settings.json). Such a reader still loads, in the API and on the
    command line: the head's weights are ignored, said in one log line, and it answers as it did."""
    old = str(tmp_path / "old")
    shutil.copytree(trained, old)
    weights = load_file(f"{old}/model.safetensors")
    hidden = next(w for k, w in weights.items() if k.startswith("qa_outputs.") and k.endswith(".weight")).shape[1]
    save_file({**weights, f"{head}.weight": torch.randn(1, hidden), f"{head}.bias": torch.zeros(1)},
              f"{old}/model.safetensors", metadata={"format": "pt"})
    settings = json.load(open(f"{old}/reader_settings.json"))
    json.dump({**settings, **setting}, open(f"{old}/reader_settings.json", "w"))
    said = (f"ignoring {head}.bias, {head}.weight: {described} saved by an older version, which this version does not "
            "use (the spans it reads are the same without it)")
    with caplog.at_level(logging.INFO, logger="qa-amp"):
        reader = Reader(old, device="cpu")
    assert [r.getMessage() for r in caplog.records if head in r.getMessage()] == [f"{old}: {said}"]
    assert ReaderSettings.load(old) == ReaderSettings.load(trained)
    pairs = [(ex["question"], ex["context"]) for ex in dev_examples()]
    assert reader.answer(pairs) == Reader(trained, device="cpu").answer(pairs)
    out = str(tmp_path / "eval")
    proc = run_script("train_reader.py", "--model_name_or_path", old, "--validation_file", f"{SAMPLE}/dev.json",
                      "--do_train", "false", "--output_dir", out)
    logged = proc.stdout + proc.stderr
    assert logged.count(said) == 1 and head not in logged.replace(said, "")  # transformers says nothing
    assert json.load(open(f"{out}/predictions.json")) == json.load(open(f"{trained}/predictions.json"))


def test_an_older_verifiers_weight_is_said_to_change_the_no_answer_decision(trained, tmp_path, caplog):
    """A reader an older version trained with a verifier weighed at w != 0 had its null threshold tuned with the
    verifier's term: without the term it abstains otherwise, which loading says in one line (w = 0 says nothing,
    above)."""
    old = str(tmp_path / "old")
    shutil.copytree(trained, old)
    settings = json.load(open(f"{old}/reader_settings.json"))
    json.dump({**settings, "verifier_weight": 2.0}, open(f"{old}/reader_settings.json", "w"))
    with caplog.at_level(logging.INFO, logger="qa-amp"):
        assert ReaderSettings.load(old) == ReaderSettings.load(trained)
    assert [r.getMessage() for r in caplog.records] == [
        f"{old}: its null threshold was tuned with an answerability verifier's term (weight 2), which this version "
        "does not take: it abstains otherwise than the run that tuned it"]


@pytest.mark.parametrize("layout", ["squad_without_answers", "jsonl"])
def test_predict_mode_answers_every_question_of_an_unlabelled_file(trained, tmp_path, layout):
    examples = dev_examples()
    if layout == "jsonl":
        path = tmp_path / "questions.jsonl"
        path.write_text("".join(json.dumps(ex) + "\n" for ex in examples))
    else:
        data = json.load(open(f"{SAMPLE}/dev.json"))
        for article in data["data"]:
            for paragraph in article["paragraphs"]:
                for qa in paragraph["qas"]:
                    qa.pop("answers"), qa.pop("is_impossible", None)
        path = tmp_path / "questions.json"
        path.write_text(json.dumps(data))
    out = str(tmp_path / "predict")
    proc = run_script("train_reader.py", "--model_name_or_path", trained, "--predict_file", path, "--do_train", "false",
                      "--output_dir", out)
    assert "questions/s" in proc.stdout
    predictions = json.load(open(f"{out}/predictions.json"))
    assert predictions == json.load(open(f"{trained}/predictions.json"))  # every id, same threshold, same answers
    nbest = json.load(open(f"{out}/nbest.json"))
    assert nbest.keys() == predictions.keys()
    for qid, entry in nbest.items():
        assert {"answer", "null_score", "null_minus_best", "nbest"} <= entry.keys() and len(entry["nbest"]) <= 5
        assert entry["answer"] in ["", *(span["text"] for span in entry["nbest"][:1])]
    speed = json.load(open(f"{out}/predict_results.json"))
    assert speed["questions"] == len(examples) and speed["questions_per_second"] > 0


def test_a_malformed_predict_file_is_a_one_line_error(trained, tmp_path):
    path = tmp_path / "questions.jsonl"
    path.write_text(json.dumps({"id": "q1", "question": "Who?", "context": "Ada."}) + "\n"
                    + json.dumps({"id": "q2", "question": "Where?"}) + "\n")
    out = tmp_path / "predict"
    proc = run_script("train_reader.py", "--model_name_or_path", trained, "--predict_file", path, "--do_train", "false",
                      "--output_dir", out, check=False)
    assert_user_error(proc, "questions.jsonl: example q2: missing key 'context'")
    assert not (out / "predictions.json").exists()


def test_predict_needs_no_training_flags_and_refuses_them(trained, tmp_path):
    proc = run_script("train_reader.py", "--model_name_or_path", trained, "--predict_file", f"{SAMPLE}/dev.json",
                      "--output_dir", tmp_path / "o", check=False)
    assert_user_error(proc, "--predict_file needs --do_train false")
    proc = run_script("train_reader.py", "--model_name_or_path", trained, "--do_train", "false",
                      "--output_dir", tmp_path / "o", check=False)
    assert_user_error(proc, "--do_train false needs --validation_file (evaluate) or --predict_file (predict)")


def test_a_reader_trained_without_unanswerable_questions_always_answers(tmp_path):
    ReaderSettings(null_threshold=None).save(str(tmp_path))
    assert ReaderSettings.load(str(tmp_path)).null_threshold is None
    from utils.reader.decoding import apply_null_threshold

    assert apply_null_threshold({"a": {"text": "x", "null_minus_best": 99.0}}, None) == {"a": "x"}


def test_evaluation_under_two_processes_gathers_every_question_once(trained, tmp_path):
    from test_distributed import run_ddp

    args = ["--model_name_or_path", trained, "--validation_file", f"{SAMPLE}/dev.json", "--do_train", "false",
            "--per_device_eval_batch_size", 5]  # 52 questions: uneven batches, padded by Accelerate
    single, ddp = str(tmp_path / "single"), str(tmp_path / "ddp")
    run_script("train_reader.py", *args, "--output_dir", single)
    proc = run_ddp("train_reader.py", *args, "--output_dir", ddp)
    assert "processes=2" in proc.stdout
    # The last batch differs in rows and padded width between the layouts: floats may differ in the last bits, so
    # an answer may differ only where a near-tie decided it (the two runs' best spans score alike).
    answers, ratios = ([json.load(open(f"{d}/{name}")) for d in (ddp, single)]
                       for name in ("predictions.json", "null_scores.json"))
    threshold = json.load(open(f"{trained}/reader_settings.json"))["null_threshold"]
    assert answers[0].keys() == answers[1].keys() == ratios[0].keys() == ratios[1].keys()
    for i in answers[0]:
        assert ratios[0][i] == (None if ratios[1][i] is None else pytest.approx(ratios[1][i], rel=1e-5, abs=1e-5)), i
        if answers[0][i] != answers[1][i]:  # equal best scores (the ratios agree), and at the cut if one abstains
            assert "" not in (answers[0][i], answers[1][i]) or ratios[0][i] == pytest.approx(threshold, abs=1e-5), i
    metrics = [json.load(open(f"{d}/eval_results.json"))["metrics"] for d in (ddp, single)]
    assert metrics[0].keys() == metrics[1].keys()
    assert metrics[0] == pytest.approx(metrics[1], rel=1e-5)
    assert len(json.load(open(f"{ddp}/null_scores.json"))) == 52


def evaluate_mode(model, path, out, *extra):
    return run_script("train_reader.py", "--model_name_or_path", model, "--validation_file", path, "--do_train",
                      "false", "--output_dir", out, *extra, check=False)


def test_evaluation_says_where_the_threshold_was_tuned(trained, tmp_path):
    """Tuned on the very file being evaluated (the training run's dev file), on another file, or nowhere (SQuAD v1.1
    data: no threshold lines); the start-up line names no training batch."""
    tuned = ReaderSettings.load(trained).null_threshold_tuned_on
    assert tuned["data"].endswith("data/sample/dev.json") and tuned["questions"] == 52
    same = evaluate_mode(trained, f"{SAMPLE}/dev.json", tmp_path / "same")
    assert "recorded null threshold (" in same.stdout and "tuned on this very file: an upper bound)" in same.stdout
    assert "per update" not in same.stdout and "run: precision=no" in same.stdout
    other = evaluate_mode(trained, f"{SAMPLE}/train.json", tmp_path / "other")
    assert f"tuned on {tuned['data']}, 52 questions)" in other.stdout and "this very file" not in other.stdout

    data = json.load(open(f"{SAMPLE}/dev.json"))
    for article in data["data"]:
        for paragraph in article["paragraphs"]:
            paragraph["qas"] = [qa for qa in paragraph["qas"] if qa["answers"]]
            for qa in paragraph["qas"]:
                qa.pop("is_impossible", None)
    v1 = tmp_path / "v1.json"
    v1.write_text(json.dumps(data))
    proc = evaluate_mode(trained, v1, tmp_path / "v1")
    report = proc.stdout[proc.stdout.index(str(v1)):]
    assert proc.returncode == 0 and "all answerable" in report and "threshold" not in report.replace(
        "every question has an answer, so the model always answers", "")
    predictions = json.load(open(tmp_path / "v1" / "predictions.json"))
    has_span = json.load(open(tmp_path / "v1" / "null_scores.json"))  # null: no span candidate at all
    assert all(predictions[i] for i, s in has_span.items() if s is not None)  # it always answers
    assert sum(s is not None for s in has_span.values()) > 30


def test_a_directory_that_is_not_a_trained_reader_is_refused(trained, tiny_bert_dir, minilm_dir, tmp_path):
    for model in (minilm_dir, tiny_bert_dir):  # the base encoder, and a BERT checkpoint (as a DPR encoder is)
        proc = evaluate_mode(model, f"{SAMPLE}/dev.json", tmp_path / "o")
        assert_user_error(proc, f"{model}: not a trained reader: its checkpoint lacks qa_outputs.bias, "
                                "qa_outputs.weight")
        assert not (tmp_path / "o" / "predictions.json").exists()
    # A QA model without reader_settings.json (any transformers QA model): threshold 0, and said so.
    import shutil

    foreign = tmp_path / "foreign"
    shutil.copytree(trained, foreign, ignore=shutil.ignore_patterns("reader_settings.json", ".qa-amp.json"))
    proc = evaluate_mode(foreign, f"{SAMPLE}/dev.json", tmp_path / "f")
    assert proc.returncode == 0 and "no recorded null threshold (no reader_settings.json): threshold 0" in proc.stdout
    assert "recorded null threshold (0.0" not in proc.stdout


def test_library_warnings_are_not_muted_for_the_whole_process(tmp_path):
    import subprocess
    import sys

    from conftest import ROOT

    code = ("import sys, transformers; sys.path.insert(0, {root!r}); before = transformers.logging.get_verbosity()\n"
            "from utils.runtime.flags import parse_args\nfrom utils.loop.setup import setup\n"
            "from train_reader import FLAGS, resolve\n"
            "setup(resolve(*parse_args(FLAGS, ['--output_dir', {out!r}]))[7])\n"
            "assert transformers.logging.get_verbosity() == before, transformers.logging.get_verbosity()")
    subprocess.run([sys.executable, "-c", code.format(root=ROOT, out=str(tmp_path / "o"))], check=True)

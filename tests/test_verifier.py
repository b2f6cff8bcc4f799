"""The answerability verifier (train_reader.py --verifier, utils.reader.verifier): its loss computed by hand on a
tiny model, the weight tuned with the threshold, the QA system's rule with it, and a trained reader with a verifier
used as it was trained (its head saved and restored, its weight recorded). Resume and 2 processes = 1 with it:
tests/test_shared_norm.py."""

import json
import math
import os
import types

import pytest
import torch
import torch.nn.functional as F
from conftest import SAMPLE, assert_user_error, run_script
from transformers import AutoModelForQuestionAnswering

from utils.reader import Reader, ReaderSettings
from utils.reader.decoding import apply_null_threshold
from utils.reader.reader_task import GroupedReaderTask, ReaderTask
from utils.reader.shared_norm import shared_norm_loss
from utils.reader.verifier import attach_verifier, verifier_loss, verifier_head, with_verifier
from utils.system.answer import combine


def test_the_loss_is_each_windows_cross_entropy_averaged_per_question_then_over_questions():
    scores = torch.tensor([2.0, -1.0, 0.5, -3.0, 1.0])
    holds = torch.tensor([True, False, False, False, True])
    group = torch.tensor([0, 0, 1, 1, 2])
    bce = [math.log1p(math.exp(-s)) if h else math.log1p(math.exp(s)) for s, h in zip(scores.tolist(), holds.tolist())]
    want = ((bce[0] + bce[1]) / 2 + (bce[2] + bce[3]) / 2 + bce[4]) / 3
    assert verifier_loss(scores, holds, group).item() == pytest.approx(want, rel=1e-6)
    assert verifier_loss(scores, holds).item() == pytest.approx(sum(bce) / 5, rel=1e-6)  # a window-level reader


def test_a_tiny_readers_loss_is_the_span_loss_plus_the_verifiers_on_its_cls_vectors(tiny_bert_dir):
    torch.manual_seed(0)
    model = AutoModelForQuestionAnswering.from_pretrained(tiny_bert_dir)
    head = attach_verifier(model)
    model.eval()  # no dropout: the hand computation below runs the encoder again
    n, width = 4, 12
    batch = {"input_ids": torch.randint(5, 100, (n, width)), "attention_mask": torch.ones(n, width, dtype=torch.long),
             "group": torch.tensor([0, 0, 1, 1]), "allowed": torch.ones(n, width, dtype=torch.bool),
             "start_target": torch.zeros(n, width, dtype=torch.bool), "end_target": torch.zeros(n, width, dtype=torch.bool)}
    batch["start_target"][0, 3] = batch["end_target"][0, 5] = True  # question 0: its answer in its first window
    batch["start_target"][2:, 0] = batch["end_target"][2:, 0] = True  # question 1: unanswerable
    loss = GroupedReaderTask.compute_loss(types.SimpleNamespace(teacher=None), model, batch)

    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], output_hidden_states=True)
    cls = out.hidden_states[-1][:, 0]
    z = (cls @ head.weight[0] + head.bias[0]).tolist()
    bce = [F.softplus(torch.tensor(-z[0])).item()] + [F.softplus(torch.tensor(v)).item() for v in z[1:]]
    want = shared_norm_loss(out.start_logits, out.end_logits, batch).item() + ((bce[0] + bce[1]) / 2
                                                                              + (bce[2] + bce[3]) / 2) / 2
    assert loss.item() == pytest.approx(want, rel=1e-5)
    loss.backward()
    assert head.weight.grad is not None and head.weight.grad.abs().sum() > 0


def decoded_of(rows):
    return {str(i): {"text": "x", "null_minus_best": nmb, "verifier": v} for i, (nmb, v) in enumerate(rows)}


def test_the_verifier_lowers_the_log_ratio_by_its_weighted_score_and_a_second_weight_starts_from_the_reader_alone():
    decoded = decoded_of([(1.0, 2.0), (-0.5, -4.0), (math.inf, 1.0)])
    at = with_verifier(decoded, 0.5)
    assert [d["null_minus_best"] for d in at.values()] == [0.0, 1.5, math.inf]
    assert [d["verifier_term"] for d in at.values()] == [1.0, -2.0, 0.5]
    again = with_verifier(at, 2.0)
    assert [d["null_minus_best"] for d in again.values()] == [-3.0, 7.5, math.inf]
    assert [d["null_minus_best"] for d in with_verifier(at, None).values()] == [1.0, -0.5, math.inf]
    assert with_verifier(decoded_of([(1.0, None)]), 4.0)["0"]["null_minus_best"] == 1.0  # no verifier: no term


def test_the_weight_is_tuned_with_the_threshold_and_a_verifier_that_knows_wins():
    refs = {str(i): ([] if i % 2 else ["x"]) for i in range(40)}  # every other question unanswerable
    # the null score says nothing (always 0); the verifier says which questions have an answer
    knows = {str(i): {"text": "x", "null_minus_best": 0.0, "verifier": -3.0 if i % 2 else 3.0} for i in range(40)}
    weight, threshold = ReaderTask.tune(refs, knows)
    answers = apply_null_threshold(with_verifier(knows, weight), threshold)
    assert weight > 0 and all((answers[i] == "") == (not refs[i]) for i in refs)  # every question right
    # a verifier that says nothing: the null score alone (weight 0, the first of equals)
    blind = {i: {**d, "null_minus_best": -1.0 if int(i) % 2 == 0 else 1.0, "verifier": 0.7} for i, d in knows.items()}
    assert ReaderTask.tune(refs, blind)[0] == 0.0
    no_head = {i: {"text": "x", "null_minus_best": d["null_minus_best"]} for i, d in blind.items()}
    assert ReaderTask.tune(refs, no_head)[0] is None


def test_over_several_passages_the_shared_rule_takes_off_the_surest_passages_term():
    def reading(pid, score, null_start, term):
        return {"passage_id": pid, "text": f"t{pid}", "score": score, "null_score": 2 * null_start,
                "null_minus_best": 2 * null_start - score - term, "null_start": null_start, "null_end": null_start,
                "lse_start": 3.0, "lse_end": 3.0, "verifier_term": term}

    passages = [reading(0, 2.0, 0.5, -1.0), reading(1, 1.0, 0.2, 2.5)]
    lse = math.log(math.exp(0.5) + math.exp(0.2))
    assert combine(passages, shared=True)["null_minus_best"] == pytest.approx(2 * lse - 2.0 - 2.5)
    without = [{k: v for k, v in p.items() if k != "verifier_term"} for p in passages]  # an older details.jsonl
    assert combine(without, shared=True)["null_minus_best"] == pytest.approx(2 * lse - 2.0)
    assert combine(passages[:1], shared=True)["null_minus_best"] == pytest.approx(passages[0]["null_minus_best"])


@pytest.fixture(scope="module")
def verified_reader(tiny_bert_dir, tmp_path_factory):
    """A reader trained with a verifier on the shipped sample (fp32: the API runs in fp32 too)."""
    out = str(tmp_path_factory.mktemp("verified") / "out")
    run_script("train_reader.py", "--model_name_or_path", tiny_bert_dir, "--output_dir", out, "--verifier", "true",
               "--per_device_train_batch_size", 8, "--learning_rate", 1e-3, "--max_train_steps", 40,
               "--eval_before_training", "false")
    return out


def test_a_reader_with_a_verifier_records_its_weight_and_reads_as_the_run_did(verified_reader, tmp_path):
    settings = ReaderSettings.load(verified_reader)
    results = json.load(open(f"{verified_reader}/eval_results.json"))["metrics"]
    assert settings.verifier_weight == results["verifier_weight"] and settings.null_threshold == results["null_threshold"]
    reader = Reader(verified_reader, device="cpu")
    assert verifier_head(reader.model) is not None  # restored from model.safetensors, not a new one
    examples = [{"id": q["id"], "question": q["question"], "context": p["context"]}
                for a in json.load(open(f"{SAMPLE}/dev.json"))["data"] for p in a["paragraphs"] for q in p["qas"]]
    answers = reader.answer([(ex["question"], ex["context"]) for ex in examples])
    assert {ex["id"]: a["answer"] for ex, a in zip(examples, answers)} == json.load(
        open(f"{verified_reader}/predictions.json"))
    null_scores = json.load(open(f"{verified_reader}/null_scores.json"))  # the verified log ratio, as compared
    for ex, a in zip(examples, answers):
        assert a["null_minus_best"] == pytest.approx(null_scores[ex["id"]], abs=1e-4)

    out = str(tmp_path / "eval")  # evaluation mode: the recorded threshold and weight give the run's tuned scores
    proc = run_script("train_reader.py", "--model_name_or_path", verified_reader, "--validation_file",
                      f"{SAMPLE}/dev.json", "--do_train", "false", "--output_dir", out)
    assert f"verifier weight {settings.verifier_weight:g}" in proc.stdout
    now = json.load(open(f"{out}/eval_results.json"))["metrics"]
    for name in ("exact", "f1", "HasAns_f1", "NoAns_f1"):
        assert now[f"recorded_{name}"] == results[f"tuned_{name}"]


def test_the_verifier_is_refused_where_it_cannot_weigh_in(tiny_bert_dir, verified_reader, tmp_path):
    v1 = tmp_path / "v1.json"  # SQuAD v1.1: no unanswerable question, no abstaining to weigh in on
    data = json.load(open(f"{SAMPLE}/train.json"))
    data["data"] = [{**a, "paragraphs": [{**p, "qas": [q for q in p["qas"] if q["answers"]]} for p in a["paragraphs"]]}
                    for a in data["data"]]
    for q in (q for a in data["data"] for p in a["paragraphs"] for q in p["qas"]):
        q.pop("is_impossible", None)
    json.dump(data, open(v1, "w"))
    out = tmp_path / "out"
    assert_user_error(run_script("train_reader.py", "--model_name_or_path", tiny_bert_dir, "--train_file", v1,
                                 "--validation_file", v1, "--verifier", "true", "--output_dir", out, check=False),
                      "--verifier")
    assert not (out / "config.json").exists() and not (out / "model.safetensors").exists()
    assert_user_error(run_script("train_reader.py", "--model_name_or_path", verified_reader, "--do_train", "false",
                                 "--validation_file", f"{SAMPLE}/dev.json", "--verifier", "true", "--output_dir",
                                 tmp_path / "eval", check=False), "--verifier")
    assert not (tmp_path / "eval").exists()


def test_a_recorded_weight_takes_the_same_term_off_in_the_api_predict_and_evaluation_modes(verified_reader, tmp_path):
    heavy = tmp_path / "heavy"  # the same reader with its verifier weighed at 2
    heavy.mkdir()
    for name in os.listdir(verified_reader):
        if os.path.isfile(os.path.join(verified_reader, name)) and name != "reader_settings.json":
            os.symlink(os.path.join(verified_reader, name), heavy / name)
    settings = json.load(open(f"{verified_reader}/reader_settings.json"))
    json.dump({**settings, "verifier_weight": 2.0}, open(heavy / "reader_settings.json", "w"))
    examples = [{"id": q["id"], "question": q["question"], "context": p["context"]}
                for a in json.load(open(f"{SAMPLE}/dev.json"))["data"] for p in a["paragraphs"] for q in p["qas"]]

    decoded = Reader(str(heavy), device="cpu").spans(examples)
    for d in decoded.values():
        assert d["null_minus_best"] == pytest.approx(d["null_minus_best_alone"] - 2.0 * d["verifier"])
    assert any(abs(d["verifier"]) > 1e-3 for d in decoded.values())  # the term is not 0 everywhere

    questions = tmp_path / "questions.jsonl"
    questions.write_text("".join(json.dumps(ex) + "\n" for ex in examples))
    run_script("train_reader.py", "--model_name_or_path", heavy, "--do_train", "false", "--predict_file", questions,
               "--output_dir", tmp_path / "pred")
    nbest = json.load(open(tmp_path / "pred" / "nbest.json"))
    for i, d in decoded.items():
        assert nbest[i]["null_minus_best"] == pytest.approx(d["null_minus_best"], abs=1e-4)

    run_script("train_reader.py", "--model_name_or_path", heavy, "--do_train", "false", "--validation_file",
               f"{SAMPLE}/dev.json", "--output_dir", tmp_path / "eval")
    metrics = json.load(open(tmp_path / "eval" / "eval_results.json"))["metrics"]
    assert metrics["recorded_verifier_weight"] == 2.0
    null_scores = json.load(open(tmp_path / "eval" / "null_scores.json"))
    for i, d in decoded.items():
        assert null_scores[i] == pytest.approx(d["null_minus_best"], abs=1e-4)

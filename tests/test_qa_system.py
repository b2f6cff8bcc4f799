"""The QA system end to end on the shipped sample: its answers follow the documented rule over the Reader API's
readings, a retriever that ranks the gold paragraph first reproduces the reader's gold-paragraph scores, several
processes answer as one, and bad inputs are one-line errors."""

import json
import math

import pytest

from conftest import SAMPLE, assert_user_error, run_script
from test_distributed import run_ddp
from utils.reader.trained import Reader
from utils.system.answer import answer, combine


@pytest.fixture(scope="module")
def models(tiny_bert_dir, tmp_path_factory):
    """A tiny reader and a tiny retriever trained on the sample (fp32)."""
    root = tmp_path_factory.mktemp("qa")
    reader, retriever = str(root / "reader"), str(root / "retriever")
    run_script("train_reader.py", "--model_name_or_path", tiny_bert_dir, "--output_dir", reader, "--max_train_steps",
               30, "--learning_rate", 1e-3, "--per_device_train_batch_size", 8, "--eval_before_training", "false")
    run_script("train_dpr.py", "--query_model_name_or_path", tiny_bert_dir, "--passage_model_name_or_path",
               tiny_bert_dir, "--output_dir", retriever, "--max_train_steps", 6, "--learning_rate", 5e-4,
               "--per_device_train_batch_size", 8, "--eval_before_training", "false")
    return reader, retriever


def qa(models, out, *extra, launcher=None):
    reader, retriever = models
    args = ["--retriever", retriever, "--reader", reader, "--passages", f"{SAMPLE}/dpr_passages.jsonl",
            "--questions", f"{SAMPLE}/dev.json", "--output_dir", out, "--eval_k", 1, 3, *extra]
    return run_ddp("qa_system.py", *args) if launcher == "ddp" else run_script("qa_system.py", *args)


def test_answers_follow_the_rule_over_the_readers_readings(models, tmp_path):
    out = str(tmp_path / "qa")
    qa(models, out, "--top_k", 3, "--no_answer_threshold", 0.5)
    predictions = json.load(open(f"{out}/predictions.json"))
    details = [json.loads(line) for line in open(f"{out}/details.jsonl")]
    reader = Reader(models[0], device="cpu")
    passages = {json.loads(line)["passage_id"]: json.loads(line) for line in open(f"{SAMPLE}/dpr_passages.jsonl")}
    assert len(details) == len(predictions) == 52
    for d in details:
        assert len(d["passages"]) == 3
        read = reader.answer([(d["question"], passages[p["passage_id"]]["text"]) for p in d["passages"]])
        by_hand = [{"passage_id": p["passage_id"], "text": r["nbest"][0]["text"] if r["nbest"] else "",
                    "score": r["score"], "null_minus_best": r["null_minus_best"]} for p, r in zip(d["passages"], read)]
        best = max(by_hand, key=lambda x: x["score"])  # the best span of any passage...
        abstain = min(x["null_minus_best"] for x in by_hand) > 0.5  # ...unless every null beats its span by > 0.5
        assert predictions[d["id"]]["answer"] == ("" if abstain else best["text"]), d["id"]
        if not abstain:
            assert predictions[d["id"]]["passage_id"] == best["passage_id"]
            assert math.isclose(predictions[d["id"]]["score"], best["score"], rel_tol=1e-6)
    results = json.load(open(f"{out}/eval_results.json"))
    assert [r["k"] for r in results["rows"]] == [1, 3] and results["threshold_source"] == "given"
    assert all({"f1", "exact", "HasAns_f1", "NoAns_f1", "recall", "questions_per_second"} <= r.keys()
               for r in results["rows"])


def test_one_rule_for_one_passage_or_many():
    spans = [{"passage_id": "a", "text": "x", "score": 2.0, "null_minus_best": 1.0},
             {"passage_id": "b", "text": "y", "score": 3.0, "null_minus_best": 0.2}]
    c = combine(spans)
    assert (c["text"], c["passage_id"], c["null_minus_best"]) == ("y", "b", 0.2)
    assert answer(c, 0.1) == "" and answer(c, 0.3) == "y" and answer(c, None) == "y"
    assert answer(combine([{"passage_id": "a", "text": "", "score": -math.inf, "null_minus_best": math.inf}]), 5) == ""


def test_a_retriever_that_ranks_the_gold_first_gives_the_readers_gold_paragraph_scores(models, tmp_path):
    """On the questions whose own paragraph BM25 ranks first, the system reading one passage reads exactly the gold
    paragraph: under the same rule and threshold its EM/F1 are the reader's gold-paragraph EM/F1."""
    from utils.retriever.bm25 import BM25

    corpus = [json.loads(line) for line in open(f"{SAMPLE}/dpr_passages.jsonl")]
    data = json.load(open(f"{SAMPLE}/dev.json"))
    bm25 = BM25(corpus)
    kept = 0
    for article in data["data"]:
        for paragraph in article["paragraphs"]:
            qas = [q for q in paragraph["qas"]
                   if corpus[int(bm25.search([q["question"]], 1)[1][0, 0])]["text"] == paragraph["context"]]
            kept += len(qas)
            paragraph["qas"] = qas
    assert kept > 30
    questions = tmp_path / "first.json"
    questions.write_text(json.dumps(data))
    out = str(tmp_path / "qa")
    qa(models, out, "--retriever", "bm25", "--questions", questions, "--eval_k", 1, "--no_answer_threshold", 0.0)
    results = json.load(open(f"{out}/eval_results.json"))
    row, gold = results["rows"][0], results["gold_paragraphs"]
    assert row["k"] == 1 and row["recall"] == 100.0
    assert (row["exact"], row["f1"], row["NoAns_f1"]) == (gold["exact"], gold["f1"], gold["NoAns_f1"])


def test_the_threshold_tuned_on_the_file_it_scores_is_called_an_upper_bound(models, tmp_path):
    out = str(tmp_path / "qa")
    proc = qa(models, out, "--validation_file", f"{SAMPLE}/dev.json")
    assert json.load(open(f"{out}/eval_results.json"))["threshold_source"] == "tuned on this very file: an upper bound"
    assert "tuned on this very file: an upper bound" in proc.stdout


def test_two_processes_give_the_same_predictions_as_one(models, tmp_path):
    one, two = str(tmp_path / "one"), str(tmp_path / "two")
    qa(models, one, "--no_answer_threshold", 0.0)
    proc = qa(models, two, "--no_answer_threshold", 0.0, launcher="ddp")
    assert "processes=2" in proc.stdout
    a, b = json.load(open(f"{one}/predictions.json")), json.load(open(f"{two}/predictions.json"))
    # each process batches its own share of the (question, passage) pairs, padded to other lengths: the scores agree
    # to float32 rounding, the answers and their passages exactly
    assert a.keys() == b.keys()
    for i in a:
        assert (a[i]["answer"], a[i]["passage_id"]) == (b[i]["answer"], b[i]["passage_id"]), i
        assert a[i]["score"] == pytest.approx(b[i]["score"], rel=1e-5, abs=1e-5), i


def test_bad_inputs_are_one_line_errors(models, tmp_path):
    reader, retriever = models
    base = ["--reader", reader, "--passages", f"{SAMPLE}/dpr_passages.jsonl", "--output_dir", tmp_path / "o"]
    no_ids = tmp_path / "q.jsonl"
    no_ids.write_text(json.dumps({"question": "Who?"}) + "\n")
    cases = [(["--retriever", str(tmp_path / "nowhere"), "--questions", f"{SAMPLE}/dev.json"], "nowhere: no such "
              "directory (give a retriever trained by train_dpr.py, or bm25)"),
             (["--retriever", reader, "--questions", f"{SAMPLE}/dev.json"], "not a retriever written by train_dpr.py"),
             (["--retriever", "bm25", "--questions", no_ids], "q.jsonl: line 1: question without an 'id'")]
    for extra, message in cases:
        assert_user_error(run_script("qa_system.py", *base, *extra, check=False), message)
    proc = run_script("qa_system.py", "--retriever", retriever, "--reader", retriever + "/query_encoder", "--passages",
                      f"{SAMPLE}/dpr_passages.jsonl", "--questions", f"{SAMPLE}/dev.json", "--output_dir",
                      tmp_path / "o2", check=False)
    assert_user_error(proc, "not a trained reader")

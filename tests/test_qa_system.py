"""The QA system end to end on the shipped sample: its answers follow the documented rule over the Reader API's
readings, a retriever that ranks the gold paragraph first reproduces the reader's gold-paragraph scores, several
processes answer as one, and bad inputs are one-line errors."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from benchmarks.qa_crossfit import readings_of
from conftest import ROOT, SAMPLE, as_from_a_shell, assert_user_error, run_script
from test_distributed import run_ddp
from tolerance import assert_answered_alike, assert_predictions_alike, assert_ranked_alike
from utils.errors import UserError
from utils.files.folds import cross_fit_folds
from utils.files.squad import load_questions
from utils.index.index import Index
from utils.reader.trained import Reader
from utils.search.bm25 import BM25
from utils.system.answer import at_share
from utils.system.measure import RETRIEVER_WEIGHTS, combined_at, crossfit, fit_calibration, tune, weight_grid
from utils.system.pipeline import QASystem


@pytest.fixture(scope="module")
def models(trained_models):
    """A tiny reader and a tiny retriever trained on the sample (fp32)."""
    return trained_models


def qa(models, out, *extra, launcher=None, check=True):
    reader, retriever = models
    args = ["--retriever", retriever, "--reader", reader, "--passages", f"{SAMPLE}/dpr_passages.jsonl",
            "--questions", f"{SAMPLE}/dev.json", "--output_dir", out, "--eval_k", 1, 3, *extra]
    return run_ddp("qa_system.py", *args) if launcher == "ddp" else run_script("qa_system.py", *args, check=check)


def test_answers_follow_the_rule_over_the_readers_readings(models, tmp_path):
    out = str(tmp_path / "qa")
    proc = qa(models, out, "--top_k", 3, "--no_answer_threshold", 0.5)
    # what it runs is said before the long part starts, and the reading (most of a run) shows its progress
    assert proc.stdout.lstrip().startswith("qa: retriever=") and "reading" in proc.stderr
    predictions = json.load(open(f"{out}/predictions.json"))
    details = [json.loads(line) for line in open(f"{out}/details.jsonl")]
    reader = Reader(models[0], device="cpu")
    passages = {json.loads(line)["passage_id"]: json.loads(line) for line in open(f"{SAMPLE}/dpr_passages.jsonl")}
    assert len(details) == len(predictions) == 52
    # predictions.json is what the official SQuAD v2 evaluation reads: id -> answer text
    assert all(isinstance(a, str) for a in predictions.values())
    for d in details:
        assert len(d["passages"]) == 3 and d["top_k"] == 3
        read = reader.answer([(d["question"], passages[p["passage_id"]]["text"]) for p in d["passages"]])
        by_hand = [{"passage_id": p["passage_id"], "text": r["nbest"][0]["text"] if r["nbest"] else "",
                    "score": r["score"], "null_minus_best": r["null_minus_best"], "nbest": r["nbest"]}
                   for p, r in zip(d["passages"], read)]
        best = max(by_hand, key=lambda x: x["score"])  # the best span of any passage...
        ratio = min(x["null_minus_best"] for x in by_hand)
        abstain = ratio > 0.5  # ...unless every null beats its span by > 0.5
        assert predictions[d["id"]] == d["answer"], d["id"]
        # read here in other batches than the run's: the rule's answer, up to near-ties
        assert_answered_alike(d, {"answer": "" if abstain else best["text"],
                                  "score": None if abstain else best["score"],
                                  "passage_id": None if abstain else best["passage_id"], "null_minus_best": ratio}, 0.5)
        if not d["answer"]:  # an abstention carries no passage and no score
            assert (d["passage_id"], d["score"], d["start"], d["end"]) == (None, None, None, None)
        else:  # where in its passage
            assert passages[d["passage_id"]]["text"][d["start"]:d["end"]] == d["answer"]
    results = json.load(open(f"{out}/eval_results.json"))
    assert [r["k"] for r in results["rows"]] == [1, 3] and results["threshold_source"] == "given"
    assert all({"f1", "exact", "HasAns_f1", "NoAns_f1", "recall", "questions_per_second"} <= r.keys()
               for r in results["rows"])


def test_the_api_answers_one_question_or_many_and_refuses_a_bad_k(models):
    qa = QASystem(models[1], models[0], passages=f"{SAMPLE}/dpr_passages.jsonl", device="cpu")
    question = "Who designed the Corran lighthouse?"
    one, many = qa.ask(question, k=3), qa.ask([question, "When was the loom built?"], k=3)
    assert isinstance(one, dict) and len(many) == 2 and len(one["passages"]) == 3
    assert qa.ask([question], k=3) == [one]  # a string is a list of one: the same computation, the same bits
    # batched with another question (other padding, other summation orders): alike up to near-ties
    assert_answered_alike(one, many[0])
    assert_ranked_alike([[(p["passage_id"], p["score"]) for p in one["passages"]]],
                        [[(p["passage_id"], p["score"]) for p in many[0]["passages"]]])
    if one["answer"]:
        hit = next(p for p in one["passages"] if p["passage_id"] == one["passage_id"])
        assert hit["text"][one["start"]:one["end"]] == one["answer"] and hit["title"] == one["title"]
    for k in (0, -1, 1.5):
        with pytest.raises(UserError, match="k must be a whole number of at least 1"):
            qa.ask(question, k=k)
    with pytest.raises(UserError, match="question #1: expected a non-empty string"):
        qa.ask([question, ""])
    assert len(qa.ask(question, k=100)["passages"]) == 33  # k beyond the corpus: every passage, no error


def test_a_retriever_that_ranks_the_gold_first_gives_the_readers_gold_paragraph_scores(models, tmp_path):
    """On the questions whose own paragraph BM25 ranks first, the system reading one passage reads exactly the gold
    paragraph: under the same rule and threshold its EM/F1 are the reader's gold-paragraph EM/F1."""
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


def test_the_threshold_tuned_on_the_file_it_scores_is_called_an_upper_bound_and_each_row_comes_cross_fitted(
        models, tmp_path):
    """The rows tuned on the file they score are an upper bound, said so; each also comes cross-fitted over two
    folds of whole articles, the weight chosen by the same rule within each: what benchmarks/qa_crossfit.py makes
    of the run's details.jsonl afterwards."""
    out = str(tmp_path / "qa")
    proc = qa(models, out, "--validation_file", f"{SAMPLE}/dev.json")
    results = json.load(open(f"{out}/eval_results.json"))
    assert results["threshold_source"].startswith("tuned on this very file: an upper bound")
    assert results["threshold_source"].endswith("the weight cross-fitted over two folds of its articles")
    assert "tuned on this very file: an upper bound" in proc.stdout
    assert all(r["retriever_weight"] in RETRIEVER_WEIGHTS for r in results["rows"])
    bench = run_script("benchmarks/qa_crossfit.py", "--run", out, "--questions", f"{SAMPLE}/dev.json", "--k",
                       *[row["k"] for row in results["rows"]], "--retriever_weight", "tune").stdout
    for row in results["rows"]:
        cells = next(line for line in bench.splitlines() if line.startswith(f"| {row['k']} |")).split(" | ")
        assert (cells[1], cells[2]) == (f"{row['f1']:.2f}", f"{row['crossfit']['f1']:.2f}")


def test_a_file_of_one_article_is_tuned_on_whole_and_no_row_claims_to_be_cross_fitted(models, tmp_path):
    """One article has no folds: the weight and threshold are tuned on it whole, the rows are an upper bound, and
    neither the source nor any row says they were cross-fitted."""
    document = json.load(open(f"{SAMPLE}/dev.json"))
    one = tmp_path / "one.json"
    one.write_text(json.dumps({**document, "data": document["data"][:1]}))
    out = str(tmp_path / "qa")
    qa(models, out, "--questions", one, "--validation_file", one)
    results = json.load(open(f"{out}/eval_results.json"))
    assert results["threshold_source"] == ("tuned on this very file: an upper bound (one article: no folds to "
                                           "cross-fit over); the weight tuned on it as a whole")
    assert not any("crossfit" in row for row in results["rows"])


def test_the_api_at_a_runs_settings_answers_as_the_run(models, tmp_path):
    """What a user copies from a run's row (serve.py --retriever_weight --no_answer_threshold) answers as it did."""
    out = str(tmp_path / "qa")
    qa(models, out, "--validation_file", f"{SAMPLE}/dev.json", "--retriever_weight", 4, "--top_k", 3)
    row = next(r for r in json.load(open(f"{out}/eval_results.json"))["rows"] if r["k"] == 3)
    assert row["retriever_weight"] == 4.0
    predictions = json.load(open(f"{out}/predictions.json"))
    questions = [q for a in json.load(open(f"{SAMPLE}/dev.json"))["data"] for p in a["paragraphs"] for q in p["qas"]]
    assert len(row["no_answer_calibration"]) == 3  # fitted with the threshold, with its share of unanswerable
    system = QASystem(models[1], models[0], passages=f"{SAMPLE}/dpr_passages.jsonl", device="cpu", retriever_weight=4.0,
                      calibration=row["no_answer_calibration"])
    asked = system.ask([q["question"] for q in questions], k=3, threshold=row["threshold"])
    details = {d["id"]: d for d in map(json.loads, open(f"{out}/details.jsonl"))}
    assert all(predictions[q["id"]] == details[q["id"]]["answer"] for q in questions)
    # the API reads in other batches than the run: the run's answers up to near-ties (at the tuned cut, too)
    assert_predictions_alike([{**a, "id": q["id"]} for q, a in zip(questions, asked)],
                             [details[q["id"]] for q in questions], row["threshold"])
    assert all(a["no_answer_probability"] == pytest.approx(details[q["id"]]["no_answer_probability"])
               for q, a in zip(questions, asked))
    unfused = QASystem(models[1], models[0], passages=f"{SAMPLE}/dpr_passages.jsonl", device="cpu")
    assert [a["answer"] for a in unfused.ask([q["question"] for q in questions], k=3, threshold=None)] != \
        [a["answer"] for a in system.ask([q["question"] for q in questions], k=3, threshold=None)]  # it weighs


def assert_crossfit_at_share(out, share, calibration=None):
    """Each row's cross-fitted score is at the same share as the row: each fold answered at the weight and threshold
    tuned on the other, the threshold moved to `share` by the calibration given, or else fitted there (by hand from
    details.jsonl's readings)."""
    readings, shared_norm = readings_of(f"{out}/details.jsonl")
    questions = load_questions(f"{SAMPLE}/dev.json", need_context=False)
    for row in json.load(open(f"{out}/eval_results.json"))["rows"]:
        def combined(qs, w, k=row["k"]):
            return combined_at([readings[q["id"]] for q in qs], k, shared_norm, w)

        def settle(others):
            weight, threshold = tune(others, lambda w: combined(others, w), weight_grid(), cross_fit_folds(others))
            a, b, fitted = calibration or fit_calibration(others, combined(others, weight))
            return weight, threshold if a <= 0 else at_share(threshold, (a, b, fitted), share)[0]
        expected = crossfit(cross_fit_folds(questions), settle, combined)[0]
        assert row["crossfit"] == {k: pytest.approx(expected[k]) for k in row["crossfit"]}


def test_the_share_moves_each_rows_cut_by_its_odds_and_the_api_given_it_answers_as_the_run(models, tmp_path):
    """--unanswerable_share S: each row's threshold moves from the one tuned on --validation_file by
    -(log_odds(S) - log_odds(fitted share)) / a (by hand from the row), the row is scored there (its predictions
    abstain exactly where the log ratio passes it), and QASystem given the row's settings and S answers as the run."""
    import math

    out = str(tmp_path / "qa")
    qa(models, out, "--validation_file", f"{SAMPLE}/dev.json", "--unanswerable_share", 0.9, "--top_k", 3)
    assert_crossfit_at_share(out, 0.9)
    given = str(tmp_path / "calibrated")  # a calibration given, whose slope moves every cut
    qa(models, given, "--validation_file", f"{SAMPLE}/dev.json", "--unanswerable_share", 0.9, "--top_k", 3,
       "--no_answer_calibration", 0.5, -1.0, 0.2)
    assert_crossfit_at_share(given, 0.9, (0.5, -1.0, 0.2))
    for row in json.load(open(f"{out}/eval_results.json"))["rows"]:
        a, b, fitted = row["no_answer_calibration"]  # fitted per k: this tiny reader's slope may come out negative
        if a > 0:
            moved = math.log(0.9 / 0.1) - math.log(fitted / (1 - fitted))
            assert row["threshold_at_share"] == pytest.approx(row["threshold"] - moved / a) and "not_moved" not in row
        else:  # its log ratio does not order the no-answers: nothing to move, and the row says why
            assert row["threshold_at_share"] == row["threshold"] and "slope A above 0" in row["not_moved"]
    # a calibration given (A B SHARE) with the threshold: moved by hand, to the middle of this reader's log ratios
    ratios = [d["null_minus_best"] for d in map(json.loads, open(f"{out}/details.jsonl"))]
    threshold = float(np.median([r for r in ratios if r is not None])) + (math.log(9) - math.log(0.25)) / 2.0
    out = str(tmp_path / "given")
    qa(models, out, "--no_answer_threshold", threshold, "--no_answer_calibration", 2.0, -1.0, 0.2,
       "--unanswerable_share", 0.9, "--top_k", 3)
    results = json.load(open(f"{out}/eval_results.json"))
    assert results["unanswerable_share"] == 0.9
    row = next(r for r in results["rows"] if r["k"] == 3)
    assert row["threshold"] == threshold and row["no_answer_calibration"] == [2.0, -1.0, 0.2]
    assert row["threshold_at_share"] == pytest.approx(threshold - (math.log(9) - math.log(0.25)) / 2.0)
    unmoved = str(tmp_path / "unmoved")  # what the share changed, beside each row: the run without it
    qa(models, unmoved, "--no_answer_threshold", threshold, "--top_k", 3)
    for r, u in zip(results["rows"], json.load(open(f"{unmoved}/eval_results.json"))["rows"]):
        assert r["at_threshold"] == {key: u[key] for key in ("exact", "f1", "HasAns_f1", "NoAns_f1")}
    details = [json.loads(line) for line in open(f"{out}/details.jsonl")]
    assert any(d["answer"] for d in details) and any(not d["answer"] for d in details)
    for d in details:  # abstains exactly where the log ratio passes the moved cut
        assert (d["answer"] == "") == (d["null_minus_best"] is None or d["null_minus_best"] > row["threshold_at_share"])
    system = QASystem(models[1], models[0], passages=f"{SAMPLE}/dpr_passages.jsonl", device="cpu",
                      retriever_weight=row["retriever_weight"], calibration=row["no_answer_calibration"],
                      unanswerable_share=0.9)
    asked = system.ask([d["question"] for d in details], k=3, threshold=row["threshold"])
    assert_predictions_alike([{**a, "id": d["id"]} for d, a in zip(details, asked)], details, row["threshold_at_share"])
    assert all(a["no_answer_probability"] == pytest.approx(d["no_answer_probability"]) for d, a in zip(details, asked))


def test_two_processes_give_the_same_predictions_as_one(models, tmp_path):
    one, two = str(tmp_path / "one"), str(tmp_path / "two")
    qa(models, one, "--no_answer_threshold", 0.0)
    proc = qa(models, two, "--no_answer_threshold", 0.0, launcher="ddp")
    assert "processes=2" in proc.stdout
    # each process batches its own share of the (question, passage) pairs, padded to other lengths: the scores agree
    # to float32 rounding, so the answers and their passages up to near-ties
    da, db = ([json.loads(line) for line in open(f"{d}/details.jsonl")] for d in (one, two))
    assert_predictions_alike(db, da, 0.0)
    for d, details in ((one, da), (two, db)):
        assert json.load(open(f"{d}/predictions.json")) == {x["id"]: x["answer"] for x in details}
    # at scale: an index built by 2 processes (one shard each), searched where it lies by 2 processes, each its
    # own shard: the same answers as one process embedding the corpus itself
    reader, retriever = models
    index, three = str(tmp_path / "index"), str(tmp_path / "three")
    run_ddp("index_corpus.py", "--retriever", retriever, "--passages", f"{SAMPLE}/dpr_passages.jsonl",
            "--output_dir", index, "--chunk_passages", 8)
    assert len(Index.load(index).shards) == 2
    run_ddp("qa_system.py", "--retriever", retriever, "--reader", reader, "--index", index, "--questions",
            f"{SAMPLE}/dev.json", "--output_dir", three, "--eval_k", 1, 3, "--no_answer_threshold", 0.0)
    dc = [json.loads(line) for line in open(f"{three}/details.jsonl")]
    assert_predictions_alike(dc, da, 0.0)


def test_bad_inputs_are_one_line_errors_before_anything_is_created(models, tmp_path):
    reader, retriever = models
    out = tmp_path / "o"
    base = ["--reader", reader, "--passages", f"{SAMPLE}/dpr_passages.jsonl", "--output_dir", out]
    no_ids = tmp_path / "q.jsonl"
    no_ids.write_text(json.dumps({"question": "Who?"}) + "\n")
    dev = f"{SAMPLE}/dev.json"
    cases = [(["--retriever", str(tmp_path / "nowhere"), "--questions", dev], "nowhere: no such "
              "directory (give a retriever trained by train_dpr.py, or bm25)"),
             (["--retriever", reader, "--questions", dev], "not a retriever written by train_dpr.py"),
             (["--retriever", "bm25", "--questions", no_ids], "q.jsonl: line 1: missing key 'id'"),
             (["--retriever", retriever, "--questions", dev, "--reader", str(tmp_path / "readr")],
              "readr: no such directory (give a reader trained by train_reader.py"),
             (["--retriever", retriever, "--questions", dev, "--reader", retriever],
              "a retriever written by train_dpr.py, not a reader (no config.json)"),
             (["--retriever", retriever, "--questions", dev, "--reader", retriever + "/query_encoder"],
              "not a trained reader: its weights hold no question-answering head"),
             (["--retriever", "bm25", "--questions", dev, "--max_questions", 0], "--max_questions must be at least 1"),
             (["--retriever", "bm25", "--questions", dev, "--max_questions", -50],
              "--max_questions must be at least 1"),
             (["--retriever", "bm25", "--questions", dev, "--output_dir", reader], f"holds --reader {reader}"),
             (["--retriever", "bm25", "--questions", dev, "--unanswerable_share", 0.5],
              "give the calibration with the share of unanswerable questions it was fitted on"),
             (["--retriever", "bm25", "--questions", dev, "--validation_file", dev, "--unanswerable_share", 1],
              "unanswerable_share 1.0: give the expected share of unanswerable questions, strictly between 0 and 1"),
             (["--retriever", "bm25", "--questions", dev, "--no_answer_calibration", 1, 2, 3, 4],
              "calibration (1.0, 2.0, 3.0, 4.0): give A B or A B SHARE")]
    for extra, message in cases:
        assert_user_error(run_script("qa_system.py", *base, *extra, check=False), message)
        assert not out.exists() and not [n for n in os.listdir(tmp_path) if n.startswith(".")], extra


def test_k_beyond_the_corpus_is_read_at_its_size_and_said_so(models, tmp_path):
    out = tmp_path / "qa"
    proc = qa(models, out, "--retriever", "bm25", "--eval_k", 1, 50, 100, "--top_k", 40, "--max_questions", 4)
    assert "k = 40, 50, 100 beyond the 33 passages of the corpus: read at 33" in proc.stdout
    results = json.load(open(out / "eval_results.json"))
    assert [r["k"] for r in results["rows"]] == [1, 33] and "read at 33" in results["k_note"]
    assert all(d["top_k"] == 33 and len(d["passages"]) == 33 for d in map(json.loads, open(out / "details.jsonl")))


def test_a_second_run_into_the_same_output_dir_is_refused_and_an_overwrite_keeps_nothing_of_the_first(models, tmp_path):
    out = tmp_path / "qa"
    qa(models, out, "--top_k", 1)  # dense: writes index/
    before = (out / "predictions.json").read_text()
    proc = qa(models, out, "--retriever", "bm25", "--max_questions", 8, check=False)
    assert_user_error(proc, f"{out} holds the outputs of an earlier run (by qa_system.py)")
    assert (out / "predictions.json").read_text() == before and (out / "index").is_dir()
    qa(models, out, "--retriever", "bm25", "--max_questions", 8, "--overwrite_output_dir")
    assert len(json.load(open(out / "predictions.json"))) == 8
    assert sorted(os.listdir(out)) == [".qa-amp.json", "details.jsonl", "eval_results.json", "predictions.json"]
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".")]  # no staging directory left
    # an evaluation directory of the reader's is no place for the system's outputs either, nor the reverse
    evaluated = tmp_path / "reader-eval"
    run_script("train_reader.py", "--model_name_or_path", models[0], "--do_train", "false", "--validation_file",
               f"{SAMPLE}/dev.json", "--output_dir", evaluated)
    assert (evaluated / "null_scores.json").is_file()
    assert_user_error(qa(models, evaluated, "--retriever", "bm25", check=False),
                      f"{evaluated} holds the outputs of an earlier run (by train_reader.py)")
    assert_user_error(run_script("train_reader.py", "--model_name_or_path", models[0], "--do_train", "false",
                                 "--predict_file", f"{SAMPLE}/dev.json", "--output_dir", out, check=False),
                      f"{out} holds the outputs of an earlier run (by qa_system.py)")
    # with --overwrite_output_dir the reader's prediction run replaces the evaluation: no stale null_scores.json
    run_script("train_reader.py", "--model_name_or_path", models[0], "--do_train", "false", "--predict_file",
               f"{SAMPLE}/dev.json", "--output_dir", evaluated, "--overwrite_output_dir")
    assert sorted(os.listdir(evaluated)) == [".qa-amp.json", "nbest.json", "predict_results.json", "predictions.json"]


def test_questions_without_answers_or_contexts_are_answered_and_every_question_needs_an_id(models, tmp_path):
    data = json.load(open(f"{SAMPLE}/dev.json"))
    for article in data["data"]:
        for paragraph in article["paragraphs"]:
            for q in paragraph["qas"]:
                q.pop("answers"), q.pop("is_impossible", None)
    unlabelled = tmp_path / "unlabelled.json"
    unlabelled.write_text(json.dumps(data))
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"id": f"r{i}", "question": q["question"], "context": p["context"]}) + "\n"
                            for i, (q, p) in enumerate((q, p) for a in data["data"] for p in a["paragraphs"]
                                                       for q in p["qas"])))
    for questions in (unlabelled, rows):
        out = tmp_path / questions.stem
        qa(models, out, "--retriever", "bm25", "--questions", questions, "--max_questions", 5)
        results = json.load(open(out / "eval_results.json"))
        assert len(json.load(open(out / "predictions.json"))) == 5 and "f1" not in results["rows"][0]
    data["data"][0]["paragraphs"][0]["qas"][1].pop("id")
    no_id = tmp_path / "no-id.json"
    no_id.write_text(json.dumps(data))
    title = data["data"][0]["title"]
    for script, flag in (("qa_system.py", "--questions"), ("train_reader.py", "--predict_file")):
        extra = (["--retriever", "bm25", "--reader", models[0], "--passages", f"{SAMPLE}/dpr_passages.jsonl"]
                 if script == "qa_system.py" else ["--model_name_or_path", models[0], "--do_train", "false"])
        proc = run_script(script, *extra, flag, no_id, "--output_dir", tmp_path / "x", check=False)
        assert_user_error(proc, f"no-id.json: article '{title}' paragraph 0 question 1: missing key 'id'")


def test_the_precision_reaches_both_models_and_each_output_says_what_ran(models, tmp_path):
    out, as_trained = tmp_path / "bf16", tmp_path / "as-trained"
    qa(models, out, "--mixed_precision", "bf16", "--max_questions", 4)
    qa(models, as_trained, "--max_questions", 4)
    results = json.load(open(out / "eval_results.json"))
    assert results["precision"] == {"reader": "bf16", "retriever": "bf16", "index": "bf16"}
    assert json.load(open(out / "index" / "index.json"))["precision"] == "bf16"
    bf16, fp32 = (np.asarray(Index.load(str(d / "index")).shards[0].embeddings) for d in (out, as_trained))
    assert not np.array_equal(bf16, fp32) and np.allclose(bf16, fp32, atol=0.05)  # embedded under bf16 autocast
    assert json.load(open(as_trained / "eval_results.json"))["precision"] == {"reader": "no", "retriever": "no",
                                                                              "index": "no"}


def test_ctrl_c_is_one_line_and_leaves_nothing_behind(models, tmp_path):
    out = tmp_path / "qa"
    reader, retriever = models
    cmd = [sys.executable, os.path.join(ROOT, "qa_system.py"), "--retriever", retriever, "--reader", reader,
           "--passages", f"{SAMPLE}/dpr_passages.jsonl", "--questions", f"{SAMPLE}/dev.json", "--output_dir", str(out),
           "--eval_k", "33", "--batch_size", "1"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"}, preexec_fn=as_from_a_shell)
    staging = tmp_path / ".qa.publishing"
    deadline = time.time() + 120
    while not (staging / "index" / "index.json").exists() and time.time() < deadline:  # indexed: now reading
        time.sleep(0.02)
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr[-2000:]
    assert "Traceback" not in stderr and stderr.strip().splitlines()[-1] == "interrupted: nothing was written"
    assert not out.exists() and os.listdir(tmp_path) == []

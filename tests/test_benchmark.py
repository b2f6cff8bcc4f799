"""The benchmarks run end to end (tiny model, sample data) and write their tables."""

import csv
import json

from conftest import SAMPLE, run_script


def test_benchmark_writes_table_csv_and_plot(tiny_bert_dir, tmp_path):
    out = tmp_path / "results"
    run_script("benchmarks/amp_benchmark.py", "--model", tiny_bert_dir, "--steps", 4, "--dpr_steps", 3,
               "--warmup_steps", 1, "--batch_size", 8, "--batching_modes", "--out", out,
               "--squad_train", f"{SAMPLE}/train.json", "--squad_dev", f"{SAMPLE}/dev.json",
               "--dpr_train", f"{SAMPLE}/dpr_train.json", "--dpr_dev", f"{SAMPLE}/dpr_dev.json",
               "--dpr_passages", f"{SAMPLE}/dpr_passages.jsonl")
    rows = list(csv.DictReader(open(out / "amp_cpu.csv")))
    assert [(r["task"], r["precision"], r["mode"]) for r in rows] == [
        ("reader", "no", ""), ("reader", "bf16", ""), ("dpr", "no", ""), ("dpr", "bf16", ""),
        ("reader", "bf16", "pad to max_seq_length"), ("reader", "bf16", "pad to batch max"),
        ("reader", "bf16", "length-grouped")]
    assert [int(r["steps"]) for r in rows] == [4, 4, 3, 3, 4, 4, 4]
    for r in rows:
        assert float(r["samples_per_s"]) > 0 and float(r["peak_memory_mb"]) > 0
    padded, grouped = rows[4], rows[6]
    assert float(padded["tokens_per_s"]) > 0 and float(grouped["tokens_per_s"]) > 0
    md = (out / "amp_cpu.md").read_text()
    assert md.startswith("Machine: ") and "| task |" in md
    assert (out / "amp_cpu.png").read_bytes()[:4] == b"\x89PNG"


def test_dpr_vs_sentence_transformers_benchmark_runs_both_sides(tiny_bert_dir, tmp_path):
    out = tmp_path / "results"
    proc = run_script("benchmarks/dpr_vs_st.py", "--model", tiny_bert_dir, "--questions", 32, "--batch_size", 8,
                      "--precision", "no", "--out", out, "--train_file", f"{SAMPLE}/dpr_train.json",
                      "--dev_file", f"{SAMPLE}/dpr_dev.json", "--passages", f"{SAMPLE}/dpr_passages.jsonl")
    md = (out / "dpr_vs_st_cpu.md").read_text()
    rows = [line for line in md.splitlines() if line.startswith(("| sentence-transformers", "| train_dpr.py"))]
    assert len(rows) == 2 and all(r.split(" | ")[1] == "4" for r in rows), md  # 32 questions / 8: 4 updates each
    assert "speed ratio (train_dpr.py / sentence-transformers):" in md and "speed ratio" in proc.stdout


def test_the_crossfit_rescoring_reads_passages_without_a_span(tmp_path):
    """details.jsonl writes a passage without a span with null scores (strict JSON has no -inf): read back, they
    are the -inf span and +inf null score qa_system.py computed, not a crash."""
    import json

    from utils.files.squad import load_questions

    questions = load_questions(f"{SAMPLE}/dev.json")
    run = tmp_path / "qa"
    run.mkdir()
    with open(run / "details.jsonl", "w") as f:
        for i, q in enumerate(questions):
            answer = q["answers"]["text"][0] if q["answers"]["text"] else "nothing"
            passages = [{"passage_id": "a", "score": 1.0, "span": "", "span_score": None, "null_score": None},
                        {"passage_id": "b", "score": 0.5, "span": answer, "span_score": 2.0 + i % 3,
                         "null_score": 1.0 + i % 5}]
            f.write(json.dumps({"id": q["id"], "passages": passages}) + "\n")
    proc = run_script("benchmarks/qa_crossfit.py", "--run", run, "--questions", f"{SAMPLE}/dev.json", "--k", 1, 2)
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| 1 |") or line.startswith("| 2 |")]
    assert len(rows) == 2
    assert rows[0].split(" | ")[1] == "15.38"  # k = 1: no span anywhere, every question abstains (8 of 52 right)


def test_the_crossfit_rescoring_tunes_on_whole_articles_and_refuses_a_file_of_one(tmp_path):
    """The halves hold whole articles (utils.files.folds: each, in file order, to the half with fewer questions so
    far; the sample's three all hold unanswerable questions), so what is tuned on one half is scored on articles it
    never saw; a file of one article has no second half."""
    import json

    from conftest import assert_user_error

    from utils.files.squad import load_questions

    run = tmp_path / "qa"
    _write_details(run, load_questions(f"{SAMPLE}/dev.json"), lambda i, answer: [
        {"passage_id": "a", "score": 1.0, "span": answer, "span_score": 2.0 + i % 3, "null_score": 1.0 + i % 5}])
    sizes = [sum(len(p["qas"]) for p in a["paragraphs"]) for a in json.load(open(f"{SAMPLE}/dev.json"))["data"]]
    halves = [0, 0]
    for n in sizes:  # by hand: the rule above
        halves[int(halves[1] < halves[0])] += n
    proc = run_script("benchmarks/qa_crossfit.py", "--run", run, "--questions", f"{SAMPLE}/dev.json", "--k", 1)
    assert (f"halves of {halves[0]} / {halves[1]} questions ({len(sizes)} articles, each whole in one half)"
            in proc.stdout)
    one = json.load(open(f"{SAMPLE}/dev.json"))
    one["data"] = one["data"][:1]
    (tmp_path / "one.json").write_text(json.dumps(one))
    proc = run_script("benchmarks/qa_crossfit.py", "--run", run, "--questions", tmp_path / "one.json", "--k", 1,
                      check=False)
    assert_user_error(proc, "1 article(s): 2 folds of whole articles need at least 2")
    assert "| 1 |" not in proc.stdout


def test_the_crossfit_rescoring_measures_the_shift_and_the_calibration_of_a_shared_reader(tmp_path):
    """A reader trained with shared normalization: its probability of no answer is the same 0.3 for every question
    here, so its calibration against the labels is known by hand (expected calibration error |0.3 - share|, Brier
    share * 0.7^2 + (1 - share) * 0.3^2), and the shifted score is the mean of HasAns and NoAns F1."""
    import json
    import math

    from utils.files.squad import load_questions

    questions = load_questions(f"{SAMPLE}/dev.json")
    share = sum(not q["answers"]["text"] for q in questions) / len(questions)
    run = tmp_path / "qa"
    run.mkdir()
    with open(run / "details.jsonl", "w") as f:
        for q in questions:
            answer = q["answers"]["text"][0] if q["answers"]["text"] else "nothing"
            passage = {"passage_id": "a", "score": 1.0, "span": answer, "span_score": 2.0, "null_score": 0.0,
                       "null_start": math.log(0.3), "null_end": math.log(0.3), "lse_start": 0.0, "lse_end": 0.0,
                       "nbest": [{"text": answer, "score": 2.0}]}
            f.write(json.dumps({"id": q["id"], "rule": "question", "passages": [passage]}) + "\n")
    proc = run_script("benchmarks/qa_crossfit.py", "--run", run, "--questions", f"{SAMPLE}/dev.json", "--k", 1,
                      "--abstain_on", "probability")
    line = next(x for x in proc.stdout.splitlines() if x.startswith("k=1: P(no answer)"))
    assert f"expected calibration error {abs(0.3 - share):.3f}" in line
    assert f"Brier {share * 0.49 + (1 - share) * 0.09:.3f}" in line and \
        f"mean P 0.300 for a share of {share:.3f}" in line
    row = next(x for x in proc.stdout.splitlines() if x.startswith("| 1 |")).split(" | ")
    # one probability for all: a tuned threshold answers every question (every answer right: F1 100 on HasAns, 0 on
    # NoAns) or abstains on all; reweighted to half unanswerable either way scores 50
    assert row[-2].split(", ")[-1] == "50.00"  # (the last column: the retriever weights tuned)


def _write_details(run, questions, passages_of):
    import json

    run.mkdir()
    with open(run / "details.jsonl", "w") as f:
        for i, q in enumerate(questions):
            answer = q["answers"]["text"][0] if q["answers"]["text"] else "nothing"
            f.write(json.dumps({"id": q["id"], "passages": passages_of(i, answer)}) + "\n")


def test_the_crossfit_rescoring_of_questions_that_all_have_an_answer_fits_no_threshold_and_no_calibration(tmp_path):
    """SQuAD v1.1 data: a half without an unanswerable question has nothing to tune a no-answer threshold or fit a
    calibration on. Its threshold is None (the other half answers every question, as a SQuAD v1.1 reader does), the
    calibration is reported as not fitted, and the run is scored, not a math domain error."""
    import json

    from utils.files.squad import load_questions

    squad = json.load(open(f"{SAMPLE}/dev.json"))
    for article in squad["data"]:
        for p in article["paragraphs"]:
            p["qas"] = [qa for qa in p["qas"] if qa["answers"] and not qa.get("is_impossible")]
        article["paragraphs"] = [p for p in article["paragraphs"] if p["qas"]]
    v1 = tmp_path / "v1.json"
    v1.write_text(json.dumps(squad))
    questions = load_questions(str(v1))
    assert questions and all(q["answers"]["text"] for q in questions)
    run = tmp_path / "qa"
    # the first passage holds the right answer, read less surely than its no-answer for some questions
    _write_details(run, questions, lambda i, answer: [
        {"passage_id": "a", "score": 1.0, "span": answer, "span_score": 2.0 + i % 3, "null_score": 1.0 + i % 5},
        {"passage_id": "b", "score": 0.5, "span": "nothing", "span_score": 0.0, "null_score": 3.0}])
    proc = run_script("benchmarks/qa_crossfit.py", "--run", run, "--questions", v1, "--k", 1, 2)
    row = next(x for x in proc.stdout.splitlines() if x.startswith("| 1 |")).split(" | ")
    assert row[1] == row[2] == "100.00"  # every question answered, and rightly: upper bound and cross-fitted
    assert "no unanswerable question" in proc.stdout
    assert "k=1: calibrated P(no answer) not fitted" in proc.stdout


def test_the_crossfit_rescoring_refuses_a_k_beyond_the_passages_the_run_read(tmp_path):
    """A k above the run's largest would be scored with the passages there are, under the k asked for."""
    from conftest import assert_user_error

    from utils.files.squad import load_questions

    run = tmp_path / "qa"
    _write_details(run, load_questions(f"{SAMPLE}/dev.json"), lambda i, answer: [
        {"passage_id": "a", "score": 1.0, "span": answer, "span_score": 2.0, "null_score": 1.0},
        {"passage_id": "b", "score": 0.5, "span": "nothing", "span_score": 0.0, "null_score": 3.0}])
    proc = run_script("benchmarks/qa_crossfit.py", "--run", run, "--questions", f"{SAMPLE}/dev.json", "--k", 1, 3,
                      check=False)
    assert_user_error(proc, "--k 3")
    assert "2 passages" in proc.stderr and "| 1 |" not in proc.stdout


def test_feedback_benchmark_posts_labels_beside_questions_and_checks_each_is_stored(trained_models, tmp_path):
    reader, _ = trained_models
    run_script("benchmarks/feedback_benchmark.py", "--reader", reader, "--passages", f"{SAMPLE}/dpr_passages.jsonl",
               "--questions", f"{SAMPLE}/dev.json", "--clients", 2, "--labels", 3, "--askers", 2, "--alone_seconds", 1,
               "--out", tmp_path)
    result = json.loads((tmp_path / "feedback_cpu.json").read_text())
    for store in ("sqlite", "postgresql"):
        row = result[store]
        assert row["labels_sent"] == row["answered_201"] == row["labels_stored"] == 6 and row["stored_are_the_sent"]
        assert row["feedback"]["n"] == 6 and row["ask_alone"]["n"] >= 2

"""Answers that learn from their users, measured: a simulated user labels a server's answers on documents the reader
never saw, the reader is fine-tuned on the labels, and the QA system is measured on the questions never labelled.

    python benchmarks/feedback_loop_benchmark.py --reader outputs/reader --labels 50 100 200 400 --seeds 42 1 \
        --work /tmp/feedback-loop -- --num_train_epochs 2 --learning_rate 3e-5

The documents: the articles of --labelled (default the shared train_extra split) rendered as HTML pages
(documents_benchmark.render), ingested (ingest_documents.py) and indexed for BM25 (index_corpus.py). For each seed,
serve.py serves them with --reader and a store of its own, and the user (`simulated_user`) asks the articles'
questions in an order drawn by the seed through POST /ask (k = --k) and answers through POST /feedback: where a gold
answer is in a passage shown it selects it there (verdict span), where the question has no answer it clicks "no
passage shown answers it" (no_answer), otherwise "wrong"; until max(--labels) labels. export_feedback.py writes the
store out; the first N labels of it, for each N of --labels, fine-tune the reader (scripts/finetune_on_labels.py,
the flags after `--` to train_reader.py; each N for every seed before the next N, the result file written after
each), and qa_system.py (BM25, k = --k) answers the questions never asked in that seed (the same documents) and
--test (other documents, over --test_corpus). Three rows per N and seed, each F1 (of all questions, of the
answerable, of the unanswerable, and of the answerable where the reader answers every question) from qa_system.py's
details.jsonl at a threshold: the reader as it was (its recorded threshold), the reader as it was at the threshold
tuned on the N labels (what calibration alone gives), the fine-tuned reader. Writes feedback_loop_cpu.json to --out.
"""

import argparse
import http.client
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(ROOT, "..", "shared", "data")
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

from conftest import free_port  # noqa: E402
from documents_benchmark import articles, render  # noqa: E402
from feedback_benchmark import call  # noqa: E402
from result_file import write_result  # noqa: E402
from serve_benchmark import ready  # noqa: E402

from utils.files.jsonfiles import write_json_file  # noqa: E402
from utils.files.squad import load_squad, squad_document  # noqa: E402
from utils.reader.decoding import abstains  # noqa: E402
from utils.reader.metrics import squad_metrics  # noqa: E402
from utils.reader.trained import ReaderSettings  # noqa: E402


def run(*cmd):
    proc = subprocess.run([sys.executable, *map(str, cmd)], cwd=ROOT, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"{' '.join(map(str, cmd))} exited {proc.returncode}: {proc.stderr[-3000:]}")
    return proc.stdout


def gold_span(answer: dict, golds: list[str]):
    """(passage index, start, end) of the first gold answer found in a passage shown, in the order shown."""
    for i, p in enumerate(answer["passages"]):
        for g in golds:
            at = p["text"].find(g) if g else -1
            if at >= 0:
                return i, at, at + len(g)
    return None


def simulated_user(port: int, questions: list[dict], wanted: int, k: int) -> dict:
    """Asks `questions` in order and labels each answer as a user who knows the gold answer would, until `wanted`
    labels (a "wrong" is none): {"asked": ids, "verdicts": counts}."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    asked, verdicts, labels = [], {}, 0
    for q in questions:
        if labels >= wanted:
            break
        status, body = call(conn, "POST", "/ask", {"question": q["question"], "k": k})
        assert status == 200, body
        a = body["answers"][0]
        ids = [p["passage_id"] for p in a["passages"]]
        feedback = {"question": q["question"], "passages": [{"passage_id": p["passage_id"], "position": p["position"]}
                                                            for p in a["passages"]],
                    "index_version": a["index_version"], "reader": a["settings"]["reader"], "answer": a["answer"],
                    "answer_passage": ids.index(a["passage_id"]) if a["answer"] else None}
        golds = q["answers"]["text"]
        found = gold_span(a, golds) if golds else None
        if not golds:
            feedback["verdict"] = "no_answer"
        elif found:
            i, start, end = found
            feedback.update(verdict="span", span={"passage": i, "start": start, "end": end,
                                                  "text": a["passages"][i]["text"][start:end]})
        else:
            feedback["verdict"] = "wrong"
        status, stored = call(conn, "POST", "/feedback", feedback)
        assert status == 201, stored
        asked.append(q["id"])
        verdicts[feedback["verdict"]] = verdicts.get(feedback["verdict"], 0) + 1
        labels += feedback["verdict"] != "wrong"
    return {"asked": asked, "verdicts": verdicts, "labels": labels}


def answers_at(details: str, threshold) -> dict:
    """{id: answer} of a qa_system.py run's details.jsonl at `threshold`: the best span over the passages read (the
    first on equal scores), "" where null minus best is above the threshold."""
    out = {}
    with open(details, encoding="utf-8") as f:
        for line in f:
            d = json.loads(line)
            read = d["passages"][:d["top_k"]]  # the run reads (and measures) more: the answer is of its k
            best = max(read, key=lambda p: p["span_score"] if p["span"] else float("-inf"), default=None)
            span = best["span"] if best and best["span"] else ""
            margin = float("inf") if d["null_minus_best"] is None else d["null_minus_best"]  # None: no span read
            out[d["id"]] = "" if abstains(margin, threshold) else span
    return out


def check_rethresholded(details: str, threshold) -> None:
    """answers_at at the run's own threshold gives the run's answers: the rows at other thresholds are the run's."""
    with open(details, encoding="utf-8") as f:
        given = {d["id"]: d["answer"] for d in map(json.loads, f)}
    mine = answers_at(details, threshold)
    wrong = [q for q in given if given[q] != mine[q]]
    assert not wrong, f"{details}: {len(wrong)} answers not as the run gave them, e.g. {wrong[:3]}"


def f1_at(questions_file: str, details: str, threshold) -> dict:
    """F1 of a run's answers at `threshold`: of all questions, of the answerable ones, of the unanswerable ones; and
    of the answerable ones where the reader answers every question (its spans apart from its threshold)."""
    refs = {ex["id"]: ex["answers"]["text"] for ex in load_squad(questions_file)[0]}
    m = squad_metrics(refs, answers_at(details, threshold))
    spans = squad_metrics(refs, answers_at(details, float("inf")))
    return {"f1": round(m["f1"], 2), "answerable": round(m.get("HasAns_f1", 0.0), 2),
            "unanswerable": round(m.get("NoAns_f1", 0.0), 2),
            "answerable_answering_all": round(spans.get("HasAns_f1", 0.0), 2)}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--reader", required=True)
    p.add_argument("--labelled", default=os.path.join(SHARED, "squad", "train_extra.json"))
    p.add_argument("--test", default=os.path.join(SHARED, "squad", "test.json"))
    p.add_argument("--test_corpus", nargs="+", default=[os.path.join(SHARED, "dpr", "passages.jsonl"),
                                                        os.path.join(SHARED, "dpr", "test_passages.jsonl")])
    p.add_argument("--labels", type=int, nargs="+", default=[50, 100, 200, 400])
    p.add_argument("--seeds", type=int, nargs="+", default=[42, 1])
    p.add_argument("--k", type=int, default=5)
    p.add_argument("--folds", type=int, default=5)
    p.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "feedback-loop"))
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
    args, train_flags = p.parse_known_args()
    train_flags = [a for a in train_flags if a != "--"]
    mark = os.path.join(args.work, ".feedback-loop-benchmark")  # in --work: this benchmark wrote what it holds
    if os.path.exists(args.work) and os.listdir(args.work) and not os.path.exists(mark):
        raise SystemExit(f"--work {args.work} holds files this benchmark did not write: give an empty or new directory")
    shutil.rmtree(args.work, ignore_errors=True)
    os.makedirs(args.work)
    open(mark, "w").close()
    w = lambda *names: os.path.join(args.work, *names)  # noqa: E731
    t0 = time.time()
    # --- the user's documents, ingested and indexed; the other documents' corpus -------------------------------
    render(articles(args.labelled), w("docs"), scan_dpi=None)
    run("ingest_documents.py", "--documents", w("docs", "html"), "--output", w("corpus.jsonl"))
    run("index_corpus.py", "--retriever", "bm25", "--passages", w("corpus.jsonl"), "--output_dir", w("index"))
    with open(w("test_corpus.jsonl"), "wb") as out:
        for part in args.test_corpus:
            with open(part, "rb") as f:
                shutil.copyfileobj(f, out)
    examples = load_squad(args.labelled)[0]
    settings = ReaderSettings.load(args.reader) or ReaderSettings()
    recorded = settings.null_threshold
    # a reader that reads with shared normalization trains further with the corpus its other passages come from
    corpus = ["--passages", w("corpus.jsonl")] if settings.passages_per_question > 1 else []

    def qa(reader, questions, corpus, name):
        where = ["--index", w("index")] if corpus == "index" else ["--passages", corpus]
        run("qa_system.py", "--retriever", "bm25", "--reader", reader, *where, "--questions", questions, "--k", args.k,
            "--eval_k", args.k, "--output_dir", w(name))
        return w(name, "details.jsonl")

    base_test = qa(args.reader, args.test, w("test_corpus.jsonl"), "qa-test-base")
    check_rethresholded(base_test, recorded)
    result = {"reader": args.reader, "k": args.k, "train_flags": train_flags, "seeds": {}}
    # --- each seed's user labels the server's answers; the questions never asked read by the reader as it was ----
    users = {}
    for seed in args.seeds:
        order = examples[:]
        random.Random(seed).shuffle(order)
        port = free_port()
        log = open(w(f"serve-{seed}.log"), "w")
        proc = subprocess.Popen([sys.executable, "serve.py", "--retriever", "bm25", "--reader", args.reader, "--index",
                                 w("index"), "--port", str(port), "--feedback_db", w(f"feedback-{seed}.sqlite")],
                                cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        try:
            ready(proc, port, 600, log.name)
            user = simulated_user(port, order, max(args.labels), args.k)
        finally:
            proc.terminate()
            proc.wait(timeout=120)
        run("export_feedback.py", "--feedback_db", w(f"feedback-{seed}.sqlite"), "--output_dir", w(f"labels-{seed}"))
        exported = load_squad(w(f"labels-{seed}", "squad.json"))[0]
        asked = set(user["asked"])
        held = [ex for ex in examples if ex["id"] not in asked]
        write_json_file(w(f"heldout-{seed}.json"), squad_document(held))
        base_held = qa(args.reader, w(f"heldout-{seed}.json"), "index", f"qa-held-{seed}-base")
        users[seed] = exported, base_held
        rows = {"0": {"held_out": {"reader": f1_at(w(f"heldout-{seed}.json"), base_held, recorded)},
                      "test": {"reader": f1_at(args.test, base_test, recorded)}}}
        result["seeds"][str(seed)] = {"user": {k: v for k, v in user.items() if k != "asked"}, "asked": len(asked),
                                      "held_out_questions": len(held), "rows": rows}
    # --- each number of labels, in the order given, for every seed: the result written after each point --------
    for n in args.labels:
        for seed in args.seeds:
            exported, base_held = users[seed]
            keep = set(sorted({int(ex["id"].split("-")[1]) for ex in exported})[:n])  # feedback-<label id>
            subset = [ex for ex in exported if int(ex["id"].split("-")[1]) in keep]
            write_json_file(w(f"labels-{seed}-{n}.json"), squad_document(subset))
            tuned = w(f"reader-{seed}-{n}")
            run("scripts/finetune_on_labels.py", "--reader", args.reader, "--labels", w(f"labels-{seed}-{n}.json"),
                "--output_dir", tuned, "--folds", args.folds, "--", *corpus, "--seed", seed, *train_flags)
            report = json.load(open(os.path.join(tuned, "finetune.json")))
            fine_held = qa(tuned, w(f"heldout-{seed}.json"), "index", f"qa-held-{seed}-{n}")
            fine_test = qa(tuned, args.test, w("test_corpus.jsonl"), f"qa-test-{seed}-{n}")
            threshold = report["threshold"]
            calibration = report["reader_as_it_was_threshold_on_the_labels"]
            rows = result["seeds"][str(seed)]["rows"]
            rows[str(n)] = {
                "held_out": {"reader": rows["0"]["held_out"]["reader"],
                             "reader_threshold_on_labels": f1_at(w(f"heldout-{seed}.json"), base_held, calibration),
                             "fine_tuned": f1_at(w(f"heldout-{seed}.json"), fine_held, threshold)},
                "test": {"reader": rows["0"]["test"]["reader"],
                         "reader_threshold_on_labels": f1_at(args.test, base_test, calibration),
                         "fine_tuned": f1_at(args.test, fine_test, threshold)},
                "out_of_fold": report["out_of_fold"], "labels": len(keep)}
            print(seed, n, json.dumps(rows[str(n)]), flush=True)
            result["seconds"] = round(time.time() - t0)
            write_result(args.out, "feedback_loop_cpu.json", result, show=False)  # a run cut short keeps its points
    result["seconds"] = round(time.time() - t0)
    write_result(args.out, "feedback_loop_cpu.json", result)


if __name__ == "__main__":
    main()

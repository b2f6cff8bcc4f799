"""Feedback under load: clients posting labels while others ask, on each store (a SQLite file, a PostgreSQL server).

    python benchmarks/feedback_benchmark.py --reader outputs/reader --passages ../shared/data/dpr/passages.jsonl \
        --questions ../shared/data/squad/dev.json

For each store the benchmark starts serve.py (--retriever, default BM25) as its own process on a free local port with
a new --feedback_db (a SQLite file in a temporary folder; a throwaway PostgreSQL server, tests/postgres.py), gets the
answers to --asked questions (k = --k; labelled again in turn where --clients x --labels is more), then runs two
phases, each client a thread with its own keep-alive connection: --askers clients asking one question a request,
alone (the /ask latency without feedback); then the same askers while --clients clients post --labels labels each,
as the page sends them (a span where the answer was given, no_answer where it abstained, every fifth wrong), as fast
as answered. Checked: every label answered 201, and the store lists exactly the labels sent, each once. Writes
feedback_cpu.json to --out.
"""

import argparse
import http.client
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

from conftest import free_port  # noqa: E402
from postgres import Postgres  # noqa: E402
from result_file import write_result  # noqa: E402
from serve_benchmark import ready  # noqa: E402

from utils.files.squad import load_questions  # noqa: E402


def start(args, port: int, feedback_db: str, log_path: str):
    cmd = [sys.executable, os.path.join(ROOT, "serve.py"), "--retriever", args.retriever, "--reader", args.reader,
           "--passages", args.passages, "--port", str(port), "--feedback_db", feedback_db, "--k", str(args.k)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=open(log_path, "w"), stderr=subprocess.STDOUT)
    return ready(proc, port, 600, log_path)


def call(conn, method, path, body=None):
    conn.request(method, path, body=None if body is None else json.dumps(body).encode(),
                 headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    return r.status, json.loads(r.read())


def label_of(question: str, answer: dict, n: int) -> dict:
    """What the page sends for an answer: its span where it answered (Right), no_answer where it abstained, and every
    fifth label Wrong."""
    ids = [p["passage_id"] for p in answer["passages"]]
    body = {"question": question, "passages": [{"passage_id": p["passage_id"], "position": p["position"]}
                                               for p in answer["passages"]],
            "index_version": answer["index_version"], "reader": answer["settings"]["reader"],
            "answer": answer["answer"], "answer_passage": ids.index(answer["passage_id"]) if answer["answer"] else None}
    if n % 5 == 4:
        return {**body, "verdict": "wrong"}
    if not answer["answer"]:
        return {**body, "verdict": "no_answer"}
    return {**body, "verdict": "right", "span": {"passage": body["answer_passage"], "start": answer["start"],
                                                 "end": answer["end"], "text": answer["answer"]}}


def percentiles(seconds: list[float]) -> dict:
    s = sorted(seconds)
    at = lambda q: round(1000 * s[min(len(s) - 1, int(q * len(s)))], 1)  # noqa: E731
    return {"n": len(s), "p50_ms": at(0.5), "p99_ms": at(0.99), "max_ms": round(1000 * s[-1], 1)}


def run_store(args, questions, name, feedback_db, folder):
    port = free_port()
    proc = start(args, port, feedback_db, os.path.join(folder, f"serve-{name}.log"))
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        n_labels = args.clients * args.labels
        asked = questions[:min(n_labels, args.asked)]
        answers = []
        for i in range(0, len(asked), 16):
            status, body = call(conn, "POST", "/ask", {"question": asked[i:i + 16]})
            assert status == 200, body
            answers += body["answers"]
        # more labels than answers asked: the answers labelled again in turn (a store keeps every label)
        labels = [label_of(asked[n % len(asked)], answers[n % len(asked)], n) for n in range(n_labels)]

        def asker(i, stop, out):
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
            j = i
            while not stop.is_set():
                t0 = time.perf_counter()
                status, body = call(c, "POST", "/ask", {"question": questions[j % len(questions)]})
                out.append(time.perf_counter() - t0)
                assert status == 200, body
                j += args.askers

        def poster(i, out, statuses):
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
            for body in labels[i * args.labels:(i + 1) * args.labels]:
                t0 = time.perf_counter()
                status, stored = call(c, "POST", "/feedback", body)
                out.append(time.perf_counter() - t0)
                statuses.append((status, stored.get("id")))

        def phase(posting: bool):
            stop, ask_times, post_times, statuses = threading.Event(), [], [], []
            askers = [threading.Thread(target=asker, args=(i, stop, ask_times)) for i in range(args.askers)]
            posters = [threading.Thread(target=poster, args=(i, post_times, statuses)) for i in range(args.clients)]
            t0 = time.perf_counter()
            for t in askers + (posters if posting else []):
                t.start()
            if posting:
                for t in posters:
                    t.join()
            else:
                time.sleep(args.alone_seconds)
            stop.set()
            for t in askers:
                t.join()
            return time.perf_counter() - t0, ask_times, post_times, statuses

        alone_s, alone, _, _ = phase(False)
        busy_s, ask_times, post_times, statuses = phase(True)
        ids = [i for status, i in statuses if status == 201]
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)  # the first idled past the keep-alive
        status, listed = call(conn, "GET", "/feedback?limit=1000")
        stored = [label["id"] for label in listed["labels"]]
        while listed["next"] is not None:
            status, listed = call(conn, "GET", f"/feedback?after={listed['next']}&limit=1000")
            stored += [label["id"] for label in listed["labels"]]
        return {"labels_sent": len(labels), "answered_201": len(ids), "labels_stored": len(stored),
                "stored_are_the_sent": sorted(ids) == sorted(stored) and len(set(stored)) == len(stored),
                "feedback": percentiles(post_times), "labels_per_s": round(len(post_times) / busy_s, 1),
                "ask_alone": {**percentiles(alone), "questions_per_s": round(len(alone) / alone_s, 2)},
                "ask_beside_feedback": {**percentiles(ask_times), "questions_per_s": round(len(ask_times) / busy_s, 2)}}
    finally:
        proc.terminate()
        proc.wait(timeout=120)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--retriever", default="bm25")
    p.add_argument("--reader", required=True)
    p.add_argument("--passages", default=os.path.join(ROOT, "..", "shared", "data", "dpr", "passages.jsonl"))
    p.add_argument("--questions", default=os.path.join(ROOT, "..", "shared", "data", "squad", "dev.json"))
    p.add_argument("--k", type=int, default=3)
    p.add_argument("--askers", type=int, default=8)
    p.add_argument("--clients", type=int, default=8, help="clients posting labels")
    p.add_argument("--labels", type=int, default=300, help="labels each posting client sends")
    p.add_argument("--asked", type=int, default=400, help="answers asked for the labels (labelled again in turn)")
    p.add_argument("--alone_seconds", type=float, default=30.0, help="how long the askers ask alone")
    p.add_argument("--stores", nargs="+", default=["sqlite", "postgresql"])
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
    args = p.parse_args()
    questions = [q["question"] for q in load_questions(args.questions)]
    result = {}
    with tempfile.TemporaryDirectory() as folder:
        for name in args.stores:
            if name == "sqlite":
                result[name] = run_store(args, questions, name, os.path.join(folder, "feedback.sqlite"), folder)
            else:
                server = Postgres()
                try:
                    result[name] = run_store(args, questions, name, server.database("feedback"), folder)
                finally:
                    server.stop()
            print(name, json.dumps(result[name]), flush=True)
    write_result(args.out, "feedback_cpu.json", result, show=False)


if __name__ == "__main__":
    main()

"""The server under load: questions/s and latency at several concurrencies, batching on and off, and its memory.

    python benchmarks/serve_benchmark.py --retriever outputs/dpr-squad --reader outputs/reader-squad \
        --passages ../shared/data/dpr/passages.jsonl --questions ../shared/data/squad/dev.json --mixed_precision bf16

For each setting (--max_batch 32: batching on; 1: one question per pass) the benchmark starts serve.py as its own
process on a free local port, waits until /health says ready, and for each concurrency C runs C clients (threads,
one keep-alive connection each) that ask the dev questions one per request (k = --k) until --requests questions are
answered; latency is a request's round trip. Every answer is checked against the first setting's answer to the same
question. The server's RSS (psutil) is read after start, after the rows (warmed up) and after --memory_questions
more questions. Beside them,
qa_system.py's offline questions/s at the same k. Writes serve_cpu.md and .json to --out.
"""

import argparse
import http.client
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time

import psutil

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

from conftest import free_port  # noqa: E402

from utils.files.squad import load_questions  # noqa: E402


def start(args, max_batch: int, port: int):
    """serve.py as its own process, once /health says ready (its output in serve-benchmark-MAX_BATCH.log in the
    temporary directory)."""
    cmd = [sys.executable, os.path.join(ROOT, "serve.py"), "--retriever", args.retriever, "--reader", args.reader,
           "--port", str(port), "--max_batch", str(max_batch),
           "--max_questions_per_request", "1" if max_batch == 1 else "16"]
    cmd += ["--index", args.index] if args.index else ["--passages", args.passages]
    if args.mixed_precision:
        cmd += ["--mixed_precision", args.mixed_precision]
    log = open(os.path.join(tempfile.gettempdir(), f"serve-benchmark-{max_batch}.log"), "w")  # its words, if it fails
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    return ready(proc, port, args.start_timeout, log.name)


def ready(proc, port: int, timeout: float, log: str):
    """`proc` (serve.py on `port`) once /health says ready; its exit or `timeout` seconds: SystemExit naming `log`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return proc
        except OSError:
            pass
        if proc.poll() is not None:
            raise SystemExit(f"serve.py exited {proc.returncode}: see {log}")
        time.sleep(0.5)
    proc.kill()
    raise SystemExit(f"serve.py not ready after {timeout} s: see {log}")


def load(port: int, questions: list[str], k: int, concurrency: int, total: int) -> tuple[list, dict]:
    """(latencies in seconds, answers by question) of `total` questions asked by `concurrency` clients. Any failed
    request (an error status, a broken connection) stops the benchmark with its reason: a row is only printed when
    every one of its questions was answered."""
    latencies, answers, lock, next_q, failures = [], {}, threading.Lock(), [0], []

    def client():
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        while True:
            with lock:
                i = next_q[0]
                next_q[0] += 1
            if i >= total:
                return
            q = questions[i % len(questions)]
            t0 = time.perf_counter()
            try:
                conn.request("POST", "/ask", json.dumps({"question": q, "k": k}), {"Content-Type": "application/json"})
                response = conn.getresponse()
                body = json.loads(response.read())
                if response.status != 200:
                    raise RuntimeError(f"/ask answered {response.status}: {body}")
            except Exception as err:  # noqa: BLE001 - recorded, then the benchmark stops
                with lock:
                    failures.append(f"{q!r}: {err}")
                    next_q[0] = total  # the other clients stop too
                return
            with lock:
                latencies.append(time.perf_counter() - t0)
                a = body["answers"][0]
                answers[q] = (a["answer"], a["passage_id"])

    threads = [threading.Thread(target=client) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failures:
        raise SystemExit(f"{len(failures)} request(s) failed at concurrency {concurrency}; first: {failures[0]}")
    return latencies, answers


def percentile(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--retriever", required=True)
    p.add_argument("--reader", required=True)
    p.add_argument("--passages")
    p.add_argument("--index")
    p.add_argument("--questions", required=True)
    p.add_argument("--mixed_precision", default=None)
    p.add_argument("--k", type=int, default=5)
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--requests", type=int, default=320, help="questions asked per concurrency")
    p.add_argument("--memory_questions", type=int, default=5000)
    p.add_argument("--start_timeout", type=float, default=600, help="seconds to wait for /health to say ready")
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)

    questions = [q["question"] for q in load_questions(args.questions, need_context=False)]
    rows, reference, memory = [], None, {}
    for max_batch in (32, 1):
        port = free_port()
        proc = start(args, max_batch, port)
        rss = lambda: round(psutil.Process(proc.pid).memory_info().rss / 2**20, 1)  # noqa: E731
        if max_batch == 32:
            memory["after_start_mb"] = rss()
        for c in args.concurrency:
            load(port, questions, args.k, c, min(2 * c, args.requests))  # warm-up
            t0 = time.perf_counter()
            latencies, answers = load(port, questions, args.k, c, args.requests)
            seconds = time.perf_counter() - t0
            reference = reference or answers
            same = sum(answers[q] == reference[q] for q in answers if q in reference)
            rows.append({"batching": max_batch > 1, "max_batch": max_batch, "concurrency": c,
                         "questions_per_second": round(len(latencies) / seconds, 2),
                         "p50_ms": round(1000 * percentile(latencies, 50), 1),
                         "p95_ms": round(1000 * percentile(latencies, 95), 1),
                         "same_answers": f"{same}/{len(answers)}"})
            print(json.dumps(rows[-1]), flush=True)
        if max_batch == 32:
            memory["after_rows_mb"] = rss()  # warmed up: every buffer a pass needs has been allocated
            load(port, questions, args.k, 32, args.memory_questions)
            memory["after_questions"] = args.memory_questions
            memory["after_questions_mb"] = rss()
            print(json.dumps(memory), flush=True)
        proc.terminate()
        proc.wait()

    qa_out = os.path.join(tempfile.mkdtemp(prefix="serve-benchmark-"), "qa")  # its outputs are not results
    cmd = [sys.executable, os.path.join(ROOT, "qa_system.py"), "--retriever", args.retriever, "--reader", args.reader,
           "--questions", args.questions, "--eval_k", str(args.k), "--top_k", str(args.k), "--output_dir", qa_out,
           "--no_answer_threshold", "0"]
    cmd += ["--index", args.index] if args.index else ["--passages", args.passages]
    if args.mixed_precision:
        cmd += ["--mixed_precision", args.mixed_precision]
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True)
    offline = json.load(open(os.path.join(qa_out, "eval_results.json")))["rows"][-1]["questions_per_second"]

    batched = {r["concurrency"]: r for r in rows if r["batching"]}
    single = {r["concurrency"]: r for r in rows if not r["batching"]}
    top = max(args.concurrency)
    summary = {"machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
               "k": args.k, "precision": args.mixed_precision, "rows": rows, "memory": memory,
               "qa_system_offline_questions_per_second": offline,
               f"batched_over_single_at_{top}": round(batched[top]["questions_per_second"]
                                                      / single[top]["questions_per_second"], 2),
               f"batched_at_{top}_over_offline": round(batched[top]["questions_per_second"] / offline, 2),
               "memory_growth_percent": round(100 * (memory["after_questions_mb"] / memory["after_rows_mb"] - 1), 1)}
    with open(os.path.join(args.out, "serve_cpu.json"), "w") as f:
        json.dump(summary, f, indent=1)
    lines = [f"Machine: {summary['machine']}; k = {args.k}, precision {args.mixed_precision}; "
             f"{args.requests} questions per row, one per request", "",
             "| batching | concurrency | questions/s | p50 ms | p95 ms | same answers |", "|---|---|---|---|---|---|"]
    lines += [f"| {'on (max 32)' if r['batching'] else 'off'} | {r['concurrency']} | {r['questions_per_second']} | "
              f"{r['p50_ms']} | {r['p95_ms']} | {r['same_answers']} |" for r in rows]
    lines += ["", f"qa_system.py offline at k = {args.k}: {offline} questions/s; batched at concurrency {top}: "
              f"{summary[f'batched_over_single_at_{top}']}x one at a time, "
              f"{summary[f'batched_at_{top}_over_offline']}x offline",
              f"server RSS: {memory.get('after_start_mb')} MB after start, {memory.get('after_rows_mb')} MB "
              f"after the rows above, {memory.get('after_questions_mb')} MB after {memory.get('after_questions')} more "
              f"questions ({summary['memory_growth_percent']:+.1f}% over the warmed-up server)"]
    with open(os.path.join(args.out, "serve_cpu.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

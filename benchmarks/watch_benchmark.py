"""A folder kept indexed, end to end: how long from a document written to a running server answering from it.

    python benchmarks/watch_benchmark.py --reader outputs/reader --work /tmp/watch-benchmark

The dev articles (--articles) as one text file each in a folder; `index_corpus.py --documents FOLDER --watch
--period` (BM25 alone, --retriever) keeps an index of it and `serve.py --index` (--reload_check_seconds --check)
serves it. Then --trials times: a new file with a fact no other document holds is written, and /ask is polled (every
50 ms) with a question on it until a passage read holds the fact: the seconds from the write. Prints the median, the
fastest and the slowest; writes watch_cpu.json to --out. The expected median: about one watch period (the change
seen, read, indexed) plus one check of the server (the new version loaded and swapped in), plus the work itself.
"""

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request

from result_file import write_result

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(ROOT, "..", "shared", "data")
MARK = ".watch-benchmark"  # in --work: this benchmark made it, so what it holds is its own to replace


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def ask(url: str, question: str) -> list[str]:
    request = urllib.request.Request(url + "/ask", data=json.dumps({"question": question, "k": 3}).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return [p["text"] for p in json.loads(response.read())["answers"][0]["passages"]]


def wait_until(what, timeout: float = 300):
    deadline = time.time() + timeout
    while not what():
        if time.time() > deadline:
            raise SystemExit("timed out")
        time.sleep(0.05)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--reader", required=True)
    p.add_argument("--retriever", default="bm25")
    p.add_argument("--articles", default=os.path.join(SHARED, "squad", "dev.json"))
    p.add_argument("--period", type=float, default=1.0, help="the watch's period, seconds")
    p.add_argument("--check", type=float, default=1.0, help="the server's --reload_check_seconds")
    p.add_argument("--trials", type=int, default=10)
    p.add_argument("--work", default="/tmp/watch-benchmark")
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
    args = p.parse_args()
    if os.path.exists(args.work) and os.listdir(args.work) and not os.path.exists(os.path.join(args.work, MARK)):
        raise SystemExit(f"--work {args.work} holds files this benchmark did not write: give an empty or new directory")
    shutil.rmtree(args.work, ignore_errors=True)
    docs, index = os.path.join(args.work, "docs"), os.path.join(args.work, "index")
    os.makedirs(docs)
    open(os.path.join(args.work, MARK), "w").close()
    with open(args.articles, encoding="utf-8") as f:
        for article in json.load(f)["data"]:
            with open(os.path.join(docs, article["title"] + ".txt"), "w", encoding="utf-8") as out:
                out.write("\n\n".join(p["context"] for p in article["paragraphs"]) + "\n")
    log = open(os.path.join(args.work, "log.txt"), "w")
    watch = subprocess.Popen([sys.executable, "index_corpus.py", "--retriever", args.retriever, "--documents", docs,
                              "--output_dir", index, "--watch", str(args.period)], cwd=ROOT, stdout=log,
                             stderr=subprocess.STDOUT)
    manifest = os.path.join(index, "index.json")
    wait_until(lambda: os.path.exists(manifest) and json.load(open(manifest))["complete"])
    port = free_port()
    server = subprocess.Popen([sys.executable, "serve.py", "--retriever", args.retriever, "--reader", args.reader,
                               "--index", index, "--reload_check_seconds", str(args.check), "--port", str(port)],
                              cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"

    def ready():
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as response:
                return json.loads(response.read())["ready"]
        except OSError:
            return False

    seconds = []
    try:
        wait_until(ready)
        for trial in range(args.trials):
            word = f"Zorvex{'abcdefghijklmnopqrstuvwxyz'[trial % 26]}{trial}quill"  # a word no other document has
            with open(os.path.join(docs, f"trial-{trial}.txt"), "w", encoding="utf-8") as f:
                f.write(f"{word} is the name of the lighthouse keeper's dog.\n")
            t0 = time.perf_counter()
            wait_until(lambda: any(word in text for text in ask(url, f"Whose dog is {word}?")))
            seconds.append(round(time.perf_counter() - t0, 3))
            print(f"trial {trial}: {seconds[-1]} s", flush=True)
    finally:
        for proc in (server, watch):
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=120)
    result = {"period": args.period, "check": args.check, "trials": seconds,
              "median": statistics.median(seconds), "fastest": min(seconds), "slowest": max(seconds),
              "documents": len(os.listdir(docs)), "watch_exit": watch.returncode, "server_exit": server.returncode}
    write_result(args.out, "watch_cpu.json", result)


if __name__ == "__main__":
    main()

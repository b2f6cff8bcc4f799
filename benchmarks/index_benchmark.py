"""Indexing a corpus: embedding throughput against sentence-transformers, and index_corpus.py's memory at two corpus
sizes with a kill and resume, on text with real lengths.

    python benchmarks/index_benchmark.py throughput --retriever outputs/dpr-squad \
        --passages ../shared/data/dpr/passages.jsonl
    python benchmarks/index_benchmark.py scale --retriever outputs/dpr-squad \
        --passages ../shared/data/dpr/passages.jsonl
    python benchmarks/index_benchmark.py update --retriever outputs/dpr-squad \
        --passages ../shared/data/dpr/passages.jsonl --sizes 20000

throughput: the texts the retriever embeds for the corpus (its sentence windows, or whole passages), one process,
batch --batch_size, in one run side by side: this project's `Retriever.encode_passages` (tokenised once, longest
first, the passage pair (title, text) as trained, under its recorded autocast) against
`SentenceTransformer(passage_encoder).encode` on the same windows' texts (its encode takes no (title, text) pairs;
cut at the retriever's max_passage_length; fp32, and bf16 weights) and
sentence-transformers' multi-process pool with 2 processes (fp32). Each engine is timed twice after a warm-up; texts/s
of the faster pass, and the tokens each side embeds (this project's with the titles, sentence-transformers' without).

scale: corpora of --sizes passages made from the corpus's sentences, shuffled (seeded) and grouped 2 to 6 at a
time, so lengths are real; index_corpus.py runs on each in its own process and its peak RSS is read (its own
GNU time's %M) with --bm25 false: the dense index, the job whose memory must not grow with the corpus. BM25, which
index_corpus.py --bm25 builds at the end over the whole corpus in memory, is built apart at each size (its own
peak RSS). At the largest size a second build is SIGKILLed half way and resumed, and its vectors compared with the
uninterrupted build's.

update: the corpus repeated under new titles to --sizes[0] passages (each copy of an article a document), indexed
from scratch (with BM25, as the hybrid needs); then 1% of the documents changed (a sentence added to each of their
passages) and the same index_corpus.py command run again, against a build from scratch of the changed corpus: both
timed as whole commands, the vectors the update kept compared bit for bit with the first build's, and the two
indexes' hybrid top-10 for the DPR dev questions (--questions) compared. With --retriever bm25, an index of BM25
alone: its update against a rebuild, and the two indexes' BM25 top-10 (ids and scores) compared. Writes
index_<what>_cpu.json to --out.
"""

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from utils.files.corpus import load_passages  # noqa: E402
from utils.index.index import Index  # noqa: E402
from utils.retriever.retriever import Retriever  # noqa: E402
from utils.retriever.sentence_windows import sentence_windows  # noqa: E402
from utils.retriever.settings import PASSAGE_ENCODER  # noqa: E402
from utils.sentences import split_sentences  # noqa: E402


def throughput(args) -> dict:
    import torch
    from sentence_transformers import SentenceTransformer

    retriever = Retriever(args.retriever, device="cpu", batch_size=args.batch_size)
    passages = load_passages(args.passages)
    windows, _ = sentence_windows(passages, retriever.settings.window_sentences)
    texts = [w["text"] for w in windows]
    rows = {}

    def tokens(*inputs, **cut) -> int:
        ids = retriever.p_tok(*inputs, max_length=retriever.settings.max_passage_length, **cut)["input_ids"]
        return sum(len(x) for x in ids)

    def timed(name, fn):
        fn(texts[: 4 * args.batch_size])  # warm-up
        best = min(_seconds(fn, texts) for _ in range(2))
        rows[name] = {"texts_per_second": round(len(texts) / best, 1), "seconds": round(best, 2)}
        print(name, rows[name], flush=True)

    timed(f"this project, Retriever.encode_passages ({retriever.mixed_precision} autocast)",
          lambda t: retriever.encode_passages([{"title": w["title"], "text": x} for w, x in zip(windows, t)]))
    retriever.mixed_precision = "no"
    timed("this project, Retriever.encode_passages (fp32)",
          lambda t: retriever.encode_passages([{"title": w["title"], "text": x} for w, x in zip(windows, t)]))
    # The passage side's directory (a shared encoder's query_encoder/ says the questions' max_seq_length), and its
    # length set again: sentence-transformers must cut the texts where the retriever does, or it does less work.
    st = SentenceTransformer(os.path.join(retriever.model_dir, PASSAGE_ENCODER), device="cpu")
    st.max_seq_length = retriever.settings.max_passage_length
    timed("sentence-transformers encode (fp32)", lambda t: st.encode(t, batch_size=args.batch_size))
    st_bf16 = SentenceTransformer(os.path.join(retriever.model_dir, PASSAGE_ENCODER), device="cpu").to(torch.bfloat16)
    st_bf16.max_seq_length = retriever.settings.max_passage_length
    timed("sentence-transformers encode (bf16 weights)", lambda t: st_bf16.encode(t, batch_size=args.batch_size))
    pool = st.start_multi_process_pool(["cpu", "cpu"])
    try:
        timed("sentence-transformers encode_multi_process (2 processes, fp32)",
              lambda t: st.encode(t, pool=pool, batch_size=args.batch_size))
    finally:
        st.stop_multi_process_pool(pool)
    return {"texts": len(texts), "passages": len(passages), "batch_size": args.batch_size, "rows": rows,
            "tokens_with_titles": tokens([w["title"] for w in windows], texts, truncation="only_second"),
            "tokens_without_titles": tokens(texts, truncation=True)}


def _seconds(fn, texts) -> float:
    t0 = time.perf_counter()
    fn(texts)
    return time.perf_counter() - t0


def make_corpus(source: str, size: int, path: str, seed: int = 0) -> None:
    """`size` passages of 2-6 shuffled sentences of the source corpus (titles kept from the sentence's passage)."""
    sentences = [(p["title"], s) for p in load_passages(source) for s in split_sentences(p["text"])]
    rng = np.random.default_rng(seed)
    with open(path, "w", encoding="utf-8") as f:
        for i in range(size):
            take = rng.choice(len(sentences), size=int(rng.integers(2, 7)), replace=False)
            title = sentences[take[0]][0]
            f.write(json.dumps({"title": title, "text": " ".join(sentences[j][1] for j in take),
                                "passage_id": f"p{i}"}) + "\n")


def index_run(args, corpus: str, out: str, kill_at: int | None = None, bm25: bool = False) -> dict:
    """index_corpus.py on `corpus` in a child; (seconds, peak RSS MB of the child). `kill_at`: SIGKILL it once
    that many chunks are recorded."""
    peak_file = out.rstrip("/") + ".peak"
    cmd = ["/usr/bin/time", "-o", peak_file, "-f", "%M", sys.executable, os.path.join(ROOT, "index_corpus.py"),
           "--retriever", args.retriever, "--passages", corpus, "--output_dir", out, "--chunk_passages",
           str(args.chunk_passages), "--batch_size", str(args.batch_size), "--bm25", str(bm25).lower()]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    if kill_at is not None:
        progress = os.path.join(out, "shard-00000", "progress.json")
        while proc.poll() is None:
            try:
                if len(json.load(open(progress))["chunks"]) >= kill_at:
                    break
            except (OSError, ValueError):
                pass
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGKILL)  # the indexing job itself, not only GNU time around it
    code = proc.wait()
    if kill_at is None and code != 0:
        raise SystemExit(f"index_corpus.py exited {code}")
    return {"seconds": round(time.perf_counter() - t0, 1), "peak_rss_mb": _peak_mb(peak_file)}


def _peak_mb(peak_file: str) -> float | None:
    """The peak RSS (MB) GNU time's %M wrote for its child; None when it wrote nothing (the child was killed)."""
    try:
        return round(int(open(peak_file).read().split()[-1]) / 1024, 1)  # %M is in KiB
    except (OSError, ValueError, IndexError):
        return None


def bm25_run(corpus: str) -> dict:
    """BM25 of `corpus` built as index_corpus.py --bm25 builds it (the whole corpus in memory), in a child:
    (seconds, peak RSS MB)."""
    peak_file = corpus + ".bm25.peak"
    code = (f"import sys; sys.path.insert(0, {ROOT!r}); from utils.search.bm25 import BM25; "
            f"from utils.files.corpus import load_passages; BM25(load_passages({corpus!r}))")
    t0 = time.perf_counter()
    subprocess.run(["/usr/bin/time", "-o", peak_file, "-f", "%M", sys.executable, "-c", code], check=True)
    return {"seconds": round(time.perf_counter() - t0, 1), "peak_rss_mb": _peak_mb(peak_file)}


MARK = ".index-benchmark"  # in --work: this benchmark made it, so the indexes it holds are its own to replace


def fresh(path: str) -> None:
    """Remove an index this benchmark wrote into its marked --work directory before writing it again."""
    import shutil

    if os.path.exists(path):
        shutil.rmtree(path)


def scale(args) -> dict:
    if os.path.exists(args.work) and os.listdir(args.work) and not os.path.exists(os.path.join(args.work, MARK)):
        raise SystemExit(f"--work {args.work} holds files this benchmark did not write: give an empty or new directory")
    os.makedirs(args.work, exist_ok=True)
    open(os.path.join(args.work, MARK), "w").close()
    rows = []
    for size in args.sizes:
        corpus = os.path.join(args.work, f"corpus-{size}.jsonl")
        make_corpus(args.passages, size, corpus)
        out = os.path.join(args.work, f"index-{size}")
        fresh(out)
        run = index_run(args, corpus, out)
        meta = json.load(open(os.path.join(out, "index.json")))
        rows.append({"passages": size, "vectors": meta["vectors"], **run,
                     "passages_per_second": round(size / max(meta.get("seconds", run["seconds"]), 1e-9), 1),
                     "bm25": bm25_run(corpus)})
        print(rows[-1], flush=True)
    largest = max(args.sizes)
    corpus, whole = os.path.join(args.work, f"corpus-{largest}.jsonl"), os.path.join(args.work, f"index-{largest}")
    killed = os.path.join(args.work, f"index-{largest}-killed")
    fresh(killed)
    chunks = -(-largest // args.chunk_passages)
    index_run(args, corpus, killed, kill_at=chunks // 2)
    resumed = index_run(args, corpus, killed)
    a, b = Index.load(whole), Index.load(killed)
    same = all(np.array_equal(np.asarray(x.embeddings), np.asarray(y.embeddings)) for x, y in zip(a.shards, b.shards))
    return {"rows": rows, "resume": {"passages": largest, "killed_after_chunks": chunks // 2, "of": chunks,
                                     "resume_seconds": resumed["seconds"], "identical_vectors": bool(same)}}


def repeated_corpus(source: str, size: int, path: str) -> list[dict]:
    """The source corpus repeated under new titles to `size` passages; copy r of an article is document "r/title"."""
    rows, base = [], load_passages(source)
    while len(rows) < size:
        r = len(rows) // len(base)
        rows += [{"passage_id": f"{p['passage_id']}@{r}", "title": f"{p['title']} ({r})", "text": p["text"],
                  "document": f"{r}/{p['title']}"} for p in base[:size - len(rows)]]
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(p, ensure_ascii=False) + "\n" for p in rows)
    return rows


def by_id(directory: str) -> dict:
    index = Index.load(directory)
    out = {}
    for v in index.shards:
        for j in range(v.count):
            out[index.passages[v.offset + j]["passage_id"]] = np.asarray(v.embeddings[v.starts[j]:v.starts[j + 1]])
    return out


def update(args) -> dict:
    if os.path.exists(args.work) and os.listdir(args.work) and not os.path.exists(os.path.join(args.work, MARK)):
        raise SystemExit(f"--work {args.work} holds files this benchmark did not write: give an empty or new directory")
    os.makedirs(args.work, exist_ok=True)
    open(os.path.join(args.work, MARK), "w").close()
    corpus, index, rebuilt = (os.path.join(args.work, n) for n in ("update-corpus.jsonl", "updated", "rebuilt"))
    rows = repeated_corpus(args.passages, args.sizes[0], corpus)
    for d in (index, rebuilt):
        fresh(d)
    first = index_run(args, corpus, index, bm25=True)
    before = by_id(index)
    documents = sorted({p["document"] for p in rows})
    rng = np.random.default_rng(0)
    changed = set(rng.choice(documents, size=max(1, round(len(documents) / 100)), replace=False).tolist())
    rows = [{**p, "text": p["text"] + " This paragraph was revised."} if p["document"] in changed else p for p in rows]
    with open(corpus, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(p, ensure_ascii=False) + "\n" for p in rows)
    updated = index_run(args, corpus, index, bm25=True)
    rebuild = index_run(args, corpus, rebuilt, bm25=True)
    meta = json.load(open(os.path.join(index, "index.json")))
    after = by_id(index)
    kept = [p["passage_id"] for p in rows if p["document"] not in changed]
    questions = [q["question"] for q in json.load(open(args.questions))]
    if args.retriever == "bm25":  # BM25 alone: its rankings of the two indexes
        a, b = (bm25_hits(Index.load(d), questions) for d in (index, rebuilt))
    else:
        retriever = Retriever(args.retriever, device="cpu")
        a, b = (retriever.search(Index.load(d), questions, k=10, hybrid=True) for d in (index, rebuilt))
    same = sum([h["passage_id"] for h in x] == [h["passage_id"] for h in y] for x, y in zip(a, b))
    gap = max(abs(h["score"] - g["score"]) for x, y in zip(a, b) for h, g in zip(x, y))
    return {"passages": len(rows), "documents": len(documents), "documents_changed": len(changed),
            "passages_changed": sum(p["document"] in changed for p in rows), "embedded_by_update": meta["embedded"],
            "first_build": first, "update": updated, "rebuild": rebuild,
            "update_share_of_rebuild": round(updated["seconds"] / rebuild["seconds"], 4),
            "kept_bit_for_bit": all(np.array_equal(before[k], after[k]) for k in kept) if before else None,  # BM25
            "kept": len(kept),
            "questions": len(questions), "same_top10_ids": same, "max_score_gap": gap}


def bm25_hits(index, questions: list[str]) -> list[list[dict]]:
    scores, ids, _, _ = index.bm25.search(questions, 10)
    return index.hits(scores, ids)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("what", choices=["throughput", "scale", "update"])
    p.add_argument("--retriever", required=True)
    p.add_argument("--passages", required=True)
    p.add_argument("--batch_size", type=int, default=64)
    p.add_argument("--sizes", type=int, nargs="+", default=[20_000, 200_000])
    p.add_argument("--chunk_passages", type=int, default=4096)
    p.add_argument("--work", default="/tmp/index-benchmark")
    p.add_argument("--questions", default=os.path.join(ROOT, "..", "shared", "data", "dpr", "dev.json"))
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
    args = p.parse_args()
    result = {"throughput": throughput, "scale": scale, "update": update}[args.what](args)
    result["machine"] = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"
    os.makedirs(args.out, exist_ok=True)
    name = f"index_{args.what}_cpu"
    with open(os.path.join(args.out, name + ".json"), "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

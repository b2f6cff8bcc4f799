"""Exact top-k search at corpus scale: this project's blockwise engine (utils.search.exact) beside FAISS's exact
IndexFlatIP, on the same synthetic data in the same run.

    python benchmarks/search_benchmark.py                          # 10k, 100k, 1M passages; whole and 5 windows each
    python benchmarks/search_benchmark.py --passages 10000 --questions 1000      # a quick look

Data: unit vectors of --dim dimensions drawn from a normal distribution (seeded chunk by chunk, so a process can
draw its own shard alone), --questions of them as queries, top --k. With --windows W each passage has W vectors
(sentence windows) and scores as its best one (MaxP); FAISS then searches the windows for k x W and keeps each
passage's best (exact for a flat index). Engines, each in a fresh process (peak RSS is the process's own):
`ours` (one process, all cores), `ours-2proc` (2 gloo processes of one thread, each holding half the passages,
results merged), `faiss` (IndexFlatIP, all cores; vectors added chunk by chunk, so it holds one copy). Wall time is
the search alone (drawing the data is not timed). The top-k ids of every engine are compared with `ours`'s:
"same" is the share of equal (question, position) ids, "ties aside" counts a difference only where the two
scores differ by more than 1e-6. Writes search_cpu.md and .json to --out.
"""

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from utils.search.exact import top_k  # noqa: E402
from utils.search.shards import merged_top_k, shard  # noqa: E402
from utils.search.vectors import Vectors  # noqa: E402

CHUNK = 65536


def draw(first: int, last: int, dim: int, seed: int) -> np.ndarray:
    """Rows first:last of the synthetic collection (unit vectors), the same whichever process draws them."""
    out = np.empty((last - first, dim), dtype=np.float32)
    for c in range(first // CHUNK, (last - 1) // CHUNK + 1 if last > first else 0):
        rows = np.random.default_rng([seed, c]).standard_normal((CHUNK, dim), dtype=np.float32)
        rows /= np.linalg.norm(rows, axis=1, keepdims=True)
        a, b = max(first, c * CHUNK), min(last, (c + 1) * CHUNK)
        out[a - first:b - first] = rows[a - c * CHUNK:b - c * CHUNK]
    return out


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def worker(args) -> None:
    import torch

    queries = draw(0, args.questions, args.dim, args.seed + 1)
    w, result = args.windows, {}
    if args.engine == "faiss":
        import faiss

        index = faiss.IndexFlatIP(args.dim)
        for s in range(0, args.passages * w, CHUNK):
            index.add(draw(s, min(s + CHUNK, args.passages * w), args.dim, args.seed))
        t0 = time.perf_counter()
        scores, rows = index.search(queries, args.k * w)
        if w > 1:  # each passage's best window: the first time its passage appears
            owner = rows // w
            ids = np.full((len(queries), args.k), -1, dtype=np.int64)
            best = np.full((len(queries), args.k), -np.inf, dtype=np.float32)
            for i in range(len(queries)):
                _, first = np.unique(owner[i], return_index=True)
                keep = np.sort(first)[:args.k]
                ids[i], best[i] = owner[i][keep], scores[i][keep]
            scores = best
        else:
            ids = rows
        result["seconds"] = time.perf_counter() - t0
        result["threads"] = faiss.omp_get_max_threads()
    else:
        rank, world = 0, 1
        if args.engine == "ours-2proc":
            import torch.distributed as dist

            dist.init_process_group("gloo")
            rank, world = dist.get_rank(), dist.get_world_size()
        mine = shard(args.passages, rank, world)
        emb = draw(mine.start * w, mine.stop * w, args.dim, args.seed)
        owner = np.repeat(np.arange(len(mine)), w) if w > 1 else None
        vectors = Vectors(emb, owner, len(mine), mine.start)
        q = torch.from_numpy(queries)
        if world > 1:
            dist.barrier()
        t0 = time.perf_counter()
        scores, ids, _ = top_k(q, vectors, args.k)
        scores, ids = merged_top_k(scores, ids, args.k)
        result["seconds"] = time.perf_counter() - t0
        result["threads"] = torch.get_num_threads()
        if world > 1:
            rss = torch.tensor([peak_rss_mb()])
            all_rss = [torch.zeros(1) for _ in range(world)]
            dist.all_gather(all_rss, rss)
            result["peak_rss_mb_per_process"] = [round(float(r), 1) for r in all_rss]
            dist.destroy_process_group()
            if rank:
                return
    result["peak_rss_mb"] = round(peak_rss_mb(), 1)
    np.save(args.result + ".ids.npy", ids)
    np.save(args.result + ".scores.npy", scores)
    with open(args.result, "w") as f:
        json.dump(result, f)


def run(engine, passages, windows, args, work) -> dict:
    result = os.path.join(work, f"{engine}-{passages}-{windows}.json")
    cmd = [__file__, "--worker", "--engine", engine, "--passages", str(passages), "--windows", str(windows),
           "--questions", str(args.questions), "--k", str(args.k), "--dim", str(args.dim), "--seed", str(args.seed),
           "--result", result]
    env = dict(os.environ)
    if engine == "ours-2proc":
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"] + cmd
        env["OMP_NUM_THREADS"] = "1"
    else:
        cmd = [sys.executable] + cmd
    subprocess.run(cmd, check=True, env=env)
    out = json.load(open(result))
    out["ids"], out["scores"] = np.load(result + ".ids.npy"), np.load(result + ".scores.npy")
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--passages", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    p.add_argument("--windows", type=int, nargs="+", default=[1, 5], help="vectors per passage (1: whole passages)")
    p.add_argument("--questions", type=int, default=10_000)
    p.add_argument("--k", type=int, default=100)
    p.add_argument("--dim", type=int, default=384)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--engines", nargs="+", default=["ours", "ours-2proc", "faiss"])
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--engine", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        args.passages, args.windows = args.passages[0], args.windows[0]
        return worker(args)
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for windows in args.windows:
            for passages in args.passages:
                results = {e: run(e, passages, windows, args, work) for e in args.engines}
                ref = results[args.engines[0]]
                embeddings_mb = passages * windows * args.dim * 4 / 2**20
                for engine, r in results.items():
                    same = r["ids"] == ref["ids"]
                    real = ~same & (np.abs(r["scores"] - ref["scores"]) > 1e-6)
                    rows.append({"passages": passages, "windows": windows, "engine": engine,
                                 "seconds": round(r["seconds"], 2), "peak_rss_mb": r.get("peak_rss_mb"),
                                 "peak_rss_mb_per_process": r.get("peak_rss_mb_per_process"),
                                 "embeddings_mb": round(embeddings_mb, 1), "threads": r["threads"],
                                 "same_ids": round(float(same.mean()), 5), "differences_ties_aside": int(real.sum())})
                    print(json.dumps(rows[-1]), flush=True)
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               platform.processor())
    header = (f"Machine: {cpu}, {os.cpu_count()} cores. {args.questions:,} questions, top {args.k}, {args.dim}-d unit "
              "vectors; seconds = the search alone; RSS = the process's peak (for 2 processes, each one's).")
    lines = [header, "", "| passages | vectors per passage | engine | seconds | peak RSS MB | embeddings MB "
             "| same ids as ours | differences (ties aside) |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        rss = (" / ".join(str(x) for x in r["peak_rss_mb_per_process"]) if r["peak_rss_mb_per_process"]
               else r["peak_rss_mb"])
        lines.append(f"| {r['passages']:,} | {r['windows']} | {r['engine']} | {r['seconds']} | {rss} | "
                     f"{r['embeddings_mb']} | {r['same_ids']:.5f} | {r['differences_ties_aside']} |")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "search_cpu.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(args.out, "search_cpu.json"), "w") as f:
        json.dump({"machine": header, "rows": rows}, f, indent=1)
    print("\n".join(lines))


if __name__ == "__main__":
    main()

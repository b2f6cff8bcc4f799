"""FAISS indexes from an index's shards against the exact search: recall, memory and speed at several settings.

    python benchmarks/faiss_benchmark.py real --index outputs/corpus-index --questions ../shared/data/dpr/dev.json
    python benchmarks/faiss_benchmark.py synthetic --vectors 1000000

real: an index built by index_corpus.py (its vectors: passages, or sentence windows ranked by their best) and the
questions of a DPR file embedded by its retriever. synthetic: --vectors clustered 384-d unit vectors (a Gaussian
mixture of --clusters centres; real embeddings cluster, and uniform random vectors are the worst case of any IVF)
in two shards, queries drawn from the same mixture. For every setting: recall@10 and @100 (the share of the exact
top-k passages the FAISS search finds), the FAISS index's size (serialised), the time to build it, and the time per
1,000 questions; the exact blockwise search (utils.search.exact) beside it. Writes faiss_<what>_cpu.json and a
markdown table to --out.
"""

import argparse
import json
import os
import platform
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from utils.files.dpr import load_dpr  # noqa: E402
from utils.index.faiss_index import build_faiss, faiss_top_k  # noqa: E402
from utils.index.index import Index  # noqa: E402
from utils.retriever.retriever import Retriever  # noqa: E402
from utils.search.exact import search_shards  # noqa: E402
from utils.search.vectors import Vectors  # noqa: E402

# (kind, build options, search options): from exact to compressed
SETTINGS = [("flat", {}, {}),
            ("ivf", {}, {"nprobe": 4}), ("ivf", {}, {"nprobe": 16}), ("ivf", {}, {"nprobe": 64}),
            ("ivfpq", {"pq_m": 48}, {"nprobe": 16}), ("ivfpq", {"pq_m": 48}, {"nprobe": 64}),
            ("hnsw", {"hnsw_m": 32}, {"ef_search": 32}), ("hnsw", {"hnsw_m": 32}, {"ef_search": 128}),
            ("hnsw", {"hnsw_m": 32}, {"ef_search": 512})]


def recall(exact: np.ndarray, found: np.ndarray, k: int) -> float:
    return float(np.mean([len(set(a[:k]) & set(b[:k])) / k for a, b in zip(exact.tolist(), found.tolist())]))


def synthetic(n: int, dim: int, clusters: int, queries: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((clusters, dim)).astype(np.float32)
    x = np.empty((n, dim), np.float32)
    for s in range(0, n, 65536):
        rows = min(65536, n - s)
        x[s:s + rows] = centers[rng.integers(0, clusters, rows)] + 0.5 * rng.standard_normal((rows, dim), np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    q = centers[rng.integers(0, clusters, queries)] + 0.5 * rng.standard_normal((queries, dim), np.float32)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    half = n // 2
    shards = [Vectors(x[:half], None, half, 0), Vectors(x[half:], None, n - half, half)]
    passages = [{"passage_id": str(i), "title": "", "text": ""} for i in range(n)]  # only ids are read
    built_by = {"model": "synthetic", "passage_encoder": "-", "settings": {}, "precision": "no"}
    return Index(shards, passages, None, built_by), q


def main():
    import faiss
    import torch

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("what", choices=["real", "synthetic"])
    p.add_argument("--index")
    p.add_argument("--questions")
    p.add_argument("--vectors", type=int, default=1_000_000)
    p.add_argument("--clusters", type=int, default=2000)
    p.add_argument("--queries", type=int, default=1000)
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
    args = p.parse_args()

    if args.what == "real":
        index = Index.load(args.index)
        retriever = Retriever(index.model_dir)  # the retriever that built it, checked
        retriever.check_index(index, args.index)
        q = retriever.encode_questions([x["question"] for x in load_dpr(args.questions)]).numpy()
        source = f"{args.index} ({index.count} passages, {sum(len(v.embeddings) for v in index.shards)} vectors)"
    else:
        index, q = synthetic(args.vectors, 384, args.clusters, args.queries)
        source = f"synthetic: {args.vectors} clustered 384-d unit vectors ({args.clusters} centres), 2 shards"
    k = min(100, index.count)
    t0 = time.perf_counter()
    _, exact = search_shards(torch.from_numpy(np.ascontiguousarray(q)), index.shards, k)
    exact_seconds = time.perf_counter() - t0
    rows = [{"setting": "exact (blockwise, this project)", "recall@10": 1.0, f"recall@{k}": 1.0,
             "seconds_per_1k_questions": round(1000 * exact_seconds / len(q), 3),
             "index_mb": round(sum(np.asarray(v.embeddings).nbytes for v in index.shards) / 2**20, 1)}]
    print(rows[-1], flush=True)
    built = {}
    for kind, build, search in SETTINGS:
        key = (kind, tuple(sorted(build.items())))
        if key not in built:
            t0 = time.perf_counter()
            built[key] = (build_faiss(index, kind, **build), round(time.perf_counter() - t0, 1))
        faiss_index, build_seconds = built[key]
        t0 = time.perf_counter()
        _, found = faiss_top_k(index, faiss_index, q, k, **search)
        seconds = time.perf_counter() - t0
        options = ", ".join(f"{a}={b}" for a, b in {**build, **search}.items())
        if kind.startswith("ivf"):
            options = f"nlist={faiss.extract_index_ivf(faiss_index).nlist}" + (", " + options if options else "")
        rows.append({"setting": f"FAISS {kind}" + (f" ({options})" if options else ""),
                     "recall@10": round(recall(exact, found, 10), 4), f"recall@{k}": round(recall(exact, found, k), 4),
                     "seconds_per_1k_questions": round(1000 * seconds / len(q), 3),
                     "index_mb": round(len(faiss.serialize_index(faiss_index)) / 2**20, 1),
                     "build_seconds": build_seconds})
        print(rows[-1], flush=True)
    result = {"machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
              "faiss": faiss.__version__, "source": source, "questions": len(q), "k": k, "rows": rows}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"faiss_{args.what}_cpu.json"), "w") as f:
        json.dump(result, f, indent=1)
    lines = [f"{source}; {len(q)} questions, top {k}; {result['machine']}, faiss {faiss.__version__}", "",
             f"| setting | recall@10 | recall@{k} | s per 1k questions | index MB | build s |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r['setting']} | {r['recall@10']} | {r[f'recall@{k}']} | {r['seconds_per_1k_questions']} | "
              f"{r['index_mb']} | {r.get('build_seconds', '')} |" for r in rows]
    with open(os.path.join(args.out, f"faiss_{args.what}_cpu.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

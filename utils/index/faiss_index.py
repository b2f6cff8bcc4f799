"""FAISS indexes built from an index's shards, for approximate search or a corpus whose vectors outgrow memory.

Kinds (all inner product: a cosine retriever's vectors are normalised):
* "flat": IndexFlatIP, exact (the blockwise search engine's result, ties aside);
* "ivf": IndexIVFFlat, `nlist` k-means cells; a search visits `nprobe` of them;
* "ivfpq": IndexIVFPQ, the same cells with vectors compressed to `pq_m` codes of `nbits` bits (dim x 4 bytes ->
  pq_m bytes a vector: what lets 21M vectors fit in memory);
* "hnsw": IndexHNSWFlat, a graph of `hnsw_m` links per vector; a search explores `ef_search` candidates.
The IVF kinds train their cells (and codes) on a sample of the vectors drawn evenly from every shard under a seed;
every kind then takes the vectors shard by shard, in chunks, so nothing holds more than one chunk beside FAISS's own
storage. Where faiss-gpu and a GPU exist, flat and IVF indexes are moved to the GPUs (`gpu=True`, the default
there). Like the exact search, a FAISS search takes query vectors, never a model:

    faiss_index = build_faiss(index, "ivf", nlist=1024)
    hits = search_faiss(index, faiss_index, retriever.encode_questions(questions), k=10, nprobe=32)

Recall against the exact search, memory and speed at several settings: benchmarks/faiss_benchmark.py and
docs/RESULTS.md.
"""

import numpy as np

from utils.errors import UserError
from utils.index.index import Index
from utils.search.hits import check_k

KINDS = ("flat", "ivf", "ivfpq", "hnsw")
CHUNK = 65536  # vectors added at a time


def _faiss():
    try:  # optional: training, evaluation and the exact search never need it
        import faiss
    except ImportError:
        raise UserError("FAISS indexes need FAISS: pip install faiss-cpu (or faiss-gpu)") from None
    return faiss


def _rows(index: Index):
    """(shard, first global row) of every shard, and the total number of rows."""
    starts, total = [], 0
    for v in index.shards:
        starts.append(total)
        total += len(v.embeddings)
    return starts, total


def training_sample(index: Index, size: int, seed: int = 0) -> np.ndarray:
    """`size` vectors drawn evenly (without replacement) from every shard, float32."""
    starts, total = _rows(index)
    picked = np.sort(np.random.default_rng(seed).choice(total, size=min(size, total), replace=False))
    out = []
    for v, start in zip(index.shards, starts):
        local = picked[(picked >= start) & (picked < start + len(v.embeddings))] - start
        if len(local):
            out.append(np.asarray(v.embeddings[local], dtype=np.float32))
    return np.ascontiguousarray(np.concatenate(out)) if out else np.zeros((0, index.dimension), np.float32)


def build_faiss(index: Index, kind: str = "flat", nlist: int | None = None, pq_m: int = 16, nbits: int = 8,
                hnsw_m: int = 32, ef_construction: int = 80, train_size: int | None = None, seed: int = 0,
                gpu: bool | None = None):
    """A FAISS index over every vector of `index` (row i = the i-th vector, shard after shard). `nlist`: IVF cells
    (default about 4 sqrt(vectors)); `train_size`: vectors the IVF kinds train on (default 64 per cell, at least
    10,000); `gpu`: move flat/IVF indexes to the GPUs (default: where faiss-gpu sees one)."""
    faiss = _faiss()
    if kind not in KINDS:
        raise UserError(f"FAISS index kind {kind!r}: choose {', '.join(KINDS)}")
    if index.distributed:
        raise UserError("a FAISS index is built from every shard: load the whole index (no share)")
    _, total = _rows(index)
    dim = index.dimension
    if not total:
        raise UserError("the index holds no vectors")
    metric = faiss.METRIC_INNER_PRODUCT
    if kind == "flat":
        out = faiss.IndexFlatIP(dim)
    elif kind == "hnsw":
        out = faiss.IndexHNSWFlat(dim, hnsw_m, metric)
        out.hnsw.efConstruction = ef_construction
    else:
        nlist = nlist or max(1, min(total // 39, int(4 * np.sqrt(total))))
        quantizer = faiss.IndexFlatIP(dim)
        if kind == "ivf":
            out = faiss.IndexIVFFlat(quantizer, dim, nlist, metric)
        else:
            if dim % pq_m:
                raise UserError(f"pq_m {pq_m} must divide the dimension {dim}")
            out = faiss.IndexIVFPQ(quantizer, dim, nlist, pq_m, nbits, metric)
        out.own_fields = True
        quantizer.this.disown()
    use_gpu = gpu if gpu is not None else (hasattr(faiss, "get_num_gpus") and faiss.get_num_gpus() > 0)
    if use_gpu and kind != "hnsw":
        out = faiss.index_cpu_to_all_gpus(out)
    if kind in ("ivf", "ivfpq"):
        out.train(training_sample(index, train_size or max(10_000, 64 * nlist), seed))
    for v in index.shards:
        for first in range(0, len(v.embeddings), CHUNK):
            out.add(np.ascontiguousarray(np.asarray(v.embeddings[first:first + CHUNK], dtype=np.float32)))
    return out


def set_search_parameters(faiss_index, nprobe: int | None = None, ef_search: int | None = None) -> None:
    faiss = _faiss()
    if nprobe is not None:
        try:
            faiss.extract_index_ivf(faiss_index).nprobe = nprobe
        except RuntimeError:
            raise UserError("nprobe is a setting of IVF indexes") from None
    if ef_search is not None:
        if not hasattr(faiss_index, "hnsw"):
            raise UserError("ef_search is a setting of HNSW indexes")
        faiss_index.hnsw.efSearch = ef_search


def search_faiss(index: Index, faiss_index, queries, k: int = 10, nprobe: int | None = None,
                 ef_search: int | None = None) -> list[list[dict]]:
    """`Index.search` through a FAISS index of its vectors (`build_faiss`), at the given search settings: per query
    vector (a retriever's `encode_questions`) its k best passages as search results (`Index.hits`)."""
    check_k(k)
    scores, ids = faiss_top_k(index, faiss_index, np.asarray(queries), k, nprobe, ef_search)
    return index.hits(scores, ids)


def faiss_top_k(index: Index, faiss_index, queries: np.ndarray, k: int, nprobe: int | None = None,
                ef_search: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(scores, passage ids, -1 padded) of each query vector's k best passages through FAISS. With sentence windows
    it asks for k x the most windows a passage has and keeps each passage's best window: exact for a flat index
    (those windows hold at least k distinct passages)."""
    set_search_parameters(faiss_index, nprobe, ef_search)
    starts, total = _rows(index)
    per = max((int(np.diff(v.starts).max()) for v in index.shards if v.count), default=1)
    scores, rows = faiss_index.search(np.ascontiguousarray(queries, dtype=np.float32), min(k * per, total))
    starts = np.asarray(starts)
    out_s = np.full((len(queries), k), -np.inf, np.float32)
    out_i = np.full((len(queries), k), -1, np.int64)
    for i, (row_s, row_r) in enumerate(zip(scores, rows)):
        valid = row_r >= 0
        row_s, row_r = row_s[valid], row_r[valid]
        shard = np.searchsorted(starts, row_r, side="right") - 1
        passage = np.empty(len(row_r), np.int64)
        for s in np.unique(shard):
            v, at = index.shards[s], shard == s
            local = row_r[at] - starts[s]
            passage[at] = v.offset + (np.asarray(v.owner[local]) if v.owner is not None else local)
        _, first = np.unique(passage, return_index=True)  # each passage at its best window: its first row
        keep = np.sort(first)[:k]
        out_s[i, :len(keep)], out_i[i, :len(keep)] = row_s[keep], passage[keep]
    return out_s, out_i

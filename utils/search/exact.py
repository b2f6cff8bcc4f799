"""Exact dense search that scales: the one engine behind evaluation, the negatives refresh and the Retriever API.

Questions are scored against the passage embeddings block by block, on the device that holds the queries, and
only each question's k best passages are kept: memory is one block of scores plus k results per question, never
the questions x corpus matrix (21M passages x 6,515 questions would be half a terabyte in float32). A passage cut
into sentence windows scores as its best window (MaxP, utils.search.best_window); blocks end on passage boundaries
(utils.search.vectors), so that is exact too. Where bf16 products are fast, a bf16 prefilter skips the queries a
block cannot change (utils.search.bf16_prefilter): the fp32 scores still decide every result.
Under several processes each one holds a contiguous shard of the passages and searches it; `dense_search` merges
the per-process results (utils.search.shards): the same result as one process, ties aside (the k best are kept
by utils.search.kbest's keys). Ties and NaN follow the project's one rank rule (utils.search.ranking):
NaN scores rank last, and `count_at_least` counts ties against the passage being ranked.
"""

import numpy as np
import torch

from utils.search.best_window import add_windows, passage_scores
from utils.search.bf16_prefilter import bf16_prefilter_available, may_reach
from utils.search.kbest import KBest
from utils.search.shards import max_scores, merge_columns, merged_top_k, summed_counts
from utils.search.vectors import Vectors, blocks, vector_blocks

# Queries scored together: each block of vectors is read once per this many queries, and a block's scores
# (QUERY_BLOCK x BLOCK_ROWS fp32, 16 MiB) stay below glibc's largest mmap threshold (32 MiB), so their memory is
# reused from block to block instead of being mapped and faulted in afresh each time.
QUERY_BLOCK = 4096
BLOCK_ROWS = 1024  # vectors per block


def _exact_scores(q: torch.Tensor, w: torch.Tensor, vectors: Vectors, first: int, last: int,
                  per_passage: bool = True) -> torch.Tensor:
    """fp32 scores of the queries q for passages first:last (block vectors w): per passage (its best window), or
    `per_passage=False` per vector. A NaN score is -inf (it ranks last) before a passage takes its best window, in
    every path (`gold_scores`, `score_passages` alike): a NaN window is dropped, the passage scores by its others."""
    scores = q @ w.T
    if torch.isnan(scores.amax(1)).any():  # a NaN embedding (amax propagates NaN: one check per block)
        scores = torch.nan_to_num(scores, nan=float("-inf"), posinf=float("inf"), neginf=float("-inf"))
    if per_passage:
        scores = passage_scores(scores, vectors, first, last)
    return scores


def top_k(queries: torch.Tensor, vectors: Vectors, k: int, thresholds=None, exclude=None, block_rows: int | None = None,
          query_block: int = QUERY_BLOCK, prefilter: bool | None = None
          ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(scores, ids, counts): each query's k best passages of `vectors` (global ids, best first, ties by the smaller
    id; fewer columns when there are fewer passages) and, with `thresholds` (one score per query), how many passages
    other than those in `exclude` (query x ids, -1 padded: the gold passages) score at least that much: with the
    gold passages' best score as threshold (`gold_scores`), a gold passage's rank is that count + 1
    (utils.search.ranking's rule). Blocks of about `block_rows` vectors, queries `query_block` at a time.

    Exact in fp32 whatever the hardware. Two searches: `_k_best` (the k best alone: where bf16 products are fast
    it may skip, per block, the queries that cannot gain from it, `prefilter`: utils.search.bf16_prefilter) and
    `_k_best_and_counts` (with thresholds: every product in fp32, the very products `gold_scores` computed the
    thresholds with)."""
    device = queries.device
    k = min(k, vectors.count)
    if prefilter and thresholds is not None:
        raise ValueError("the bf16 prefilter skips products the counts against thresholds need")
    if prefilter is None:  # worth it when a block holds, on average, well under one of a query's k best
        prefilter = bf16_prefilter_available(device) and k * 1024 < 0.5 * len(vectors.embeddings)
    out_scores, out_ids, out_counts = [], [], []
    for q0 in range(0, len(queries), query_block):
        q = queries[q0:q0 + query_block].float()
        if thresholds is None:
            best = _k_best(q, vectors, k, block_rows or (BLOCK_ROWS // 2 if prefilter else BLOCK_ROWS), prefilter)
        else:
            limit = torch.nan_to_num(torch.as_tensor(np.asarray(thresholds[q0:q0 + query_block], dtype=np.float32),
                                                     device=device), nan=float("-inf"))
            skip = None if exclude is None else torch.as_tensor(np.asarray(exclude[q0:q0 + query_block]), device=device)
            best, counts = _k_best_and_counts(q, vectors, k, limit, skip, block_rows or BLOCK_ROWS)
            out_counts.append(counts.cpu())
        best.flush()
        out_scores.append(best.scores.cpu())
        out_ids.append(best.ids.cpu())
    if not out_scores:
        return np.zeros((0, k), np.float32), np.zeros((0, k), np.int64), None
    return (torch.cat(out_scores).numpy(), torch.cat(out_ids).numpy(),
            torch.cat(out_counts).numpy() if thresholds is not None else None)


def _k_best(q: torch.Tensor, vectors: Vectors, k: int, block_rows: int, prefilter: bool) -> KBest:
    """The k best passages of every query of q, block by block. After the first block (which sets each query's
    cut), a block with sentence windows takes only the windows at or above the cut (utils.search.best_window), and with
    `prefilter` only the queries whose bf16 best of the block could reach their cut are scored in fp32."""
    best = KBest(len(q), k, q.device)
    every = torch.arange(len(q), device=q.device)
    q_b, q_norm = (q.bfloat16(), q.norm(dim=1)) if prefilter else (None, None)
    for first, last, w in vector_blocks(vectors, block_rows, q.device):
        rows = every
        if prefilter and best.started:
            rows = may_reach(q_b, q_norm, w, best.floor)
            if not len(rows):
                continue
        q_rows = q if len(rows) == len(q) else q[rows]
        if vectors.owner is not None and best.started:
            add_windows(best, _exact_scores(q_rows, w, vectors, first, last, per_passage=False), rows, vectors, first)
        else:
            best.add(_exact_scores(q_rows, w, vectors, first, last), rows, first + vectors.offset)
    return best


def _k_best_and_counts(q: torch.Tensor, vectors: Vectors, k: int, limit: torch.Tensor, skip: torch.Tensor | None,
                       block_rows: int) -> tuple[KBest, torch.Tensor]:
    """The k best passages of every query of q and how many passages, those in `skip` (query x global ids, -1
    padded) aside, score at least the query's `limit`: every block in fp32, per passage."""
    best = KBest(len(q), k, q.device)
    every = torch.arange(len(q), device=q.device)
    counts = torch.zeros(len(q), dtype=torch.long, device=q.device)
    for first, last, w in vector_blocks(vectors, block_rows, q.device):
        scores = _exact_scores(q, w, vectors, first, last)
        above = scores >= limit[:, None]
        if skip is not None:  # the excluded passages of this block
            local = skip - (first + vectors.offset)
            r, c = torch.nonzero((skip >= 0) & (local >= 0) & (local < last - first), as_tuple=True)
            above[r, local[r, c]] = False
        counts += torch.count_nonzero(above, dim=1)
        best.add(scores, every, first + vectors.offset)
    return best, counts


def gold_scores(queries: torch.Tensor, vectors: Vectors, gold_ids: np.ndarray, block_rows: int = BLOCK_ROWS,
                query_block: int = QUERY_BLOCK) -> np.ndarray:
    """Each query's best score of its gold passages (query x ids, -1 padded; -inf where none is in this shard),
    computed with the very block products `top_k` computes, so that `top_k` can rank the gold exactly: a score
    computed another way can differ in the last bit and turn a near-tie around."""
    device = queries.device
    out = np.full(len(queries), -np.inf, dtype=np.float32)
    gold_ids = np.asarray(gold_ids, dtype=np.int64)
    for q0 in range(0, len(queries), query_block):
        gold = gold_ids[q0:q0 + query_block] - vectors.offset
        mine = (gold_ids[q0:q0 + query_block] >= 0) & (gold >= 0) & (gold < vectors.count)
        if not mine.any():
            continue
        q = queries[q0:q0 + query_block].float()
        for first, last in blocks(vectors, block_rows):
            inside = mine & (gold >= first) & (gold < last)
            if not inside.any():
                continue
            w = vectors.rows(vectors.starts[first], vectors.starts[last], device)
            scores = _exact_scores(q, w, vectors, first, last).cpu().numpy()
            rows, cols = np.nonzero(inside)
            np.maximum.at(out, q0 + rows, scores[rows, gold[rows, cols] - first])
    return out


def score_passages(queries: torch.Tensor, vectors: Vectors, ids: np.ndarray, query_block: int = 16) -> np.ndarray:
    """scores[i, j] = query i's score of passage ids[i, j] (global id; its best window), -inf where that passage is
    not in `vectors` (another shard) or the id is -1."""
    ids = np.asarray(ids, dtype=np.int64)
    out = np.full(ids.shape, -np.inf, dtype=np.float32)
    local = ids - vectors.offset
    present = (ids >= 0) & (local >= 0) & (local < vectors.count)
    for q0 in range(0, len(ids), query_block):
        rows_q, cols = np.nonzero(present[q0:q0 + query_block])
        if not len(rows_q):
            continue
        passages = local[q0:q0 + query_block][rows_q, cols]
        lengths = vectors.starts[passages + 1] - vectors.starts[passages]
        window_rows = np.concatenate([np.arange(vectors.starts[p], vectors.starts[p + 1]) for p in passages])
        pair = np.repeat(np.arange(len(passages)), lengths)
        q = queries[q0:q0 + query_block].float()
        w = vectors.take(window_rows, q.device)
        dots = (q[torch.as_tensor(rows_q[pair], device=q.device)] * w).sum(1).cpu().numpy()
        dots = np.where(np.isnan(dots), -np.inf, dots)
        best = np.full(len(passages), -np.inf, dtype=np.float32)
        np.maximum.at(best, pair, dots)
        out[q0 + rows_q, cols] = best
    return out


def dense_search(queries: torch.Tensor, vectors, k: int, gold_ids: np.ndarray | None = None
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(scores, ids, gold ranks) over the whole collection, whichever shards of it this process holds (`vectors`:
    one Vectors or a list): each query's k best passages and, with `gold_ids` (query x ids, -1 padded), the rank of
    its best gold passage (1 + the other passages scoring at least as high). A collective under several processes:
    every process calls it."""
    device = queries.device
    shards = [v for v in (vectors if isinstance(vectors, list) else [vectors]) if v.count]
    thresholds = None
    if gold_ids is not None:  # first the gold passages' scores, from the same block products as the search
        local = np.full(len(queries), -np.inf, dtype=np.float32)
        for v in shards:
            local = np.maximum(local, gold_scores(queries, v, gold_ids))
        thresholds = max_scores(local, device)
    parts = [top_k(queries, v, k, thresholds, gold_ids) for v in shards]
    if parts:
        scores, ids = merge_columns([p[0] for p in parts], [p[1] for p in parts], k)
    else:
        scores, ids = np.zeros((len(queries), 0), np.float32), np.zeros((len(queries), 0), np.int64)
    counts = sum(p[2] for p in parts) if gold_ids is not None and parts else np.zeros(len(queries), np.int64)
    scores, ids = merged_top_k(scores, ids, k, device)
    return scores, ids, (summed_counts(counts, device) + 1 if gold_ids is not None else None)


def search_shards(queries: torch.Tensor, shards: list[Vectors], k: int, distributed: bool = False
                  ) -> tuple[np.ndarray, np.ndarray]:
    """(scores, ids): each query's k best passages over several shards held by this process, merged; with
    `distributed`, over every process's shards too (a collective). The same as one search of all of them."""
    parts = [top_k(queries, v, k)[:2] for v in shards if v.count]
    if parts:
        scores, ids = merge_columns([p[0] for p in parts], [p[1] for p in parts], k)
    else:
        scores, ids = np.zeros((len(queries), 0), np.float32), np.zeros((len(queries), 0), np.int64)
    return merged_top_k(scores, ids, k, queries.device) if distributed else (scores, ids)


def score_shards(queries: torch.Tensor, shards: list[Vectors], ids: np.ndarray,
                 distributed: bool = False) -> np.ndarray:
    """`score_passages` over several shards (each scores the passages it holds), with `distributed` over every
    process's (a collective)."""
    scores = np.full(np.asarray(ids).shape, -np.inf, dtype=np.float32)
    for v in shards:
        scores = np.maximum(scores, score_passages(queries, v, ids))
    return max_scores(scores, queries.device) if distributed else scores

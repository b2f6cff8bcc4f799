"""Several processes, one corpus: each process holds a contiguous shard of the passages, searches it
(utils.search.exact), and the per-shard results are merged here into the result of the whole corpus, on every
process: the same as one process, ties aside (the selection rule of utils.search.kbest)."""

import numpy as np
import torch
import torch.distributed as dist

from utils.search.kbest import select_k_best


def shard(count: int, process_index: int, num_processes: int) -> range:
    """This process's contiguous share of `count` passages (the first ones get one more when it does not divide)."""
    per, extra = divmod(count, num_processes)
    first = process_index * per + min(process_index, extra)
    return range(first, first + per + (process_index < extra))


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def merged_top_k(scores: np.ndarray, ids: np.ndarray, k: int, device="cpu") -> tuple[np.ndarray, np.ndarray]:
    """Every process's top-k of its shard -> the top-k of the whole collection, on every process (the same
    selection rule as `top_k`: equal scores by the smaller id)."""
    if world_size() == 1:
        return scores, ids
    s, i = torch.as_tensor(scores, device=device), torch.as_tensor(ids, device=device)
    width = torch.tensor([s.shape[1]], device=device)
    widths = [torch.zeros_like(width) for _ in range(world_size())]
    dist.all_gather(widths, width)
    pad = int(max(w.item() for w in widths))  # a shard smaller than k returns fewer columns: pad to gather
    s = torch.cat([s, s.new_full((len(s), pad - s.shape[1]), float("-inf"))], 1)
    i = torch.cat([i, i.new_full((len(i), pad - i.shape[1]), -1)], 1)
    all_s = [torch.empty_like(s) for _ in range(world_size())]
    all_i = [torch.empty_like(i) for _ in range(world_size())]
    dist.all_gather(all_s, s)
    dist.all_gather(all_i, i)
    keep = int(min(k, sum(w.item() for w in widths)))
    return merge_columns(all_s, all_i, keep)


def merge_columns(scores: list, ids: list, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Several partial top-k results of the same queries (each queries x columns, -1 ids: none) -> their top k,
    by the selection rule (utils.search.kbest)."""
    s = torch.cat([torch.as_tensor(x, dtype=torch.float32) for x in scores], 1)
    i = torch.cat([torch.as_tensor(x, dtype=torch.long) for x in ids], 1)
    held = i >= 0
    keep = int(min(k, int(held.sum(1).max()) if len(i) else 0))
    best = select_k_best(torch.nonzero(held, as_tuple=True)[0], i[held], s[held], len(s), keep)
    return best[0].cpu().numpy(), best[1].cpu().numpy()


def _all_reduced(array: np.ndarray, op, device) -> np.ndarray:
    if world_size() == 1:
        return array
    t = torch.as_tensor(array, device=device)
    dist.all_reduce(t, op=op)
    return t.cpu().numpy()


def summed_counts(counts: np.ndarray, device="cpu") -> np.ndarray:
    """Per-shard counts -> their sums over the shards, on every process."""
    return _all_reduced(counts, dist.ReduceOp.SUM, device)


def max_scores(scores: np.ndarray, device="cpu") -> np.ndarray:
    """Per-shard scores (-inf where a shard does not hold the passage) -> every passage's score, on every process."""
    return _all_reduced(scores, dist.ReduceOp.MAX, device)

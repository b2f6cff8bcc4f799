"""The blockwise search engine equals a full-matrix reference: dot and cosine, whole passages and MaxP windows,
1 process and 2 gloo processes each holding half the passages."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from conftest import ROOT
from tolerance import assert_ranks_within, assert_top_k_of

from utils.search.exact import gold_scores, score_passages, top_k
from utils.search.kbest import KBest, passing
from utils.search.shards import shard
from utils.search.vectors import Vectors


def data(seed, cosine, windows, n_passages=300, n_queries=50, dim=16):
    rng = np.random.default_rng(seed)
    per = rng.integers(1, 6, n_passages) if windows else np.ones(n_passages, dtype=np.int64)
    owner = np.repeat(np.arange(n_passages), per)
    emb = rng.standard_normal((len(owner), dim)).astype(np.float32)
    q = rng.standard_normal((n_queries, dim)).astype(np.float32)
    if cosine:
        emb /= np.linalg.norm(emb, axis=1, keepdims=True)
        q /= np.linalg.norm(q, axis=1, keepdims=True)
    return q, emb, owner


def reference(q, emb, owner):
    """The full questions x passages matrix, each passage its best window."""
    window_scores = q @ emb.T
    return np.stack([window_scores[:, owner == p].max(1) for p in range(owner.max() + 1)], axis=1)


@pytest.mark.parametrize("cosine", [False, True], ids=["dot", "cosine"])
@pytest.mark.parametrize("windows", [False, True], ids=["passages", "maxp"])
def test_blockwise_search_equals_the_full_matrix(cosine, windows):
    q, emb, owner = data(1, cosine, windows)
    full = reference(q, emb, owner)
    gold = np.stack([np.arange(len(q)) % 300, np.full(len(q), -1)], axis=1)  # a "gold" passage per query
    thresholds = full[np.arange(len(q)), gold[:, 0]]
    vectors = Vectors(emb, owner if windows else None)
    for block_rows, query_block in ((37, 7), (10_000, 2048)):  # many blocks, and one
        scores, ids, counts = top_k(torch.from_numpy(q), vectors, 10, thresholds, gold, block_rows=block_rows,
                                    query_block=query_block)
        # torch's blocks against numpy's full matrix: two summation orders, so equal up to near-ties
        assert_top_k_of(ids, full)
        np.testing.assert_allclose(scores, np.sort(full, axis=1)[:, ::-1][:, :10], rtol=1e-5, atol=1e-6)
        # the rank of the gold passage: 1 + the others at or above it (ties against), as gold_ranks computes it
        assert_ranks_within(counts + 1, full, [[g] for g in gold[:, 0]])
    picked = np.stack([np.arange(5) * 7 % 300, np.full(5, 3), np.full(5, -1)], axis=1)[None].repeat(10, 0)[:, 0]
    got = score_passages(torch.from_numpy(q[:10]), vectors, picked)
    np.testing.assert_allclose(got[:, :2], np.take_along_axis(full[:10], picked[:, :2], 1), rtol=1e-5, atol=1e-6)
    assert (got[:, 2] == -np.inf).all()


@pytest.mark.parametrize("windows", [False, True], ids=["passages", "maxp"])
def test_the_bf16_prefilter_changes_nothing(windows):
    """Queries whose bf16 best of a block cannot reach their k-th best so far skip its fp32 scores: the same top k."""
    q, emb, owner = data(4, True, windows, n_passages=3000, n_queries=40)
    full = reference(q, emb, owner)
    vectors = Vectors(emb, owner if windows else None)
    scores, ids, _ = top_k(torch.from_numpy(q), vectors, 10, block_rows=64, prefilter=True)
    assert_top_k_of(ids, full)
    np.testing.assert_allclose(scores, np.sort(full, axis=1)[:, ::-1][:, :10], rtol=1e-5, atol=1e-6)


def test_k_larger_than_the_collection_and_nan_scores():
    q, emb, owner = data(2, False, True, n_passages=4)
    emb[owner == 2] = np.nan  # a diverged encoder's passage
    scores, ids, counts = top_k(torch.from_numpy(q), Vectors(emb, owner), 10, np.full(len(q), np.nan),
                                np.full((len(q), 1), 2))
    assert ids.shape == (len(q), 4) and (ids[:, -1] == 2).all() and (scores[:, -1] == -np.inf).all()
    assert (counts == 3).all()  # a NaN gold ranks last: every other passage is at or above it


def test_a_nan_window_is_dropped_whatever_the_blocks():
    """One rule in every path: a NaN window scores -inf before its passage takes its best window, so the passage
    scores by its other windows, whether it lies in the first block or a later one, and in gold_scores and
    score_passages alike."""
    q, emb, owner = data(5, cosine=True, windows=True, n_passages=60)
    bad = int(np.flatnonzero(np.bincount(owner) >= 2)[0])  # a passage with several windows
    emb[np.flatnonzero(owner == bad)[0]] = np.nan
    want = np.stack([np.where(np.isnan(q @ emb[owner == p].T), -np.inf, q @ emb[owner == p].T).max(1)
                     for p in range(owner.max() + 1)], axis=1)
    assert np.isfinite(want[:, bad]).all()
    vectors, qt = Vectors(emb, owner), torch.from_numpy(q)
    gold = np.full((len(q), 1), bad)
    for block_rows in (2, 7, 64, 4096):  # the bad passage in the first block, or in a later one
        scores, ids, _ = top_k(qt, vectors, 60, block_rows=block_rows, prefilter=False)
        got = np.take_along_axis(scores, np.argsort(ids, 1), 1)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(gold_scores(qt, vectors, gold, block_rows=block_rows), want[:, bad], rtol=1e-5)
    np.testing.assert_allclose(score_passages(qt, vectors, gold)[:, 0], want[:, bad], rtol=1e-5)


def test_entries_waiting_for_a_merge_give_the_k_best_of_merging_every_block():
    """KBest merges what passed the cut only every `merge_at` entries, under a floor that may be stale: the same k
    best (ties to the smaller id) as merging after every block, with rounded scores so that ties are many."""
    rng = np.random.default_rng(6)
    scores = torch.from_numpy(np.round(rng.standard_normal((30, 2000)), 1).astype(np.float32))
    want = np.lexsort((np.arange(2000)[None].repeat(30, 0), -scores.numpy()), axis=1)[:, :15]
    for merge_at in (1, 40, 10**9):
        best = KBest(30, 15, "cpu", merge_at=merge_at)
        for first in range(0, 2000, 64):
            rows = torch.arange(30) if first % 3 else torch.arange(0, 30, 2)  # some blocks for some queries only
            best.add(scores[rows, first:first + 64], rows, first)
        best.flush()
        assert best.ids[::2].tolist() == want[::2].tolist(), merge_at  # the queries that saw every block
        assert torch.equal(best.scores, torch.gather(scores, 1, best.ids)), merge_at


@pytest.mark.parametrize("width", [256, 300, 100])
def test_scores_passing_a_cut_are_found_run_by_run_as_score_by_score(width):
    """`passing` checks runs of columns by their maximum first: the same (row, column) pairs, grouped by row and in
    column order, as comparing every score (with a tail shorter than a run, and rows whose cut nothing reaches)."""
    rng = np.random.default_rng(7)
    scores = torch.from_numpy(np.round(rng.standard_normal((40, width)), 1).astype(np.float32))
    scores[3] = float("-inf")
    cut = torch.from_numpy(rng.uniform(1.0, 3.5, 40).astype(np.float32))
    cut[5] = float("-inf")  # a row before its first merge: every score passes
    r, c = passing(scores, cut)
    want_r, want_c = torch.nonzero(scores >= cut[:, None], as_tuple=True)
    assert torch.equal(r, want_r) and torch.equal(c, want_c)


def test_shards_cover_the_passages_once():
    assert [list(shard(7, r, 3)) for r in range(3)] == [[0, 1, 2], [3, 4], [5, 6]]
    assert [len(shard(2, r, 3)) for r in range(3)] == [1, 1, 0]


WORKER = textwrap.dedent("""
    import sys
    sys.path[:0] = [{root!r}, {tests!r}]
    import numpy as np, torch, torch.distributed as dist
    from test_search import data, reference
    from tolerance import assert_ranks_within, assert_top_k_of
    from utils.search.exact import score_passages, top_k
    from utils.search.shards import max_scores, merged_top_k, shard, summed_counts
    from utils.search.vectors import Vectors
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    for cosine in (False, True):
        for windows in (False, True):
            q, emb, owner = data(3, cosine, windows)
            full = reference(q, emb, owner)
            mine = shard(owner.max() + 1, rank, world)
            rows = (owner >= mine.start) & (owner < mine.stop)  # this process holds half the passages, no more
            vectors = Vectors(emb[rows], owner[rows] - mine.start if windows else None, len(mine), mine.start)
            thresholds = full[:, 5]
            scores, ids, counts = top_k(torch.from_numpy(q), vectors, 20, thresholds, np.full((len(q), 1), 5),
                                        block_rows=50)
            scores, ids = merged_top_k(scores, ids, 20)
            assert_top_k_of(ids, full)
            assert_ranks_within(summed_counts(counts) + 1, full, [[5]] * len(q))
            picked = np.tile([3, 290, 150], (len(q), 1))
            got = max_scores(score_passages(torch.from_numpy(q), vectors, picked))
            np.testing.assert_allclose(got, full[:, [3, 290, 150]], rtol=1e-5, atol=1e-6)
    open({out!r} + f"/rank{{rank}}.ok", "w").close()
    dist.destroy_process_group()
""")


def test_two_processes_each_holding_half_the_passages_find_the_same(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER.format(root=ROOT, tests=os.path.join(ROOT, "tests"), out=str(tmp_path)))
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           str(script)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "rank0.ok").exists() and (tmp_path / "rank1.ok").exists()

"""Length-grouped batches: a permutation, deterministic per (seed, epoch), and much less padding."""

import numpy as np
import torch

from utils.runtime.batching import LengthGroupedBatchSampler, pad_batch


def padded_fraction(batches, lengths):
    real = sum(lengths[i] for b in batches for i in b)
    padded = sum(max(lengths[i] for i in b) * len(b) for b in batches)
    return real / padded


def test_every_index_once_and_deterministic_per_epoch():
    lengths = np.random.default_rng(0).integers(20, 400, size=1000)
    sampler = LengthGroupedBatchSampler(lengths, 16, seed=3)
    first = list(sampler)
    assert sorted(i for b in first for i in b) == list(range(1000)) and len(first) == len(sampler)
    assert list(sampler) == first
    sampler.epoch = 1
    assert list(sampler) != first


def test_grouping_cuts_padding_but_keeps_batches_random():
    lengths = np.random.default_rng(0).integers(20, 400, size=2000)
    grouped = list(LengthGroupedBatchSampler(lengths, 16, seed=0))
    plain = list(LengthGroupedBatchSampler(lengths, 16, seed=0, group_by_length=False))
    assert padded_fraction(grouped, lengths) > 0.95 > padded_fraction(plain, lengths)
    maxima = [max(lengths[i] for i in b) for b in grouped]
    assert maxima != sorted(maxima) and maxima != sorted(maxima, reverse=True)


def test_lengths_that_change_with_the_epoch_are_grouped_by_the_epochs_own():
    rng = np.random.default_rng(0)
    per_epoch = {e: rng.integers(20, 400, size=2000) for e in range(2)}
    sampler = LengthGroupedBatchSampler(per_epoch.__getitem__, 16, seed=0)
    for e in range(2):
        sampler.set_epoch(e)
        batches = list(sampler)
        assert sorted(i for b in batches for i in b) == list(range(2000))
        assert padded_fraction(batches, per_epoch[e]) > 0.95 > padded_fraction(batches, per_epoch[1 - e])


def test_pad_batch_pads_to_multiple_of_eight():
    rows = [{"input_ids": [5, 6, 7], "attention_mask": [1, 1, 1], "start_positions": 1},
            {"input_ids": [5] * 10, "attention_mask": [1] * 10, "start_positions": 0}]
    batch = pad_batch(rows, pad_token_id=0)
    assert batch["input_ids"].shape == (2, 16) and batch["attention_mask"][0].sum() == 3
    assert torch.equal(batch["start_positions"], torch.tensor([1, 0]))


def test_sharded_across_processes_every_batch_is_used_in_every_epoch():
    """Accelerate's BatchSamplerShard yields a round of batches only when the round's last batch is full: the
    epoch's one short batch must come last, or a whole round is silently dropped on every process."""
    from accelerate.data_loader import BatchSamplerShard

    lengths = np.random.default_rng(0).integers(20, 400, size=1000)  # 62 full batches of 16 and one of 8
    sampler = LengthGroupedBatchSampler(lengths, 16, seed=0)
    shards = [BatchSamplerShard(sampler, num_processes=2, process_index=r) for r in range(2)]
    for epoch in range(12):
        sampler.epoch = epoch
        per_process = [list(shard) for shard in shards]
        assert [len(b) for b in per_process] == [len(shard) for shard in shards] == [32, 32], epoch
        seen = [i for batches in per_process for b in batches for i in b]
        assert set(seen) == set(range(1000)) and len(seen) - 1000 < 16 * 2, epoch  # repeats: even-batches padding

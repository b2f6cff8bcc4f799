"""Batching: length-grouped random batches and padding to the longest input (a multiple of 8).

Padding every window to max_seq_length wastes most of the compute on SQuAD-like data; padding to
the batch's longest input helps, and grouping inputs of similar length into the same batch helps
more. Batches stay random: indices are shuffled, cut into mega-chunks of 50 batches, sorted by
length inside each chunk, cut into batches, and the batch order is shuffled again.
"""

import numpy as np
import torch


class LengthGroupedBatchSampler(torch.utils.data.Sampler):
    """Yields lists of indices. The order is a pure function of (seed, epoch): `set_epoch` before
    iterating, and a resumed run that skips the first k batches sees exactly the batches it missed.
    `epoch_items(epoch)`, where given, chooses the inputs of each epoch (as many every epoch: the updates are
    planned from this sampler's length); by default every input, every epoch. `lengths`: one per input, or a
    function of the epoch giving them (an input whose length changes with the epoch, as a question read with
    passages drawn anew each epoch: grouped by what it is in this epoch)."""

    def __init__(self, lengths, batch_size: int, seed: int, group_by_length: bool = True, mega_batches: int = 50,
                 epoch_items=None):
        self.lengths = lengths
        self.batch_size, self.seed, self.group_by_length = batch_size, seed, group_by_length
        self.mega = mega_batches * batch_size
        self.epoch_items = epoch_items
        self.epoch = 0
        self._of_epoch = (None, None)  # (epoch, lengths(epoch)): asked for by len() and iter() alike

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _lengths(self) -> np.ndarray:
        if not callable(self.lengths):
            return np.asarray(self.lengths)
        if self._of_epoch[0] != self.epoch:
            self._of_epoch = (self.epoch, np.asarray(self.lengths(self.epoch)))
        return self._of_epoch[1]

    def _items(self) -> np.ndarray:
        return np.arange(len(self._lengths())) if self.epoch_items is None else np.asarray(self.epoch_items(self.epoch))

    def __len__(self):
        return (len(self._items()) + self.batch_size - 1) // self.batch_size

    def __iter__(self):
        rng = np.random.default_rng([self.seed, self.epoch])
        items = self._items()
        order = items[rng.permutation(len(items))]
        if not self.group_by_length:
            yield from (order[i:i + self.batch_size].tolist() for i in range(0, len(order), self.batch_size))
            return
        batches, lengths = [], self._lengths()
        for c in range(0, len(order), self.mega):
            chunk = order[c:c + self.mega]
            chunk = chunk[np.argsort(-lengths[chunk], kind="stable")]
            batches += [chunk[i:i + self.batch_size] for i in range(0, len(chunk), self.batch_size)]
        # The epoch's one short batch (the last one cut) stays last: Accelerate's BatchSamplerShard yields a
        # round of batches only if the round's last batch is full, so a short batch shuffled into the middle
        # made every process drop a whole round (and the planned updates overran the real ones).
        full = len(batches) - (len(batches[-1]) < self.batch_size)
        for b in list(rng.permutation(full)) + list(range(full, len(batches))):
            yield batches[b].tolist()


def round_up(n: int, multiple: int = 8) -> int:
    return -(-n // multiple) * multiple


def pad_batch(features: list[dict], pad_token_id: int, multiple: int = 8) -> dict:
    """Stack tokenised features into tensors, padding sequences to the longest (rounded up to `multiple`)
    so that fp16/bf16 matrix shapes stay tensor-core friendly. Scalar fields (labels) are stacked."""
    width = round_up(max(len(f["input_ids"]) for f in features), multiple)
    batch = {}
    for key in features[0]:
        values = [f[key] for f in features]
        if isinstance(values[0], (list, tuple)):
            pad = pad_token_id if key == "input_ids" else 0
            batch[key] = torch.tensor([list(v) + [pad] * (width - len(v)) for v in values], dtype=torch.long)
        else:
            batch[key] = torch.tensor(values)
    return batch

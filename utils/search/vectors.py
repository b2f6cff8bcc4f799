"""The vectors a search reads: a corpus's passage embeddings, or one shard of them, and how a search walks them.

Rows are the passages themselves or, for a sentence-trained retriever, their sentence windows in passage order, each
with its passage (`owner`); a shard knows the global id of its first passage (`offset`). A search reads the rows
block by block, each block cut on passage boundaries, so that every passage's windows are scored together.
"""

from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class Vectors:
    """Embeddings of passages, or of this process's shard of them. Rows are the passages themselves or, with
    `owner`, their sentence windows in passage order (owner[row] = the local passage, non-decreasing). `offset` is
    the global id of local passage 0. `embeddings` may be a numpy memmap (float16 or float32)."""

    embeddings: object  # (rows, dim): np.ndarray (memmap) or torch.Tensor
    owner: np.ndarray | None = None
    count: int | None = None  # passages; default: one per row
    offset: int = 0

    def __post_init__(self):
        rows = len(self.embeddings)
        if self.count is None:
            self.count = int(self.owner[-1]) + 1 if self.owner is not None and rows else rows
        if self.owner is None:
            self.starts = np.arange(self.count + 1, dtype=np.int64)
        else:
            self.starts = np.searchsorted(self.owner, np.arange(self.count + 1)).astype(np.int64)
        if self.starts[-1] != rows:
            raise ValueError(f"{rows} embedding rows but the owners account for {self.starts[-1]}")

    def rows(self, first: int, last: int, device) -> torch.Tensor:
        """Embedding rows first:last as float32 on `device`."""
        return self._tensor(self.embeddings[first:last], device)

    def take(self, rows: np.ndarray, device) -> torch.Tensor:
        """The given embedding rows as float32 on `device`."""
        if isinstance(self.embeddings, torch.Tensor):
            return self._tensor(self.embeddings[torch.as_tensor(rows)], device)
        return self._tensor(self.embeddings[rows], device)

    @staticmethod
    def _tensor(block, device) -> torch.Tensor:
        if not isinstance(block, torch.Tensor):
            block = np.asarray(block)
            if not block.flags.writeable:  # a read-only memory map (a saved index): torch wants memory it may write
                block = block.astype(np.float32)
            block = torch.from_numpy(block)
        return block.to(device=device, dtype=torch.float32)


def blocks(vectors: Vectors, block_rows: int):
    """(first passage, last passage) ranges of about block_rows rows each, cut on passage boundaries."""
    first = 0
    while first < vectors.count:
        last = int(np.searchsorted(vectors.starts, vectors.starts[first] + block_rows, side="right")) - 1
        last = min(max(last, first + 1), vectors.count)
        yield first, last
        first = last


def vector_blocks(vectors: Vectors, block_rows: int, device):
    """(first passage, last passage, their vectors as float32 on `device`) block by block (`blocks`)."""
    for first, last in blocks(vectors, block_rows):
        yield first, last, vectors.rows(vectors.starts[first], vectors.starts[last], device)

"""A passage cut into sentence windows scores as its best window (MaxP): the window scores of a block of vectors
become passage scores, either all at once (a segment max over the block) or, once a search has a cut, only for the
few windows that reach it. Blocks end on passage boundaries (utils.search.vectors), so either way is exact."""

import numpy as np
import torch

from utils.search.kbest import KBest, passing
from utils.search.vectors import Vectors


def passage_scores(scores: torch.Tensor, vectors: Vectors, first: int, last: int) -> torch.Tensor:
    """Window scores (queries x rows of passages first:last) -> passage scores (their best window)."""
    if vectors.owner is not None and vectors.starts[last] - vectors.starts[first] != last - first:
        local = vectors.starts[first:last] - vectors.starts[first]
        if scores.device.type == "cpu":  # numpy's segment max: one pass, no index tensor
            scores = torch.from_numpy(np.maximum.reduceat(scores.numpy(), local, axis=1))
        else:
            owner = torch.as_tensor(np.asarray(vectors.owner[vectors.starts[first]:vectors.starts[last]], np.int64)
                                    - first, device=scores.device)
            best = scores.new_full((len(scores), last - first), float("-inf"))
            scores = best.scatter_reduce_(1, owner.expand(len(scores), -1), scores, reduce="amax")
    return scores


def add_windows(best: KBest, scores: torch.Tensor, rows: torch.Tensor, vectors: Vectors, first: int) -> None:
    """MaxP without a segment max over the whole block: a passage can only enter the k best through a window at
    or above the cut, and then its score is the best of those windows. So cut the window scores, and take the
    best window of each passage among the few that pass (its windows are consecutive in a row)."""
    r, c = passing(scores, best.floor[rows])
    if not len(r):
        return
    base = int(vectors.starts[first])
    passage = torch.from_numpy(np.asarray(vectors.owner[base + c.cpu().numpy()], dtype=np.int64)).to(r.device)
    new = torch.ones(len(r), dtype=torch.bool, device=r.device)
    new[1:] = (r[1:] != r[:-1]) | (passage[1:] != passage[:-1])
    group = new.cumsum(0) - 1
    vals = torch.full((int(group[-1]) + 1,), float("-inf"), device=r.device).scatter_reduce_(
        0, group, scores[r, c], reduce="amax")
    best.add_entries(rows[r[new]], passage[new] + vectors.offset, vals)

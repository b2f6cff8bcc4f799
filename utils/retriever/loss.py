"""DPR's contrastive loss over in-batch and hard negatives, global across processes (GradCache: utils.loop.grad_cache).

Passages of a batch are laid out question by question: [positive_0, negatives_0..., positive_1, ...],
so question i's positive is passage i * (1 + num_negatives). Every question is scored against every
passage of the global batch (all processes). A passage with the same key (passage_id, else text) as
the question's own positive, other than that positive itself, is masked: in SQuAD-derived data many
questions share a gold paragraph, and it must not count as a negative of its own question.
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F

from utils.search.ranking import gold_ranks


def contrastive_scores(q: torch.Tensor, p: torch.Tensor, positive_idx: torch.Tensor, passage_keys: torch.Tensor,
                       temperature: float) -> torch.Tensor:
    """Similarity logits (questions x passages) / temperature, duplicates of each positive masked to -inf."""
    return _mask_duplicates((q @ p.T) / temperature, positive_idx, passage_keys)


def _mask_duplicates(scores, positive_idx, passage_keys):
    own = passage_keys[positive_idx]
    duplicate = passage_keys.unsqueeze(0) == own.unsqueeze(1)
    duplicate[torch.arange(len(scores), device=scores.device), positive_idx] = False
    return scores.masked_fill(duplicate, float("-inf"))


def _positions(n_questions: int, n_passages: int, device) -> torch.Tensor:
    """Where each question's positive is in the question-by-question layout."""
    return torch.arange(n_questions, device=device) * (n_passages // n_questions)


def batch_ranks(scores: torch.Tensor, passage_keys: torch.Tensor) -> torch.Tensor:
    """Rank of each question's positive among the passages of its batch, from scores (questions x passages) laid
    out as in training; duplicates of the positive do not count; ties and NaN as in every other ranking
    (utils.search.ranking)."""
    positive_idx = _positions(*scores.shape, scores.device)
    masked = _mask_duplicates(scores, positive_idx, passage_keys)
    return torch.from_numpy(gold_ranks(masked.cpu().numpy(), [[int(j)] for j in positive_idx]))


def dpr_loss(q, p, passage_keys, temperature: float) -> torch.Tensor:
    """Mean cross-entropy of each question's positive among every passage of the batch."""
    positive_idx = _positions(len(q), len(p), q.device)
    return F.cross_entropy(contrastive_scores(q, p, positive_idx, passage_keys, temperature), positive_idx)


def world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


def gather_with_grad(t: torch.Tensor) -> torch.Tensor:
    """Concatenate `t` from every process in rank order. The local slice keeps its autograd graph; the
    others are constants (their gradients are computed by the processes that own them)."""
    size, rank = world()
    if size == 1:
        return t
    parts = [torch.empty_like(t) for _ in range(size)]
    dist.all_gather(parts, t.detach().contiguous())
    parts[rank] = t
    return torch.cat(parts)


def global_loss(q, p, passage_keys, temperature):
    """The loss of the whole global batch, computed identically on every process. DDP averages gradients
    over processes and each process's backward reaches only its own embeddings, so the returned
    `for_backward` = loss x world size makes the averaged gradient exactly the global-batch gradient."""
    size, _ = world()
    loss = dpr_loss(gather_with_grad(q), gather_with_grad(p), gather_with_grad(passage_keys), temperature)
    return loss, loss * size

"""DPR's contrastive loss over in-batch and hard negatives, global across processes, and GradCache.

Passages of a batch are laid out question by question: [positive_0, negatives_0..., positive_1, ...],
so question i's positive is passage i * (1 + num_negatives). Every question is scored against every
passage of the global batch (all processes). A passage with the same key (passage_id, else text) as
the question's own positive, other than that positive itself, is masked: in SQuAD-derived data many
questions share a gold paragraph, and it must not count as a negative of its own question.
"""

import contextlib

import torch
import torch.distributed as dist
import torch.nn.functional as F


def contrastive_scores(q: torch.Tensor, p: torch.Tensor, positive_idx: torch.Tensor, passage_keys: torch.Tensor,
                       temperature: float) -> torch.Tensor:
    """Similarity logits (questions x passages) / temperature, duplicates of each positive masked to -inf."""
    scores = (q @ p.T) / temperature
    own = passage_keys[positive_idx]
    duplicate = passage_keys.unsqueeze(0) == own.unsqueeze(1)
    duplicate[torch.arange(len(q), device=q.device), positive_idx] = False
    return scores.masked_fill(duplicate, float("-inf"))


def dpr_loss(q, p, passage_keys, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean cross-entropy of each question's positive, rank of each positive among the batch's passages)."""
    per_question = len(p) // len(q)
    positive_idx = torch.arange(len(q), device=q.device) * per_question
    scores = contrastive_scores(q, p, positive_idx, passage_keys, temperature)
    loss = F.cross_entropy(scores, positive_idx)
    ranks = (scores > scores.gather(1, positive_idx[:, None])).sum(1) + 1
    return loss, ranks


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
    loss, ranks = dpr_loss(gather_with_grad(q), gather_with_grad(p), gather_with_grad(passage_keys), temperature)
    return loss, loss * size, ranks


class RandState:
    """CPU and CUDA RNG state, so a chunk's second forward draws the same dropout masks as its first."""

    def __init__(self):
        self.cpu = torch.get_rng_state()
        self.cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None

    @contextlib.contextmanager
    def replay(self):
        torch.set_rng_state(self.cpu)
        if self.cuda is not None:
            torch.cuda.set_rng_state_all(self.cuda)
        yield


def grad_cache_step(accelerator, model, query: dict, passage: dict, passage_keys, temperature, chunk_size: int,
                    weight: float = 1.0):
    """One full-batch step in memory for `chunk_size` questions (Gao et al., 2021, "Scaling Deep Contrastive
    Learning Batch Size under Memory Limited Setup"): embed every chunk without a graph, take the loss and its
    gradient w.r.t. the embeddings over the whole (global) batch, then re-embed chunk by chunk with a graph and
    backpropagate those cached embedding gradients. Same gradients as the plain step, memory of one chunk.
    `weight` scales the backpropagated loss, as in Task.train_step."""
    n_q = len(query["input_ids"])
    per_question = len(passage["input_ids"]) // n_q
    chunks = [(slice(s, min(s + chunk_size, n_q)), slice(s * per_question, min(s + chunk_size, n_q) * per_question))
              for s in range(0, n_q, chunk_size)]
    take = lambda inputs, sl: {k: v[sl] for k, v in inputs.items()}  # noqa: E731

    states, q_parts, p_parts = [], [], []
    with torch.no_grad():
        for qs, ps in chunks:
            states.append(RandState())
            q_emb, p_emb = model(query=take(query, qs), passage=take(passage, ps))
            q_parts.append(q_emb)
            p_parts.append(p_emb)
    q_all = torch.cat(q_parts).requires_grad_()
    p_all = torch.cat(p_parts).requires_grad_()
    loss, for_backward, _ = global_loss(q_all, p_all, passage_keys, temperature)
    for_backward.backward()  # only to the embeddings: no parameters are involved yet

    for i, ((qs, ps), state) in enumerate(zip(chunks, states)):
        last = i == len(chunks) - 1
        with state.replay(), (contextlib.nullcontext() if last else accelerator.no_sync(model)):
            q_emb, p_emb = model(query=take(query, qs), passage=take(passage, ps))
            surrogate = (q_emb * q_all.grad[qs]).sum() + (p_emb * p_all.grad[ps]).sum()
            accelerator.backward(surrogate * weight)
    return loss.detach()

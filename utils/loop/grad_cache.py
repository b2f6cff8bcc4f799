"""GradCache (Gao et al., 2021, "Scaling Deep Contrastive Learning Batch Size under Memory Limited Setup"): one
training step of a contrastive loss over a whole batch, in the memory of one chunk of it.

1. Embed every chunk without an autograd graph (remembering each chunk's RNG state).
2. Compute the whole batch's loss from those embeddings and its gradient w.r.t. the embeddings only.
3. Embed each chunk again, now with a graph and the same dropout masks, and backpropagate the cached embedding
   gradients through it (the surrogate sum(embedding * cached gradient) has exactly that gradient).

The parameter gradients equal the full-batch step's. Under DDP every chunk but the last backpropagates inside
`no_sync`, so gradients are all-reduced once per step. Model-agnostic: the task gives the chunks, how a chunk is
embedded and the loss; utils.retriever.dpr_task uses it for DPR's --grad_cache_chunk_size.
"""

import contextlib

import torch


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


def grad_cache_step(accelerator, model, chunks: list, forward, loss, weight: float = 1.0) -> torch.Tensor:
    """`forward(model, chunk)` -> a tuple of embedding tensors (rows = the chunk's items); `loss(*whole_batch)`,
    called with each tuple position concatenated over the chunks, -> (loss to backpropagate, loss to log).
    `weight` scales the backpropagated loss, as in Task.train_step. Returns the detached loss to log."""
    states, outputs = [], []
    with torch.no_grad():
        for chunk in chunks:
            states.append(RandState())
            outputs.append(forward(model, chunk))
    whole = [torch.cat(parts).requires_grad_() for parts in zip(*outputs)]
    backprop, logged = loss(*whole)
    backprop.backward()  # only to the embeddings: no parameters are involved yet

    offsets = [0] * len(whole)
    for i, (chunk, state) in enumerate(zip(chunks, states)):
        last = i == len(chunks) - 1
        with state.replay(), (contextlib.nullcontext() if last else accelerator.no_sync(model)):
            surrogate = 0.0
            for j, emb in enumerate(forward(model, chunk)):
                surrogate = surrogate + (emb * whole[j].grad[offsets[j]:offsets[j] + len(emb)]).sum()
                offsets[j] += len(emb)
            accelerator.backward(surrogate * weight)
    return logged.detach()

"""Passage selection (DPR's reader, Karpukhin et al. 2020): a score per window from its [CLS] vector, trained beside
the span loss to pick, among the passages read with a question, the ones that hold its answer.

The head is one linear layer on the encoder's last hidden state at [CLS] (`hidden_states[-1]`), kept on the QA
model as `passage_selection` so that the optimizer, DDP, checkpoints and `save_pretrained` carry it with the rest of
the weights (model.safetensors holds `passage_selection.weight`/`.bias`; a plain transformers load ignores them,
utils.reader.trained.load_qa_model restores them). Its loss is a softmax over all the windows a question reads
(train_reader.py --passages_per_question): minus the log of the probability it gives the windows holding a labelled
answer, as DPR trains it over its positive and negative passages; a question with no such window (unanswerable, or
its answer cut by the window length) trains no selection. Read, a passage's selection score is the log-sum-exp of
its windows' (the log of its share of that softmax, up to the question's normaliser, which the rule cancels), and
the QA system weighs it on every logit of the passage as it weighs the retriever's score (utils.system.answer).
"""

import torch

from utils.loop.errors import UserError
from utils.reader.decoding import MODEL_INPUTS
from utils.reader.shared_norm import NEG

HEAD = "passage_selection"


def attach_selection_head(model) -> torch.nn.Linear:
    """A new selection head on `model` (initialised as transformers initialises a linear layer: normal with the
    config's initializer_range, zero bias). An encoder's only: an encoder-decoder's QA output has no hidden states of
    one sequence to read [CLS] from."""
    config = model.config
    if getattr(config, "is_encoder_decoder", False):
        raise UserError(f"--passage_selection: {config.model_type} is an encoder-decoder model; the passage-selection "
                        "head reads an encoder's [CLS]")
    head = torch.nn.Linear(config.hidden_size, 1)
    torch.nn.init.normal_(head.weight, std=getattr(config, "initializer_range", 0.02))
    torch.nn.init.zeros_(head.bias)
    setattr(model, HEAD, head)
    return head


def selection_head(model):
    """The selection head of a QA model (under DDP too), or None."""
    return getattr(getattr(model, "module", model), HEAD, None)


def reader_logits(model, batch: dict):
    """(start logits, end logits, selection scores per window, None for a model without the head): one forward
    pass."""
    head = selection_head(model)
    out = model(**{k: v for k, v in batch.items() if k in MODEL_INPUTS}, output_hidden_states=head is not None)
    scores = head(out.hidden_states[-1][:, 0]).squeeze(-1) if head is not None else None
    return out.start_logits, out.end_logits, scores


def selection_loss(scores: torch.Tensor, batch: dict) -> torch.Tensor:
    """Mean over the batch's questions of -log(the softmax's probability, over all the windows a question reads, of
    those holding a labelled answer); a question with none adds 0. `batch`: "group" (each window's question),
    "start_target" (windows x positions, utils.reader.shared_norm.group_batch: a window's answer starts, or its
    [CLS] where the question trains towards no answer)."""
    group = batch["group"]
    questions = int(group.max()) + 1
    positive = batch["start_target"][:, 1:].any(dim=1)
    scores = scores.float()
    # tied to the head even when no question here has a positive: its gradient is then 0, not missing, which DDP
    # (every parameter reduced on every process) needs
    total = scores.sum() * 0.0
    for g in range(questions):
        rows = group == g
        if positive[rows].any():
            total = total + torch.logsumexp(scores[rows], 0) - torch.logsumexp(scores[rows].masked_fill(
                ~positive[rows], NEG), 0)
    return total / questions

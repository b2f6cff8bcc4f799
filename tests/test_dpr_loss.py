"""DPR loss (in-batch + hard negatives, duplicate-positive masking) and GradCache equivalence."""

import math

import pytest
import torch
from accelerate import Accelerator

from utils.loop.grad_cache import grad_cache_step
from utils.retriever.bi_encoder import BiEncoder
from utils.retriever.loss import batch_ranks, contrastive_scores, dpr_loss, global_loss


def test_loss_by_hand_with_hard_negatives():
    # 2 questions, each with [positive, hard negative]: passages p0+ p1- p2+ p3-
    q = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    p = torch.tensor([[2.0, 0.0], [1.0, 1.0], [0.0, 3.0], [0.0, 0.0]])
    keys = torch.tensor([10, 11, 12, 13])
    loss = dpr_loss(q, p, keys, temperature=1.0)
    # q0 scores: [2, 1, 0, 0], positive 0; q1 scores: [0, 1, 3, 0], positive 2
    l0 = -2 + math.log(math.exp(2) + math.exp(1) + 1 + 1)
    l1 = -3 + math.log(1 + math.exp(1) + math.exp(3) + 1)
    assert loss.item() == pytest.approx((l0 + l1) / 2, rel=1e-6)
    assert batch_ranks(q @ p.T, keys).tolist() == [1, 1]


def test_temperature_divides_the_logits():
    q, p, keys = torch.tensor([[1.0, 0.0]]), torch.tensor([[1.0, 0.0], [0.0, 1.0]]), torch.tensor([1, 2])
    loss = dpr_loss(q, p, keys, temperature=0.5)
    assert loss.item() == pytest.approx(-2 + math.log(math.exp(2) + 1), rel=1e-6)


def test_a_shared_gold_passage_is_not_a_negative_of_its_own_question():
    # q0 and q1 share gold passage key 7 (slots 0 and 2); q2's positive is different.
    q = torch.eye(3)
    p = torch.tensor([[1.0, 0, 0], [0, 0, 0], [0.5, 1.0, 0], [0, 0, 0], [0, 0, 1.0], [0, 0, 0]])
    keys = torch.tensor([7, 1, 7, 2, 8, 3])
    pos = torch.tensor([0, 2, 4])
    scores = contrastive_scores(q, p, pos, keys, 1.0)
    assert scores[0, 2] == float("-inf") and scores[1, 0] == float("-inf")  # each other's copy of their gold
    assert torch.isfinite(scores[2]).all()  # q2 keeps every passage as a negative
    loss = dpr_loss(q, p, keys, 1.0)
    # q1 by hand: scores over [p0 masked, p1, p2 (+), p3, p4, p5] = [-, 0, 1, 0, 0, 0]
    l1 = -1 + math.log(4 + math.e)
    unmasked = torch.nn.functional.cross_entropy((q @ p.T)[1:2], torch.tensor([2]))
    per_q = torch.nn.functional.cross_entropy(scores, pos, reduction="none")
    assert per_q[1].item() == pytest.approx(l1, rel=1e-6) and unmasked.item() > l1
    assert loss.item() == pytest.approx(per_q.mean().item())


def test_global_loss_is_the_plain_loss_in_one_process():
    q, p, keys = torch.randn(4, 8), torch.randn(8, 8), torch.arange(8)
    loss, for_backward = global_loss(q, p, keys, 0.1)
    assert torch.equal(loss, dpr_loss(q, p, keys, 0.1)) and torch.equal(for_backward, loss)


def _batch(tokenizer):
    questions = [f"question number {i} about the lighthouse?" for i in range(8)]
    passages = [f"passage {i} says the tower is {i * 3} metres tall and painted {i} times" for i in range(16)]
    keys = torch.tensor([0, 1, 2, 3, 0, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15])  # q0 and q2 share a gold passage
    return (dict(tokenizer(questions, padding=True, return_tensors="pt")),
            dict(tokenizer(passages, padding=True, return_tensors="pt")), keys)


def _grads(model_dir, step, dropout: bool):
    model = BiEncoder.from_pretrained(model_dir, model_dir, False, "mean", True)
    model.train(dropout)
    torch.manual_seed(123)
    loss = step(model)
    return loss, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _assert_same(a, b):
    """Stated tolerance: every gradient within 1e-5 of its tensor's largest entry (fp32)."""
    (loss_a, ga), (loss_b, gb) = a, b
    assert loss_a.item() == pytest.approx(loss_b.item(), rel=1e-6)
    assert ga.keys() == gb.keys() and len(ga) > 10
    for name in ga:
        scale = ga[name].abs().max().item() + 1e-12
        assert (ga[name] - gb[name]).abs().max().item() <= 1e-5 * scale + 1e-9, name


def _grad_cache(accelerator, model, q_in, p_in, keys, chunk):
    """DPR's GradCache step (as utils.retriever.dpr_task builds it): chunks of `chunk` questions with their passages."""
    per_question = len(p_in["input_ids"]) // len(q_in["input_ids"])
    chunks = [{"query": {k: v[s:s + chunk] for k, v in q_in.items()},
               "passage": {k: v[s * per_question:(s + chunk) * per_question] for k, v in p_in.items()}}
              for s in range(0, len(q_in["input_ids"]), chunk)]
    return grad_cache_step(accelerator, model, chunks, lambda m, c: m(**c),
                           lambda q, p: global_loss(q, p, keys, 0.05)[::-1], 1.0)  # (for_backward, loss)


@pytest.mark.parametrize("chunk", [1, 3, 8])
def test_grad_cache_gradients_equal_full_batch_gradients(tiny_bert_dir, tokenizer, chunk):
    accelerator = Accelerator(cpu=True)
    q_in, p_in, keys = _batch(tokenizer)

    def full_batch(model):
        q, p = model(query=q_in, passage=p_in)
        loss, for_backward = global_loss(q, p, keys, 0.05)
        for_backward.backward()
        return loss

    cached = lambda m: _grad_cache(accelerator, m, q_in, p_in, keys, chunk)  # noqa: E731
    _assert_same(_grads(tiny_bert_dir, full_batch, dropout=False), _grads(tiny_bert_dir, cached, dropout=False))


def test_grad_cache_replays_dropout_masks(tiny_bert_dir, tokenizer):
    """With dropout, the reference is the same chunked forward kept in memory: GradCache's second forward
    must draw the masks of its first one, or its gradients would belong to a different function."""
    accelerator = Accelerator(cpu=True)
    q_in, p_in, keys = _batch(tokenizer)
    chunk = 3

    def chunked_in_memory(model):
        qs, ps = [], []
        for s in range(0, 8, chunk):
            q, p = model(query={k: v[s:s + chunk] for k, v in q_in.items()},
                         passage={k: v[2 * s:2 * (s + chunk)] for k, v in p_in.items()})
            qs.append(q)
            ps.append(p)
        loss, for_backward = global_loss(torch.cat(qs), torch.cat(ps), keys, 0.05)
        for_backward.backward()
        return loss

    cached = lambda m: _grad_cache(accelerator, m, q_in, p_in, keys, chunk)  # noqa: E731
    _assert_same(_grads(tiny_bert_dir, chunked_in_memory, dropout=True), _grads(tiny_bert_dir, cached, dropout=True))


def test_in_batch_ranks_count_ties_against_the_positive_and_nan_last():
    """The rule of every other ranking (utils.search.ranking): a tie is ahead of the positive, NaN is last."""
    keys = torch.tensor([1, 2, 3, 4])  # 2 questions x [positive, negative]
    scores = torch.tensor([[0.5, 0.5, 0.1, 0.0], [0.2, 0.1, float("nan"), 0.0]])
    assert batch_ranks(scores, keys).tolist() == [2, 4]
    scores = torch.tensor([[0.5, float("nan"), 0.1, 0.0], [0.2, 0.1, 0.3, float("nan")]])
    assert batch_ranks(scores, keys).tolist() == [1, 1]

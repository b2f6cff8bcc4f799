import numpy as np
import pytest

from utils.search.ranking import count_at_least, gold_ranks, retrieval_metrics


def test_ranks_topk_mrr_by_hand():
    scores = np.array([[0.9, 0.1, 0.5, 0.3],   # gold 0 -> rank 1
                       [0.9, 0.1, 0.5, 0.3],   # gold 2 -> rank 2
                       [0.9, 0.1, 0.5, 0.3],   # gold {1, 3}: best is 3 (0.3) -> rank 3
                       [0.2, 0.2, 0.1, 0.0]])  # gold 1 ties with 0: ties count against -> rank 2
    ranks = gold_ranks(scores, [[0], [2], [1, 3], [1]])
    assert ranks.tolist() == [1, 2, 3, 2]
    assert gold_ranks(np.zeros((1, 4)), [[2]]).tolist() == [4]  # no evidence at all is no hit
    m = retrieval_metrics(ranks, ks=(1, 2, 20))
    assert m["top1"] == 25.0 and m["top2"] == 75.0 and m["top20"] == 100.0
    assert m["mrr@10"] == pytest.approx((1 + 0.5 + 1 / 3 + 0.5) / 4)
    assert m["mean_rank"] == pytest.approx(8 / 4)


def test_mrr_ignores_ranks_beyond_ten():
    assert retrieval_metrics(np.array([11, 1]))["mrr@10"] == 0.5


def test_a_nan_score_ranks_last_not_first():
    """A comparison with NaN is False: counted naively, a NaN gold score had nothing ahead of it (rank 1)."""
    nan = float("nan")
    scores = np.array([[nan, 0.9, 0.1], [0.5, nan, 0.1], [nan, nan, nan]])
    assert gold_ranks(scores, [[0], [0], [1]]).tolist() == [3, 1, 3]
    assert count_at_least(scores, scores).tolist() == [[3, 1, 2], [1, 3, 2], [3, 3, 3]]
    m = retrieval_metrics(gold_ranks(np.full((4, 5), nan), [[0]] * 4))
    assert m["top1"] == 0.0 and m["mean_rank"] == 5.0


def test_a_gold_passage_listed_twice_is_one_passage_in_the_dense_rank():
    """Gold [0, 0] once gave rank 0 (the passage subtracted twice from the count above it) and mrr@10 inf."""
    scores = np.array([[0.9, 0.1, 0.5], [0.2, 0.9, 0.5]])
    assert gold_ranks(scores, [[0, 0], [2, 2, 0]]).tolist() == [1, 2]
    assert retrieval_metrics(gold_ranks(scores, [[0, 0]] * 2))["mrr@10"] == pytest.approx((1 + 1 / 3) / 2)

"""The tests' near-tie tolerance (tests/tolerance.py) forgives float rounding and nothing more."""

import numpy as np
import pytest
from tolerance import assert_answered_alike, assert_ranked_alike, assert_ranks_within, assert_top_k_of


def test_a_near_tie_may_swap_a_real_gap_may_not():
    assert_ranked_alike([[("a", 10.0), ("b", 9.99999999), ("c", 5.0)]], [[("b", 10.0), ("a", 9.99999999), ("c", 5.0)]])
    with pytest.raises(AssertionError):
        assert_ranked_alike([[("a", 10.0), ("b", 9.9), ("c", 5.0)]], [[("b", 10.0), ("a", 9.9), ("c", 5.0)]])
    # at the cut: a passage only one list holds must tie with the other's last
    assert_ranked_alike([[("a", 10.0), ("b", 5.0)]], [[("a", 10.0), ("c", 5.000000001)]])
    with pytest.raises(AssertionError):
        assert_ranked_alike([[("a", 10.0), ("b", 5.0)]], [[("a", 10.0), ("c", 4.0)]])


def test_top_k_and_ranks_against_a_reference_matrix():
    full = np.array([[3.0, 2.0, 2.0 + 1e-9, 1.0]])
    assert_top_k_of([[0, 1]], full)
    assert_top_k_of([[0, 2]], full)
    with pytest.raises(AssertionError):
        assert_top_k_of([[0, 3]], full)
    assert assert_ranks_within([2], full, [[1]]) == 1  # passage 2 ties with it: rank 2 or 3
    assert_ranks_within([3], full, [[1]])
    with pytest.raises(AssertionError):
        assert_ranks_within([1], full, [[1]])


def test_answers_differ_only_on_a_near_tie():
    a = {"answer": "x", "passage_id": "p", "score": 4.0}
    assert_answered_alike(a, {"answer": "y", "passage_id": "q", "score": 4.0 + 1e-9})
    with pytest.raises(AssertionError):
        assert_answered_alike(a, {"answer": "y", "passage_id": "q", "score": 3.0})
    abstained = {"answer": "", "passage_id": None, "score": None, "null_minus_best": 0.5}
    with pytest.raises(AssertionError):
        assert_answered_alike(a, abstained)
    assert_answered_alike({**a, "null_minus_best": 0.5 - 1e-7}, abstained, threshold=0.5)  # both at the cut
    with pytest.raises(AssertionError):
        assert_answered_alike({**a, "null_minus_best": 0.3}, abstained, threshold=0.5)

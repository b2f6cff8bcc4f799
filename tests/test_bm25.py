"""BM25 and reciprocal-rank fusion on hand-checkable inputs."""

import numpy as np
import pytest

from utils.retriever.bm25 import BM25
from utils.retriever.fusion import reciprocal_rank_fusion
from utils.retriever.ranking import gold_ranks, ranks

CORPUS = [{"title": "Looms", "text": "Ada built a loom in Dunhallow."},
          {"title": "Lighthouses", "text": "The Corran lighthouse was designed by Matilda Reyes."},
          {"title": "Railways", "text": "A railway crosses the Orrin valley."}]


def test_bm25_ranks_the_passage_sharing_the_rare_words_first():
    scores = BM25(CORPUS).scores(["Who designed the Corran lighthouse?", "Where did Ada build her loom?",
                                  "What crosses the Orrin valley?"])
    assert scores.shape == (3, 3)
    assert gold_ranks(scores, [[1], [0], [2]]).tolist() == [1, 1, 1]
    assert (scores[0, [0, 2]] == 0).all() and scores[0, 1] > 0  # no shared term: score 0


def test_words_match_across_inflections():
    scores = BM25(CORPUS).scores(["What is crossing?", "Who designs?"])  # "crosses", "designed" in the corpus
    assert gold_ranks(scores, [[2], [1]]).tolist() == [1, 1]


def test_ranks_and_reciprocal_rank_fusion_by_hand():
    dense = np.array([[0.9, 0.1, 0.5]])  # ranks 1, 3, 2
    lexical = np.array([[0.0, 2.0, 1.0]])  # ranks 3, 1, 2
    assert ranks(dense).tolist() == [[1, 3, 2]] and ranks(lexical).tolist() == [[3, 1, 2]]
    fused = reciprocal_rank_fusion(dense, lexical)
    assert fused[0].tolist() == pytest.approx([1 / 61 + 1 / 63, 1 / 63 + 1 / 61, 2 / 62])
    # Passage 2 is second in both lists; first-and-third beats second-and-second only by a hair.
    assert gold_ranks(fused, [[2]]).tolist() == [3]
    assert gold_ranks(reciprocal_rank_fusion(dense, dense), [[0]]).tolist() == [1]
    assert ranks(np.array([[0.0, 3.0, 0.0, 0.0]])).tolist() == [[4, 1, 4, 4]]  # ties share the worst rank


def test_a_question_sharing_no_term_with_the_corpus_is_not_a_hit():
    scores = BM25(CORPUS).scores(["Is it?"])  # stopwords only
    assert (scores == 0).all() and gold_ranks(scores, [[0]]).tolist() == [3]


def test_convex_fusion_weight_is_tuned_and_cross_fitted_by_hand():
    from utils.retriever.fusion import convex_fusion, cross_fitted_fusion, tune_dense_weight

    # q0: dense ranks p0 first, BM25 p1 first; the gold p2 is second in both (normalised: dense [1, 0, .75],
    # lexical [0, 1, .8]), so it wins for dense weights in (0.21, 0.76). q1: its gold p1 wins only for w > 0.53.
    dense = np.array([[0.9, 0.1, 0.7], [0.1, 0.9, 0.0]])
    lexical = np.array([[0.0, 2.0, 1.6], [1.0, 0.0, 0.5]])
    gold = [[2], [1]]
    assert convex_fusion(dense[:1], lexical[:1], 0.5)[0].tolist() == pytest.approx([0.5, 0.5, 0.775])
    assert gold_ranks(convex_fusion(dense, lexical, 1.0), gold).tolist() == gold_ranks(dense, gold).tolist()
    assert gold_ranks(convex_fusion(dense, lexical, 0.0), gold).tolist() == gold_ranks(lexical, gold).tolist()
    assert tune_dense_weight(dense[:1], lexical[:1], gold[:1]) == 0.25  # the smallest of the best
    assert tune_dense_weight(dense[1:], lexical[1:], gold[1:]) == 0.55
    # Cross-fitted: q0 is fused with q1's weight (0.55: still first), q1 with q0's (0.25: its gold falls to 3rd).
    fused, weight = cross_fitted_fusion(dense, lexical, gold)
    assert gold_ranks(fused, gold).tolist() == [1, 3]
    assert weight == 0.55  # tuned on both: the one weight that puts both golds first

"""BM25 (one question at a time) and the hybrids over candidates, on hand-checkable inputs."""

import numpy as np
import pytest

from utils.search.bm25 import BM25, k_best
from utils.search.fusion import (Candidates, convex_fusion, cross_fitted_ranks, fused_gold_ranks,
                                    reciprocal_rank_fusion, tune_dense_weight, union)

CORPUS = [{"title": "Looms", "text": "Ada built a loom in Dunhallow."},
          {"title": "Lighthouses", "text": "The Corran lighthouse was designed by Matilda Reyes."},
          {"title": "Railways", "text": "A railway crosses the Orrin valley."}]


def test_bm25_ranks_the_passage_sharing_the_rare_words_first():
    bm25 = BM25(CORPUS)
    questions = ["Who designed the Corran lighthouse?", "Where did Ada build her loom?",
                 "What crosses the Orrin valley?"]
    scores, ids, ranks, _ = bm25.search(questions, 3, gold=[[1], [0], [2]])
    assert ranks.tolist() == [1, 1, 1] and ids[:, 0].tolist() == [1, 0, 2]
    first = bm25.query_scores(questions[0])
    assert (first[[0, 2]] == 0).all() and first[1] > 0 and scores[0, 0] == first[1]  # no shared term: score 0
    _, _, _, of = bm25.search(questions[:1], 1, score_ids=np.array([[2, 1, -1]]))
    assert of[0, :2].tolist() == [0.0, first[1]] and of[0, 2] == -np.inf


def test_words_match_across_inflections():
    _, _, ranks, _ = BM25(CORPUS).search(["What is crossing?", "Who designs?"], 3, gold=[[2], [1]])
    assert ranks.tolist() == [1, 1]  # "crosses", "designed" in the corpus


def test_a_question_sharing_no_term_with_the_corpus_is_not_a_hit():
    bm25 = BM25(CORPUS)
    assert (bm25.query_scores("Is it?") == 0).all()  # stopwords only
    assert bm25.search(["Is it?"], 3, gold=[[0]])[2].tolist() == [3]  # ties count against it: last


def candidates(dense, lexical, dense_list, lexical_list):
    """Candidates of one question over passages 0..n-1 from full score rows and each ranking's list."""
    ids, d_rank, l_rank = union(np.array([dense_list]), np.array([lexical_list]))
    valid = ids >= 0
    take = lambda row: np.where(valid, np.asarray(row, dtype=np.float32)[np.maximum(ids, 0)], -np.inf)  # noqa: E731
    return Candidates(ids, take(dense), take(lexical), d_rank, l_rank)


def stack(*cs):
    width = max(c.ids.shape[1] for c in cs)
    pad = lambda a, v: np.concatenate([a, np.full((1, width - a.shape[1]), v, a.dtype)], 1)  # noqa: E731
    return Candidates(*(np.concatenate([pad(getattr(c, f), v) for c in cs]) for f, v in
                        (("ids", -1), ("dense", -np.inf), ("lexical", -np.inf), ("dense_rank", 0),
                         ("lexical_rank", 0))))


def test_candidates_are_the_union_of_both_lists_with_their_ranks():
    ids, d_rank, l_rank = union(np.array([[4, 2, 7]]), np.array([[2, 9, -1]]))
    assert ids.tolist() == [[4, 2, 7, 9, -1, -1]]
    assert d_rank.tolist() == [[1, 2, 3, 0, 0, 0]] and l_rank.tolist() == [[0, 1, 0, 2, 0, 0]]


def test_reciprocal_rank_fusion_by_hand():
    # dense ranks passages 0, 2, 1; BM25 1, 2, 0: passage 2 is second in both.
    c = candidates([0.9, 0.1, 0.5], [0.0, 2.0, 1.0], [0, 2, 1], [1, 2, 0])
    fused = reciprocal_rank_fusion(c)
    by_id = {p: f for p, f in zip(c.ids[0].tolist(), fused[0].tolist()) if p >= 0}
    assert by_id == pytest.approx({0: 1 / 61 + 1 / 63, 2: 2 / 62, 1: 1 / 63 + 1 / 61})
    assert fused_gold_ranks(fused, c, [[2]]).tolist() == [3]  # first-and-third beats second-and-second by a hair
    missing = candidates([0.9, 0.1, 0.5], [0.0, 2.0, 1.0], [0], [1])  # neither list holds passage 2
    assert fused_gold_ranks(reciprocal_rank_fusion(missing), missing, [[2]]).tolist() == [3]  # after both candidates


def test_convex_fusion_weight_is_tuned_and_cross_fitted_by_hand():
    # q0: dense ranks p0 first, BM25 p1 first; the gold p2 is second in both (normalised: dense [1, 0, .75],
    # lexical [0, 1, .8]), so it wins for dense weights in (0.21, 0.76). q1: its gold p1 wins only for w > 0.53.
    q0 = candidates([0.9, 0.1, 0.7], [0.0, 2.0, 1.6], [0, 2, 1], [1, 2, 0])
    q1 = candidates([0.1, 0.9, 0.0], [1.0, 0.0, 0.5], [1, 0, 2], [0, 2, 1])
    both, gold = stack(q0, q1), [[2], [1]]
    fused = convex_fusion(q0, 0.5)
    by_id = {p: f for p, f in zip(q0.ids[0].tolist(), fused[0].tolist()) if p >= 0}
    assert by_id == pytest.approx({0: 0.5, 1: 0.5, 2: 0.775})
    assert fused_gold_ranks(convex_fusion(both, 1.0), both, gold).tolist() == [2, 1]  # dense alone
    assert fused_gold_ranks(convex_fusion(both, 0.0), both, gold).tolist() == [2, 3]  # BM25 alone
    assert tune_dense_weight(q0, gold[:1]) == 0.25  # the smallest of the best
    assert tune_dense_weight(q1, gold[1:]) == 0.55
    # Cross-fitted: q0 is fused with q1's weight (0.55: still first), q1 with q0's (0.25: its gold falls to 3rd).
    ranks, weight = cross_fitted_ranks(both, gold)
    assert ranks.tolist() == [1, 3]
    assert weight == 0.55  # tuned on both: the one weight that puts both golds first


def test_bm25_ties_go_to_the_smaller_id_whatever_k():
    """Equal scores (here: identical passages) by the smaller id, as in the dense search: every k's ranking is the
    first k of the whole sorted corpus, so a k = 1 and a k = 10 search agree on the first hit."""
    texts = ["lighthouse keeper cottage harbour", "lighthouse museum volunteers spring", "weaving loom tartan mill"]
    corpus = [{"title": "", "text": texts[g]} for g in np.random.default_rng(3).integers(0, 3, 150)]
    bm25 = BM25(corpus)
    s = bm25.query_scores("lighthouse keeper")
    assert len(set(s.tolist())) == 3  # three scores, each shared by about 50 passages
    whole = np.lexsort((np.arange(len(s)), -s))
    for k in range(1, 151):
        scores, ids, _, _ = bm25.search(["lighthouse keeper"], k)
        assert ids[0].tolist() == whole[:k].tolist() and scores[0].tolist() == s[whole[:k]].tolist(), k


def test_k_best_is_the_one_tie_rule():
    rng = np.random.default_rng(0)
    for _ in range(300):
        s = rng.integers(0, 4, int(rng.integers(1, 60))).astype(np.float32)
        k = int(rng.integers(1, 70))
        assert k_best(s, k).tolist() == np.lexsort((np.arange(len(s)), -s))[:k].tolist()


def test_a_gold_passage_listed_twice_counts_once():
    bm25 = BM25(CORPUS)
    questions = ["Who designed the Corran lighthouse?", "Where did Ada build her loom?"]
    once = bm25.search(questions, 3, gold=[[1], [1]])[2]
    twice = bm25.search(questions, 3, gold=[[1, 1], [1, 1]])[2]
    assert twice.tolist() == once.tolist() == [1, 3]  # ties (score 0) count against the gold

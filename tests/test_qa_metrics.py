"""SQuAD v2.0 metric against cases worked out by hand from the official definition."""

import pytest

from utils.reader.metrics import best_null_threshold, exact_match, f1_score, normalize_answer, squad_metrics


def test_normalisation_drops_case_punctuation_articles_and_extra_space():
    assert normalize_answer("The  Eiffel-Tower!") == "eiffeltower"
    assert normalize_answer("an apple, a pear") == "apple pear"
    assert normalize_answer("Theatre") == "theatre"  # 'the' only as a whole word


def test_exact_and_f1_by_hand():
    assert exact_match("the cat", "Cat.") == 1
    # gold "red big dog" vs pred "big dog barks": 2 common, P=2/3, R=2/3 -> F1=2/3
    assert f1_score("red big dog", "big dog barks") == pytest.approx(2 / 3)
    # repeated tokens count with multiplicity: gold "a b b" -> "b b", pred "b" -> P=1, R=1/2 -> 2/3
    assert f1_score("a b b", "b") == pytest.approx(2 / 3)
    assert f1_score("dog", "cat") == 0.0
    assert f1_score("", "") == 1.0 and f1_score("", "dog") == 0.0 and f1_score("dog", "") == 0.0


def test_squad_metrics_total_hasans_noans():
    refs = {"q1": ["big dog", "dog"], "q2": ["red house"], "q3": [], "q4": []}
    preds = {"q1": "the dog", "q2": "house", "q3": "", "q4": "cat"}
    m = squad_metrics(refs, preds)
    # q1: exact 1 (matches "dog"), q2: exact 0, F1 = 2*1*0.5/1.5 = 2/3; q3: 1; q4: 0
    assert m["exact"] == pytest.approx(100 * 2 / 4)
    assert m["f1"] == pytest.approx(100 * (1 + 2 / 3 + 1 + 0) / 4)
    assert m["HasAns_total"] == 2 and m["HasAns_f1"] == pytest.approx(100 * (1 + 2 / 3) / 2)
    assert m["NoAns_total"] == 2 and m["NoAns_exact"] == pytest.approx(50.0)


def test_only_v1_questions_have_no_noans_entries():
    m = squad_metrics({"q": ["x"]}, {"q": "x"})
    assert m["exact"] == 100.0 and "NoAns_total" not in m


def test_best_threshold_matches_official_find_best_thresh():
    refs = {"a": ["paris"], "b": [], "c": ["rome"], "d": []}
    spans = {"a": "paris", "b": "london", "c": "milan", "d": "oslo"}
    na = {"a": -3.0, "b": 2.0, "c": -1.0, "d": -2.0}
    # Sorted by na: a(-3, +1), d(-2, -1), c(-1, +0), b(2, -1). Start = 2 no-answer questions correct.
    # After a: 3 (best, thresh -3); after d: 2; after c: 2; after b: 1.
    score, thresh = best_null_threshold(refs, spans, na)
    assert score == pytest.approx(75.0) and thresh == -3.0


def test_best_threshold_all_null_when_spans_are_all_wrong():
    refs = {"a": ["x"], "b": []}
    score, thresh = best_null_threshold(refs, {"a": "y", "b": "z"}, {"a": 0.0, "b": 1.0})
    assert score == pytest.approx(50.0) and thresh < 0.0

"""The QA system's answer rule over readings, without models: spans compared across passages, the retriever's score
as a prior over them, the weight tuned with the threshold, and the calibrated probability of no answer."""

import math

import pytest

from utils.reader.decoding import apply_null_threshold
from utils.reader.metrics import best_null_threshold, squad_metrics
from utils.system.answer import answer, combine


def test_one_rule_for_one_passage_or_many():
    spans = [{"passage_id": "a", "text": "x", "score": 2.0, "null_minus_best": 1.0},
             {"passage_id": "b", "text": "y", "score": 3.0, "null_minus_best": 0.2}]
    c = combine(spans)
    assert (c["text"], c["passage_id"], c["null_minus_best"]) == ("y", "b", 0.2)
    assert answer(c, 0.1) == "" and answer(c, 0.3) == "y" and answer(c, None) == "y"
    assert answer(combine([{"passage_id": "a", "text": "", "score": -math.inf, "null_minus_best": math.inf}]), 5) == ""


def test_the_reader_the_system_and_the_threshold_tuner_abstain_by_the_same_rule():
    """A question exactly at the threshold is answered by the reader's predictions and by the QA system alike, and
    the threshold the tuner picks (one of the questions' scores) scores, answered by either, what the tuner said."""
    refs = {"1": ["Ada"], "2": [], "3": ["loom"], "4": []}
    decoded = {"1": {"text": "Ada", "null_minus_best": -1.0}, "2": {"text": "mill", "null_minus_best": 0.5},
               "3": {"text": "loom", "null_minus_best": 0.5}, "4": {"text": "weir", "null_minus_best": 2.0}}
    f1, threshold = best_null_threshold(refs, {i: d["text"] for i, d in decoded.items()},
                                        {i: d["null_minus_best"] for i, d in decoded.items()})
    reader = apply_null_threshold(decoded, threshold)
    system = {i: answer(d, threshold) for i, d in decoded.items()}
    assert threshold == -1.0 and reader == system == {"1": "Ada", "2": "", "3": "", "4": ""}  # "1" sits at it
    assert squad_metrics(refs, system)["f1"] == pytest.approx(f1)
    assert apply_null_threshold(decoded, None) == {i: answer(d, None) for i, d in decoded.items()}


def lse(values):
    top = max(values)
    return top + math.log(sum(math.exp(v - top) for v in values))


def test_the_retrievers_score_is_a_prior_over_the_passages_read():
    a = {"passage_id": "a", "retrieval_score": 1.0, "text": "x", "score": 3.0, "null_score": 1.0,
         "null_minus_best": -2.0, "null_start": 0.0, "null_end": 1.0, "lse_start": 2.0, "lse_end": 2.5}
    b = {**a, "passage_id": "b", "retrieval_score": 0.0, "text": "y", "score": 4.0, "null_score": -1.0,
         "null_minus_best": -5.0, "null_start": -1.0, "null_end": 0.0, "lse_start": 1.0, "lse_end": 1.5}
    for shared_norm in (False, True):  # one passage: raising all its logits together changes no decision
        plain, fused = combine([a], shared_norm), combine([a], shared_norm, retriever_weight=8.0)
        assert [fused[k] for k in ("text", "no_answer_probability")] == \
            [plain[k] for k in ("text", "no_answer_probability")]
        assert fused["null_minus_best"] == pytest.approx(plain["null_minus_best"])
        assert combine([a, b], shared_norm)["text"] == "y"  # the reader alone: b's span reads better
    # w = 4: every logit of a rises by 4 x 1.0 / 2, b's by 0: a's span (3 + 4) now beats b's (4)
    c = combine([a, b], shared_norm=True, retriever_weight=4.0)
    assert (c["text"], c["passage_id"], c["score"]) == ("x", "a", 7.0)
    assert c["null_minus_best"] == pytest.approx(lse([0.0 + 2, -1.0]) + lse([1.0 + 2, 0.0]) - 7.0)
    want = (math.exp(lse([0.0 + 2, -1.0]) - lse([2.0 + 2, 1.0]))
            + math.exp(lse([1.0 + 2, 0.0]) - lse([2.5 + 2, 1.5]))) / 2
    assert c["no_answer_probability"] == pytest.approx(want)
    w = combine([a, b], retriever_weight=4.0)  # a reader trained a paragraph at a time: the span chosen moves,
    assert (w["text"], w["null_minus_best"]) == ("x", -5.0)  # each passage's null - span does not


def test_the_weight_is_tuned_with_the_threshold_and_the_smaller_of_equals_wins():
    from utils.system.measure import tune

    questions = [{"id": "1", "answers": {"text": ["x"]}}, {"id": "2", "answers": {"text": []}}]

    def combined_with(weight):  # from weight 1 on, question 1 is answered right; question 2 is better abstained on
        return [{"text": "x" if weight >= 1 else "z", "null_minus_best": -3.0},
                {"text": "q", "null_minus_best": 2.0 if weight < 2 else -4.0}]

    weight, threshold = tune(questions, combined_with, weights=(0.0, 0.5, 1.0, 2.0, 4.0))
    assert weight == 1.0 and -3.0 <= threshold < 2.0
    assert tune(questions, combined_with, weights=(0.0,))[0] == 0.0


def test_the_weight_is_the_one_whose_threshold_carries_to_articles_it_was_not_tuned_on():
    """With folds of whole articles the weight is chosen by its F1 cross-fitted over them (each fold answered at the
    threshold tuned on the other), not by its F1 on the questions it was tuned on."""
    from utils.system.measure import crossfit, tune

    questions = [{"id": i, "title": title, "answers": {"text": ["x"] if i in "13" else []}}
                 for i, title in (("1", "A"), ("2", "A"), ("3", "B"), ("4", "B"))]
    folds = [questions[:2], questions[2:]]
    # answered right wherever answered; the log ratios of the answerable 1, 3 and the unanswerable 2, 4
    ratios = {0.0: {"1": -1.0, "2": 5.0, "3": 3.0, "4": 4.0},  # one cut (3) fits both, but A's own cut (-1) misses 3
              1.0: {"1": -1.0, "2": 5.0, "3": -1.0, "4": 5.0}}  # the articles alike: each one's cut fits the other

    def combined_with(weight, qs=questions):
        return [{"text": "x" if q["answers"]["text"] else "q", "null_minus_best": ratios[weight][q["id"]]} for q in qs]

    assert tune(questions, combined_with, (0.0, 1.0)) == (0.0, 3.0)  # F1 100 either way: the smaller weight
    assert tune(questions, combined_with, (0.0, 1.0), folds) == (1.0, -1.0)
    # by hand at weight 0: B answered at A's cut -1 (3 abstains: wrong), A at B's cut 3 (both right): 3 of 4
    scored, settings = crossfit(folds, lambda others: (0.0, 3.0 if others[0]["title"] == "B" else -1.0),
                                lambda qs, w: combined_with(w, qs))
    assert scored["f1"] == 75.0 and settings == [(0.0, 3.0), (0.0, -1.0)]


def test_the_calibration_recovers_a_known_probability_and_gives_it_for_either_rule():
    import numpy as np

    from utils.system.answer import calibrated
    from utils.system.measure import fit_calibration

    rng = np.random.default_rng(0)
    x = rng.normal(0, 3, size=20000)
    unanswerable = rng.random(x.size) < 1 / (1 + np.exp(-(1.5 * x - 1.0)))  # P(no answer) = sigmoid(1.5 x - 1)
    questions = [{"answers": {"text": [] if u else ["a"]}} for u in unanswerable]
    a, b, share = fit_calibration(questions, [{"null_minus_best": v} for v in x])
    assert a == pytest.approx(1.5, abs=0.08) and b == pytest.approx(-1.0, abs=0.08)
    assert share == unanswerable.mean()  # the prior the probability holds
    assert calibrated(0.0, (1.5, -1.0)) == pytest.approx(1 / (1 + math.exp(1.0)))
    assert calibrated(math.inf, (1.5, -1.0)) == pytest.approx(1.0) and calibrated(-math.inf, (1.5, -1.0)) < 1e-30
    spans = [{"passage_id": "a", "text": "x", "score": 2.0, "null_minus_best": 1.0}]
    assert combine(spans)["no_answer_probability"] is None  # no probability without a calibration, this rule
    assert combine(spans, calibration=(1.5, -1.0))["no_answer_probability"] == \
        pytest.approx(calibrated(1.0, (1.5, -1.0)))


def test_the_share_moves_the_cut_by_its_odds_by_hand():
    """at_share: a calibration (a=2, b=-1) fitted where 20% had no answer, moved to 50%: the log odds rise by
    log(1) - log(0.25) = log 4, so b by log 4 and the threshold by -log 4 / 2; the probability at the old threshold
    under the old calibration is the probability at the new threshold under the new one (the same cut)."""
    from utils.system.answer import at_share, calibrated

    threshold, calibration = at_share(-3.0, (2.0, -1.0, 0.2), 0.5)
    assert threshold == pytest.approx(-3.0 - math.log(4) / 2)
    assert calibration == pytest.approx((2.0, -1.0 + math.log(4), 0.5))
    assert calibrated(threshold, calibration) == pytest.approx(calibrated(-3.0, (2.0, -1.0)))
    assert calibrated(0.0, calibration) == pytest.approx(1 / (1 + math.exp(1.0 - math.log(4))))
    assert at_share(-3.0, (2.0, -1.0, 0.2), 0.2) == (-3.0, (2.0, -1.0, 0.2))  # the fitted share: nothing moves
    assert at_share(None, (2.0, -1.0, 0.2), 0.5)[0] is None  # a reader that always answers still does
    assert at_share(-3.0, (2.0, -1.0), None) == (-3.0, (2.0, -1.0))  # no share: as given
    assert at_share(-3.0, (2.0, -1.0, 0.2), 0.1)[0] > -3.0  # fewer unanswerable expected: abstain less often


@pytest.mark.parametrize("share, calibration, words", [
    (0.0, (2.0, -1.0, 0.2), "strictly between 0 and 1"), (1.0, (2.0, -1.0, 0.2), "strictly between 0 and 1"),
    (0.5, None, "A B SHARE"), (0.5, (2.0, -1.0), "A B SHARE"), (0.5, (-2.0, -1.0, 0.2), "slope A above 0")])
def test_a_share_that_cannot_move_the_cut_is_refused_in_one_line(share, calibration, words):
    from utils.errors import UserError
    from utils.system.answer import at_share

    with pytest.raises(UserError, match=words) as err:
        at_share(-3.0, calibration, share)
    assert "\n" not in str(err.value)


def test_a_calibration_moved_to_another_share_is_the_one_fitted_there():
    """Two populations with the same readings per class (x ~ N(2, 2) without an answer, N(-2, 2) with one), 20% and
    50% unanswerable: the calibration fitted on the first and moved to 50% is, within sampling error, the one fitted
    on the second (Bayes' rule: only the prior differs)."""
    import numpy as np

    from utils.system.answer import at_share
    from utils.system.measure import fit_calibration

    rng = np.random.default_rng(1)

    def sample(share, n=40000):
        unanswerable = rng.random(n) < share
        x = np.where(unanswerable, rng.normal(2, 2, n), rng.normal(-2, 2, n))
        return [{"answers": {"text": [] if u else ["a"]}} for u in unanswerable], [{"null_minus_best": v} for v in x]

    fitted = fit_calibration(*sample(0.2))
    _, moved = at_share(0.0, fitted, 0.5)
    there = fit_calibration(*sample(0.5))
    assert moved[0] == pytest.approx(there[0], abs=0.05) and moved[1] == pytest.approx(there[1], abs=0.08)
    assert there[0] == pytest.approx(1.0, abs=0.05) and there[1] == pytest.approx(0.0, abs=0.05)  # 4x/4 by hand


def _validation(seed: int = 0, per_article: int = 6):
    """Labelled questions in three articles and their readings of 3 passages each, at random."""
    import numpy as np

    rng = np.random.default_rng(seed)
    questions, readings = [], []
    for n in range(3 * per_article):
        answerable = n % 2 == 0
        questions.append({"id": str(n), "title": "ABC"[n // per_article],
                          "answers": {"text": ["x"] if answerable else []}})
        row = []
        for p in range(3):
            null, span = rng.normal(0, 2, size=2)
            row.append({"passage_id": f"{n}-{p}", "retrieval_score": float(rng.normal()),
                        "text": "x" if answerable and p == 0 else "y", "score": float(span),
                        "null_score": float(null), "null_minus_best": float(null - span),
                        "null_start": float(null / 2), "null_end": float(null / 2), "lse_start": float(span / 2 + 1),
                        "lse_end": float(span / 2 + 1)})
        readings.append(row)
    return questions, readings


def test_the_tuning_policy_gives_what_is_given_else_the_recorded_threshold_and_moves_it_to_the_share():
    from utils.system.answer import AnswerSettings, at_share
    from utils.system.measure import system_setting

    questions, readings = _validation()
    given = AnswerSettings(no_answer_threshold=0.5, retriever_weight=2.0, no_answer_calibration=(1.5, -0.5, 0.5),
                           unanswerable_share=0.2)
    setting = system_setting(given, 9.0, questions, readings, 3, True, None)
    moved = at_share(0.5, (1.5, -0.5, 0.5), 0.2)
    assert (setting.weight, setting.threshold, setting.calibration) == (2.0, 0.5, (1.5, -0.5, 0.5))
    assert (setting.applied_threshold, setting.applied_calibration, setting.not_moved) == (*moved, None)
    recorded = system_setting(AnswerSettings(), 9.0, None, None, 3, True, None)
    assert (recorded.weight, recorded.threshold, recorded.applied_threshold) == (0.0, 9.0, 9.0)
    flat_rule = AnswerSettings(no_answer_threshold=0.5, no_answer_calibration=(-1.0, 0.0, 0.5), unanswerable_share=0.2)
    flat = system_setting(flat_rule, None, None, None, 1, True, None)  # a slope below 0 orders nothing: not moved
    assert flat.applied_threshold == 0.5 and flat.not_moved


def test_a_cross_fitted_score_answers_each_fold_at_the_policys_setting_on_the_others_moved_to_the_share():
    """issue 50 item 6: the cross-fitted score is at the share the row is at, each fold's threshold moved too."""
    from utils.files.folds import cross_fit_folds
    from utils.system.answer import AnswerSettings, answer
    from utils.system.measure import combined_at, crossfitted, scores, system_setting

    questions, readings = _validation()
    of = {q["id"]: r for q, r in zip(questions, readings)}
    folds = cross_fit_folds(questions)
    tuning = AnswerSettings(unanswerable_share=0.1)

    def by_hand(applied: bool) -> float:
        predictions = {}
        for i, fold in enumerate(folds):
            others = [q for j, f in enumerate(folds) if j != i for q in f]
            setting = system_setting(tuning, None, others, [of[q["id"]] for q in others], 3, True,
                                     cross_fit_folds(others))
            cut = setting.applied_threshold if applied else setting.threshold
            combined = combined_at([of[q["id"]] for q in fold], 3, True, setting.weight)
            predictions.update({q["id"]: answer(c, cut) for q, c in zip(fold, combined)})
        ordered = [q for f in folds for q in f]
        return scores(ordered, [{"text": predictions[q["id"]], "null_minus_best": -1.0} for q in ordered], 0.0)["f1"]

    f1 = crossfitted(tuning, questions, readings, 3, True, folds)["f1"]
    assert f1 == by_hand(applied=True) != by_hand(applied=False)

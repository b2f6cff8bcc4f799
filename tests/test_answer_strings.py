"""Questions labelled by answer strings without a paragraph (the open-domain layout of DPR's NQ and TriviaQA files):
read by the one questions loader from JSON lines and DPR's CSV/TSV, folded by question where they name no article,
and measured by the QA system's own scoring on the answer strings."""

import utils.files.folds as folds
from utils.files.folds import articles_of, cross_fit_folds, fold_unit


def open_domain(i, answers, title=None):
    """A question of the open-domain layout, as load_questions returns it."""
    return {"id": str(i), "title": title or "", "context": None, "question": f"q{i}?",
            "answers": {"text": answers, "answer_start": None}}


# --- folds: questions that name no article are each their own ------------------------------------------------------


def test_questions_without_a_title_or_paragraph_are_folded_one_question_an_article():
    """Such a question names no article: it is one of its own, so the tuning's folds are folds of questions (as even
    in answerable and unanswerable ones as ever), where they were one article and no folds at all."""
    questions = [open_domain(i, [] if i % 3 == 0 else ["x"]) for i in range(6)]
    assert len(articles_of(questions)) == 6 and fold_unit(questions) == "questions"
    halves = cross_fit_folds(questions)
    assert sorted((len(f), sum(not q["answers"]["text"] for q in f)) for f in halves) == [(3, 1), (3, 1)]
    assert sorted(q["id"] for f in halves for q in f) == [q["id"] for q in questions]
    titled = [open_domain(i, ["x"], title="A" if i < 3 else "B") for i in range(6)]
    assert [sorted(q["title"] for q in f) for f in cross_fit_folds(titled)] == [["A"] * 3, ["B"] * 3]
    assert fold_unit(titled) == "articles"
    assert fold_unit(titled[:3] + questions[3:]) == "articles (a question without a title or paragraph its own)"


def test_folds_of_many_one_question_articles_do_not_try_every_pair(monkeypatch):
    """Evening the folds out tries a move once per size and fold, not once per pair of articles of one question each
    (quadratic in the questions, with each try looking at every question: a minute for two thousand)."""
    calls = []
    imbalance = folds._imbalance
    monkeypatch.setattr(folds, "_imbalance", lambda *args: calls.append(1) or imbalance(*args))
    questions = [open_domain(i, [] if i % 4 == 0 else ["x"], title=f"t{i}") for i in range(600)]
    halves = folds.article_folds(questions, 2)
    assert sorted((len(f), sum(not q["answers"]["text"] for q in f)) for f in halves) == [(300, 75), (300, 75)]
    assert len(calls) < 3 * len(questions)  # the dealing's two per question, and a few more

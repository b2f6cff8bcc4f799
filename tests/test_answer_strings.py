"""Questions labelled by answer strings without a paragraph (the open-domain layout of DPR's NQ and TriviaQA files):
read by the one questions loader from JSON lines and DPR's CSV/TSV, folded by question where they name no article,
and measured by the QA system's own scoring on the answer strings."""

import json

import pytest

import utils.files.folds as folds
from utils.errors import UserError
from utils.files.folds import articles_of, cross_fit_folds, fold_unit
from utils.files.squad import load_questions, load_squad


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def jsonl(rows):
    return "".join(json.dumps(r) + "\n" for r in rows)


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


# --- the loader -----------------------------------------------------------------------------------------------------


def test_answer_strings_are_read_from_json_lines_and_dprs_csv_and_tsv(tmp_path):
    rows = [{"id": "nq1", "question": "who designed the bell rock lighthouse", "answers": ["Robert Stevenson"]},
            {"id": 7, "question": "who lit it", "answers": [], "title": "Bell Rock"}]
    got = load_questions(write(tmp_path, "q.jsonl", jsonl(rows)), need_context=False)
    assert got == [{"id": "nq1", "title": "", "context": None, "question": rows[0]["question"],
                    "answers": {"text": ["Robert Stevenson"], "answer_start": None}},
                   {"id": "7", "title": "Bell Rock", "context": None, "question": "who lit it",
                    "answers": {"text": [], "answer_start": None}}]
    assert load_questions(write(tmp_path, "q.json", json.dumps(rows)), need_context=False) == got  # a JSON list
    # DPR's files: tab-separated whatever the name, the answers Python's list (nq-test.csv) or JSON's; csv.reader
    # unquotes a quoted field as DPR's CsvQASrc does; the id is the line number; blank lines are skipped
    table = ("who got the first nobel prize in physics\t['Wilhelm Conrad Röntgen']\n\n"
             "\"which\" film?\t[\"Sunset Blvd\", \"Sunset Boulevard\"]\n"
             "who lit it\t[]\n")
    for name in ("nq-test.csv", "trivia.tsv"):
        got = load_questions(write(tmp_path, name, table), need_context=False)
        assert [(q["id"], q["question"], q["answers"]["text"], q["context"]) for q in got] == [
            ("1", "who got the first nobel prize in physics", ["Wilhelm Conrad Röntgen"], None),
            ("3", "which film?", ["Sunset Blvd", "Sunset Boulevard"], None), ("4", "who lit it", [], None)]
        assert all(q["answers"]["answer_start"] is None and q["title"] == "" for q in got)


@pytest.mark.parametrize("name, text, message", [
    ("q.tsv", "who?\t['Ada'\n", "q.tsv: line 1: the answers \"['Ada'\" are not a list literal"),
    ("q.csv", "who?\t['Ada']\nwhen?\t'1823'\n", "q.csv: line 2: the answers should be a list of strings ([] for an "
                                                "unanswerable question), got str"),
    ("q.tsv", "who?\t['Ada', 1823]\n", "q.tsv: line 1: answer #1 should be a string, got int"),
    ("q.tsv", "who?\t['Ada']\n \t['Ada']\n", "q.tsv: line 2: empty question"),
    ("q.tsv", "who?\t['']\n", "q.tsv: line 1: answer #0 is empty (an unanswerable question's answers are [])"),
    ("q.tsv", "who?\t['Ada']\textra\n", "q.tsv: line 1: expected 2 tab-separated fields (question, answers), got 3"),
    ("q.csv", "who?,['Ada']\n", "q.csv: line 1: expected 2 tab-separated fields (question, answers), got 1"),
    ("q.tsv", "who?\t['Ada']\nwho?\t['Ada']\n\nwhen?\t[]\n", None),
    ("q.tsv", "\n\n", "q.tsv: the dataset has no questions"),
    ("q.jsonl", jsonl([{"id": "a", "question": "who?", "answers": ["Ada"]}, {"id": "b", "question": "when?",
                                                                           "answers": ["1823", None]}]),
     "q.jsonl: line 2: answer #1 should be a string, got NoneType"),
    ("q.jsonl", jsonl([{"id": "a", "question": "  ", "answers": []}]), "q.jsonl: line 1: empty question"),
    ("q.jsonl", jsonl([{"question": "who?", "answers": []}]), "q.jsonl: line 1: missing key 'id'"),
    ("q.jsonl", jsonl([{"id": "a", "question": "who?", "context": "Ada built it.", "answers": ["Ada"]}]),
     "q.jsonl: line 1: 'answers' as a list of strings is for a question without a paragraph"),
    ("q.jsonl", jsonl([{"id": "a", "question": "who?", "answers": "Ada"}]),
     "q.jsonl: example a: 'answers' should be {text, answer_start} with a 'context', or a list of answer strings"),
    ("q.jsonl", jsonl([{"id": "a", "question": "who?", "answers": {"text": ["Ada"], "answer_start": [0]}}]),
     "q.jsonl: example a: answers with offsets (answer_start) but no context"),
    ("q.jsonl", jsonl([{"id": "a", "question": "who?", "answers": ["Ada"]}, {"id": "b", "question": "when?"}]),
     "q.jsonl: example b: some questions carry answers and some do not"),
])
def test_a_bad_row_is_one_line_naming_the_file_and_line(tmp_path, name, text, message):
    path = write(tmp_path, name, text)
    if message is None:  # the same question twice is two rows, told apart by their lines
        assert [q["id"] for q in load_questions(path, need_context=False)] == ["1", "2", "4"]
        return
    with pytest.raises(UserError) as err:
        load_questions(path, need_context=False)
    assert str(err.value).startswith(path) and message in str(err.value) and "\n" not in str(err.value)


def test_training_data_and_a_reader_answering_from_paragraphs_still_need_the_paragraph(tmp_path):
    """A reader trains on offsets and answers from its paragraph: answer strings without one are refused there."""
    table = write(tmp_path, "nq.csv", "who?\t['Ada']\n")
    rows = write(tmp_path, "nq.jsonl", jsonl([{"id": "a", "question": "who?", "answers": ["Ada"]}]))
    for load in (load_squad, lambda path: load_questions(path, need_context=True)):
        with pytest.raises(UserError, match="nq.csv: questions with answer strings and no paragraph"):
            load(table)
        with pytest.raises(UserError, match="nq.jsonl: example a: missing key 'context'"):
            load(rows)

"""Questions labelled by answer strings without a paragraph (the open-domain layout of DPR's NQ and TriviaQA files):
read by the one questions loader from JSON lines and DPR's CSV/TSV, folded by question where they name no article,
and measured by the QA system's own scoring on the answer strings."""

import json
import os

import pytest
from conftest import SAMPLE, run_script

import utils.files.folds as folds
from utils.errors import UserError
from utils.files.folds import articles_of, cross_fit_folds, fold_unit
from utils.files.squad import load_questions, load_squad
from utils.system.answer import AnswerSettings
from utils.system.measure import Setting, ceiling_left_out, system_row, tuning_source


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


# --- measured on the answer strings ---------------------------------------------------------------------------------

# (question, answers, [(passage text, the reader's span in it, span score, null - span)] in retrieval order)
HAND = [("Who built the Bell Rock Lighthouse?", ["Robert Stevenson", "Stevenson"],
         [("The Bell Rock Lighthouse was built by Robert Stevenson.", "Stevenson.", 5.0, -2.0),
          ("Stevenson's engineering firm.", "engineering", 1.0, 3.0)]),
        ("What is the lighthouse called?", ["the Bell Rock Lighthouse"],
         [("Stevenson's lighthouse at Inchcape.", "Inchcape", 2.0, -1.0),
          ("The Bell Rock Lighthouse stands off Angus.", "Bell Rock", 4.0, -3.0)]),
        ("Who painted the lighthouse?", [],
         [("Robert Stevenson built it.", "Robert", 3.0, 1.0), ("It stands off Angus.", "Angus", 2.0, 2.0)]),
        ("Who lit the lighthouse?", [],
         [("It was first lit in 1810.", "1810", 3.0, -1.0), ("It stands off Angus.", "Angus", 1.0, 2.0)]),
        ("When was the lighthouse first lit?", ["1810", "in 1810"],
         [("It was first lit in the 1810s.", "1810s", 4.0, -1.0), ("Built 1807-1810 by Stevenson.", "1807-1810", 3.0,
                                                                    -1.0)])]
# By hand, at threshold 0 (a reader trained a paragraph at a time abstains where every passage's null beats its
# span by more than 0; the best span is the one of highest score):
# k = 1: "Stevenson." is "Stevenson" (EM 1, F1 1: the best over the answers; against "Robert Stevenson" F1 2/3),
#   "Inchcape" 0/0, "" for an unanswerable question 1/1 (its only gold answer is ""), "1810" for one 0/0, "1810s"
#   0/0 (not the token 1810): EM 2/5, F1 2/5. Recall@1: of the 3 answerable, only the first passage of question 1
#   holds an answer (question 2's holds "lighthouse" alone): 1/3.
# k = 2: question 2 answers "Bell Rock" (4 beats 2): EM 0, F1 of 2 tokens against "bell rock lighthouse" (3):
#   2 x 1 x 2/3 / (1 + 2/3) = 0.8; the rest as at k = 1: EM 2/5, F1 2.8/5. Recall@2: question 2's second passage
#   holds "the Bell Rock Lighthouse" (articles dropped on both sides): 2/3. "1807-1810" holds no "1810" by the one
#   matcher ("18071810"), where DPR's has_answer, splitting at the hyphen, would find it: docs/QA_SYSTEM.md.
BY_HAND = {1: {"exact": 40.0, "f1": 40.0, "HasAns_exact": 100 / 3, "HasAns_f1": 100 / 3, "NoAns_exact": 50.0,
               "NoAns_f1": 50.0, "recall": 100 / 3},
           2: {"exact": 40.0, "f1": 56.0, "HasAns_exact": 100 / 3, "HasAns_f1": 60.0, "NoAns_exact": 50.0,
               "NoAns_f1": 50.0, "recall": 200 / 3}}


def hand_files(tmp_path):
    """The questions of HAND as answer strings (JSON lines; DPR's CSV, Python's literals) and as SQuAD with a
    paragraph holding their answers."""
    rows = [{"id": f"h{i}", "question": q, "answers": answers} for i, (q, answers, _) in enumerate(HAND)]
    table = "".join(f"{q}\t{answers!r}\n" for q, answers, _ in HAND)
    squad = []
    for i, (q, answers, _) in enumerate(HAND):
        context = "The Bell Rock Lighthouse was built by Robert Stevenson and first lit in 1810; call it the Bell " \
                  "Rock Lighthouse."
        squad.append({"id": f"h{i}", "title": "Bell Rock", "context": context, "question": q,
                      "answers": {"text": answers, "answer_start": [context.find(a) for a in answers]}})
    return (write(tmp_path, "hand.jsonl", jsonl(rows)), write(tmp_path, "hand.csv", table),
            write(tmp_path, "hand-squad.jsonl", jsonl(squad)))


def test_em_f1_and_recall_on_answer_strings_are_the_official_rules_pinned_by_hand(tmp_path):
    """Through the loader and the QA system's own row (utils.system.measure.system_row): EM/F1 by the official SQuAD
    v2 normalisation, the best over a question's answers, "" right for one without; recall@k by the one answer
    matcher over the answerable questions; the same numbers as the same questions given with their paragraph."""
    retrieved = [[{"passage_id": f"p{i}{j}", "text": text} for j, (text, *_) in enumerate(passages)]
                 for i, (_, _, passages) in enumerate(HAND)]
    readings = [[{"passage_id": f"p{i}{j}", "text": span, "score": score, "null_minus_best": margin}
                 for j, (_, span, score, margin) in enumerate(passages)] for i, (_, _, passages) in enumerate(HAND)]
    at_zero = Setting(0.0, 0.0, None, 0.0, None)
    for path in hand_files(tmp_path):
        questions = load_questions(path, need_context=False)
        assert [q["answers"]["text"] for q in questions] == [answers for _, answers, _ in HAND]
        for k, want in BY_HAND.items():
            row = system_row(AnswerSettings(), at_zero, k, {}, questions, retrieved, readings, shared_norm=False)
            assert {key: row[key] for key in want} == pytest.approx(want), (path, k)
            assert (row["total"], row["HasAns_total"], row["NoAns_total"]) == (5, 3, 2)


def test_the_gold_paragraph_row_needs_the_paragraphs_and_the_folds_are_named_by_what_they_keep_whole(tmp_path):
    strings, table, squad = (load_questions(path, need_context=False) for path in hand_files(tmp_path))
    assert ceiling_left_out(squad, None, tuned=False) is None and ceiling_left_out(squad, squad, tuned=True) is None
    assert ceiling_left_out(strings, None, tuned=False) == ("left out: the questions do not all come with their "
                                                            "paragraph (a 'context')")
    assert ceiling_left_out(squad, strings, tuned=True).startswith("left out: its threshold is tuned on "
                                                                   "--validation_file's paragraphs")
    assert ceiling_left_out(squad, strings, tuned=False) is None  # a threshold given: no paragraphs to tune on
    unlabelled = [{**q, "answers": None} for q in strings]
    assert ceiling_left_out(unlabelled, None, tuned=False) is None  # nothing scored, nothing to say
    tuning = AnswerSettings()
    assert tuning_source(tuning, "hand.csv", True, cross_fit_folds(table), True) == (
        "tuned on this very file: an upper bound (crossfit: each half of its questions answered as tuned on the "
        "other); the weight cross-fitted over two folds of its questions")
    assert tuning_source(tuning, "x", False, cross_fit_folds([*squad, *[{**q, "id": f"s{q['id']}"} for q in strings]]),
                         True) == ("tuned on x; the weight cross-fitted over two folds of its articles (a question "
                                   "without a title or paragraph its own)")


def test_qa_system_measures_answer_strings_as_it_measures_the_same_questions_with_their_paragraphs(trained_models,
                                                                                                   tmp_path):
    """qa_system.py end to end (BM25, a trained reader) on the sample's first questions given three ways: SQuAD rows
    with their paragraphs, JSON lines of answer strings, DPR's CSV. The same readings, so the same rows (EM/F1 and
    recall) and predictions; without paragraphs the gold row is left out and said so. Tuned on answer strings, the
    rows are cross-fitted over folds of questions; questions with paragraphs tuned on answer strings have no gold row
    either (its threshold is tuned on the validation questions' paragraphs)."""
    reader, _ = trained_models
    questions, _ = load_squad(f"{SAMPLE}/dev.json")
    paragraphs = write(tmp_path, "paragraphs.jsonl", jsonl(questions))
    strings = write(tmp_path, "strings.jsonl", jsonl({"id": q["id"], "question": q["question"],
                                                      "answers": q["answers"]["text"]} for q in questions))
    table = write(tmp_path, "nq-style.csv", "".join(f"{q['question']}\t{q['answers']['text']!r}\n"
                                                    for q in questions))

    def qa(path, *extra):
        out = tmp_path / f"out-{len(os.listdir(tmp_path))}"
        proc = run_script("qa_system.py", "--retriever", "bm25", "--reader", reader, "--passages",
                          f"{SAMPLE}/dpr_passages.jsonl", "--questions", path, "--max_questions", 10, "--eval_k", 1,
                          3, "--output_dir", out, *extra)
        return json.load(open(out / "eval_results.json")), json.load(open(out / "predictions.json")), proc.stdout

    results, predictions, _ = qa(paragraphs, "--no_answer_threshold", 100)  # answers every question
    assert results["gold_paragraphs"] and "gold_paragraphs_left_out" not in results
    assert sum(not q["answers"]["text"] for q in questions[:10]) == 2  # both kinds of question are scored
    assert all(predictions.values()) and max(row["f1"] for row in results["rows"]) > 0  # spans, partly right
    keys = ("k", "threshold", "recall", "exact", "f1", "HasAns_f1", "NoAns_f1", "total")
    for path in (strings, table):
        other, other_predictions, stdout = qa(path, "--no_answer_threshold", 100)
        assert [{key: row[key] for key in keys} for row in other["rows"]] == \
            [{key: row[key] for key in keys} for row in results["rows"]], path
        assert list(other_predictions.values()) == list(predictions.values())
        assert other["gold_paragraphs"] is None and other["gold_paragraphs_left_out"] == \
            "left out: the questions do not all come with their paragraph (a 'context')"
        assert "gold paragraphs (the ceiling): left out: the questions do not all come with" in stdout
        assert list(other_predictions) == ([q["id"] for q in questions[:10]] if path == strings
                                           else [str(i) for i in range(1, 11)])  # DPR's rows: their line numbers

    tuned, _, _ = qa(strings, "--validation_file", strings, "--retriever_weight", 0)
    assert tuned["threshold_source"] == ("tuned on this very file: an upper bound (crossfit: each half of its "
                                         "questions answered as tuned on the other)")
    assert all("crossfit" in row for row in tuned["rows"]) and tuned["gold_paragraphs"] is None
    other, _, _ = qa(paragraphs, "--validation_file", table, "--retriever_weight", 0)  # the same questions, as DPR's
    assert [row["recall"] for row in other["rows"]] == [row["recall"] for row in tuned["rows"]]
    assert other["threshold_source"] == f"tuned on {table}" and other["gold_paragraphs"] is None
    assert other["gold_paragraphs_left_out"].startswith("left out: its threshold is tuned on --validation_file's")

"""export_feedback.py, as a user runs it: labels written into a real SQLite feedback store (every verdict, a question
labelled twice, a "wrong" after a span, an abstention marked right, a malformed row), exported, each file's exact
content checked and read back by the project's own loaders, the SQuAD file trained on; a bad store, an empty one and
an output directory the export must not replace refused in one line, leaving nothing behind."""

import json
import os
import sqlite3

import pytest
import sqlalchemy as sa
from conftest import assert_user_error, run_script
from postgres import Postgres

from utils.feedback.export import export, kind_of, question_key
from utils.feedback.store import FeedbackStore
from utils.files.dpr import load_dpr
from utils.files.squad import load_questions, load_squad
from utils.runtime.output_dir import MARKER

P1 = {"passage_id": "guide.md#0", "title": "Guide", "text": "The lighthouse was designed by Ada Byron in 1871.",
      "document": "guide.md"}
P2 = {"passage_id": "guide.md#1", "title": "Guide", "text": "Ada Byron also drew its lamp, which burns whale oil.",
      "document": "guide.md"}
P3 = {"passage_id": "notes.txt#0", "title": "notes", "text": "Harbour fees rose in 1902 after the storm.",
      "document": "notes.txt"}
P4 = {"passage_id": "p-4", "title": "Corpus title", "text": "The keeper's house has three rooms.", "document": None}


def label(question, verdict, shown, given="", span=None) -> dict:
    """A label as the server writes one (utils.feedback.labels.label_of): `span` = (passage, answer) where the
    answer is, in that passage as read."""
    row = {"question": question, "verdict": verdict, "given": given, "index_version": 4, "reader": "r" * 32,
           "given_passage_id": shown[0]["passage_id"] if given else None, "shown": shown}
    if span:
        passage, answer = span
        start = passage["text"].index(answer)
        row.update(passage_id=passage["passage_id"], title=passage["title"], text=passage["text"],
                   document=passage["document"], answer_start=start, answer_end=start + len(answer), answer=answer)
    return row


LABELS = [  # ids 1 to 8, in this order
    label("Who designed the lighthouse?", "span", [P3, P1, P2], "1871", (P1, "Ada")),  # superseded by 6
    label("When were the harbour fees raised?", "wrong", [P1], "1871"),  # not a label
    label("When did harbour fees rise?", "right", [P3, P1], "1902", (P3, "1902")),
    label("What colour is the lamp?", "right", [P2, P4]),  # the abstention was right: unanswerable
    {**label("Who paid for the lamp?", "no_answer", [P3, P1], "1871"), "given_passage_id": P1["passage_id"]},
    label("who designed  the Lighthouse?", "span", [P3, P1, P2], "Ada", (P1, "Ada Byron")),  # the same question
    label("Who designed the lighthouse?", "wrong", [P3, P1, P2], "Ada Byron"),  # after a label: replaces nothing
    {**label("How tall is the lighthouse?", "span", [P3], "", (P3, "1902")), "answer_start": 40, "answer_end": 99},
]


def qa(qid, question, answer=None, context=None) -> dict:
    answers = [{"text": answer, "answer_start": context.index(answer)}] if answer else []
    return {"id": qid, "question": question, "answers": answers, "is_impossible": not answers}


def ctx(p) -> dict:
    return {"title": p["title"], "text": p["text"], "passage_id": p["passage_id"]}


SQUAD = {"version": "v2.0", "data": [
    {"title": "notes.txt", "paragraphs": [
        {"context": P3["text"], "qas": [qa("feedback-3", "When did harbour fees rise?", "1902", P3["text"])]}]},
    {"title": "guide.md", "paragraphs": [
        # an unanswerable label: one question, in the passage its answer came from, else the first shown
        {"context": P2["text"], "qas": [qa("feedback-4", "What colour is the lamp?")]},
        {"context": P1["text"], "qas": [qa("feedback-5", "Who paid for the lamp?"),
                                        qa("feedback-6", "who designed  the Lighthouse?", "Ada Byron", P1["text"])]}]}]}
QUESTIONS = [
    {"id": "feedback-3", "question": "When did harbour fees rise?", "answers": ["1902"], "title": "notes.txt"},
    {"id": "feedback-4", "question": "What colour is the lamp?", "answers": [], "title": ""},
    {"id": "feedback-5", "question": "Who paid for the lamp?", "answers": [], "title": ""},
    {"id": "feedback-6", "question": "who designed  the Lighthouse?", "answers": ["Ada Byron"], "title": "guide.md"}]
DPR = [  # P2 holds "Ada Byron": shown with question 6, it is no negative of it
    {"dataset": "feedback", "id": "feedback-3", "question": "When did harbour fees rise?", "answers": ["1902"],
     "positive_ctxs": [ctx(P3)], "negative_ctxs": [], "hard_negative_ctxs": [ctx(P1)]},
    {"dataset": "feedback", "id": "feedback-6", "question": "who designed  the Lighthouse?", "answers": ["Ada Byron"],
     "positive_ctxs": [ctx(P1)], "negative_ctxs": [], "hard_negative_ctxs": [ctx(P3)]}]
COUNTS = {"rows": 8, "wrong_not_labels": 2, "labels": 5, "superseded": 1, "malformed": 1, "answerable": 2,
          "unanswerable": 2, "last_label_id": 8}


def store_with(path, labels) -> str:
    store = FeedbackStore(str(path))
    for row in labels:
        store.add(row)
    store.close()
    return str(path)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """(the store, the output directory, the script's run) of an export of LABELS."""
    tmp = tmp_path_factory.mktemp("export")
    db = store_with(tmp / "feedback.sqlite", LABELS)
    out = str(tmp / "out")
    return db, out, run_script("export_feedback.py", "--feedback_db", db, "--output_dir", out)


def test_every_verdict_becomes_what_the_rule_says_in_each_layout(exported):
    db, out, proc = exported
    assert sorted(os.listdir(out)) == sorted([MARKER, "squad.json", "questions.jsonl", "dpr.json", "export.json"])
    assert json.load(open(os.path.join(out, "squad.json"))) == SQUAD
    assert [json.loads(line) for line in open(os.path.join(out, "questions.jsonl"))] == QUESTIONS
    assert json.load(open(os.path.join(out, "dpr.json"))) == DPR
    summary = json.load(open(os.path.join(out, "export.json")))
    assert summary["feedback_db"] == db and summary["counts"] == COUNTS
    assert summary["squad"] == {"articles": 2, "paragraphs": 3, "questions": 4, "impossible": 2}
    assert summary["questions"] == {"questions": 4, "unanswerable": 2}
    assert summary["dpr"] == {"questions": 2, "skipped_unanswerable": 2, "hard_negatives": 2,
                              "shown_holding_the_answer": 1}
    assert list(summary["malformed"]) == ["8"] and "is not a span" in summary["malformed"]["8"]
    assert "latest label" in summary["rule"]
    assert f"{out}: 4 questions (2 answerable, 2 unanswerable) from 8 rows up to label 8" in proc.stdout


def test_each_file_loads_with_the_loader_of_the_script_that_reads_it(exported):
    _, out, _ = exported
    examples, repaired = load_squad(os.path.join(out, "squad.json"))  # train_reader.py --train_file
    assert repaired == 0 and [ex["id"] for ex in examples] == ["feedback-3", "feedback-4", "feedback-5",
                                                               "feedback-6"]
    assert examples[3]["answers"] == {"text": ["Ada Byron"], "answer_start": [31]}
    questions = load_questions(os.path.join(out, "questions.jsonl"), need_context=False)  # qa_system.py --questions
    assert [(q["id"], q["title"], q["answers"]["text"]) for q in questions] == \
        [(q["id"], q["title"], q["answers"]) for q in QUESTIONS]
    dpr = load_dpr(os.path.join(out, "dpr.json"))  # train_dpr.py --train_file
    assert [(q["id"], q["positive_ctxs"], q["hard_negative_ctxs"]) for q in dpr] == \
        [(q["id"], q["positive_ctxs"], q["hard_negative_ctxs"]) for q in DPR]


def test_the_exported_squad_file_trains_a_reader(exported, tiny_bert_dir, tmp_path):
    _, out, _ = exported
    squad, reader = os.path.join(out, "squad.json"), str(tmp_path / "reader")
    run_script("train_reader.py", "--model_name_or_path", tiny_bert_dir, "--output_dir", reader, "--train_file", squad,
               "--validation_file", squad, "--max_train_steps", 1, "--per_device_train_batch_size", 4,
               "--eval_before_training", "false")
    assert json.load(open(os.path.join(reader, "eval_results.json")))["updates"] == 1
    assert set(json.load(open(os.path.join(reader, "predictions.json")))) == {
        q["id"] for a in SQUAD["data"] for p in a["paragraphs"] for q in p["qas"]}


def test_the_rule_on_labels_out_of_order_and_rows_that_are_no_label():
    """Pure functions, no store: the highest id wins whatever the order read; what is no label, and why."""
    rows = [{**LABELS[5], "id": 6}, {**LABELS[0], "id": 1}]
    squad, questions, dpr, summary = export(iter(rows))
    assert [q["id"] for q in questions] == ["feedback-6"] and summary["counts"]["superseded"] == 1
    assert question_key(" Who\tdesigned the LIGHTHOUSE? ") == question_key("who designed the lighthouse?")
    assert question_key("Who designed the lighthouse") != question_key("Who designed the lighthouse?")
    assert kind_of({**LABELS[4], "verdict": "maybe"}) == ("malformed", "verdict 'maybe' is none of right, wrong, "
                                                                       "span, no_answer")
    assert kind_of({**LABELS[2], "passage_id": None, "text": None, "answer_start": None, "answer_end": None,
                    "answer": None})[0] == "malformed"  # right with an answer but no span
    assert kind_of({**LABELS[4], "shown": []}) == ("malformed", "no passage shown")
    assert kind_of(LABELS[1]) == ("wrong", None) and kind_of(LABELS[3]) == ("unanswerable", None)


def assert_refused_leaving_nothing(proc, expected, tmp_path, out):
    assert_user_error(proc, expected)
    assert not os.path.exists(out) and not [n for n in os.listdir(tmp_path) if n.startswith(".")]


def test_a_missing_or_bad_store_is_one_line_and_nothing_is_created(tmp_path):
    out = str(tmp_path / "out")
    missing = str(tmp_path / "missing.sqlite")
    proc = run_script("export_feedback.py", "--feedback_db", missing, "--output_dir", out, check=False)
    assert_refused_leaving_nothing(proc, f"--feedback_db {missing}: no such file", tmp_path, out)
    assert not os.path.exists(missing)  # not created, as opening it for the server would
    proc = run_script("export_feedback.py", "--feedback_db", tmp_path, "--output_dir", out, check=False)
    assert_refused_leaving_nothing(proc, "is a directory, not a file", tmp_path, out)
    text = tmp_path / "notes.sqlite"
    text.write_text("these are my notes, not a database\n" * 50)
    proc = run_script("export_feedback.py", "--feedback_db", text, "--output_dir", out, check=False)
    assert_refused_leaving_nothing(proc, f"--feedback_db {text}: cannot open it (file is not a database)",
                                   tmp_path, out)
    other = tmp_path / "other.sqlite"  # a SQLite database of something else: refused, and left as it was
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE mine (x)")
    proc = run_script("export_feedback.py", "--feedback_db", other, "--output_dir", out, check=False)
    assert_refused_leaving_nothing(proc, "holds no feedback labels (no table qa_amp_feedback)", tmp_path, out)
    with sqlite3.connect(other) as conn:
        assert conn.execute("SELECT name FROM sqlite_master").fetchall() == [("mine",)]
    proc = run_script("export_feedback.py", "--feedback_db", "nosuchdb://x/y", "--output_dir", out, check=False)
    assert_refused_leaving_nothing(proc, "--feedback_db nosuchdb://x/y: not a database URL or file", tmp_path, out)


def test_a_store_without_a_label_is_nothing_to_export(tmp_path):
    out = str(tmp_path / "out")
    empty = store_with(tmp_path / "empty.sqlite", [])
    proc = run_script("export_feedback.py", "--feedback_db", empty, "--output_dir", out, check=False)
    assert_refused_leaving_nothing(proc, f"--feedback_db {empty}: nothing to export: it holds no labels", tmp_path,
                                   out)
    wrong = store_with(tmp_path / "wrong.sqlite", [LABELS[1], LABELS[7]])
    proc = run_script("export_feedback.py", "--feedback_db", wrong, "--output_dir", out, check=False)
    assert_refused_leaving_nothing(proc, "nothing to export: none of its 2 rows is a label (1 'wrong', which is no "
                                         "label; 1 malformed)", tmp_path, out)


def test_an_output_directory_is_replaced_only_when_told(exported, tmp_path):
    db, earlier, _ = exported
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("my own file")
    proc = run_script("export_feedback.py", "--feedback_db", db, "--output_dir", mine, check=False)
    assert_user_error(proc, f"{mine} is not empty and was not written by a run of this project")
    assert os.listdir(mine) == ["notes.txt"]
    again = tmp_path / "again"
    run_script("export_feedback.py", "--feedback_db", db, "--output_dir", again)
    before = (again / "squad.json").read_text()
    proc = run_script("export_feedback.py", "--feedback_db", db, "--output_dir", again, check=False)
    assert_user_error(proc, f"{again} holds the outputs of an earlier run (by export_feedback.py)")
    run_script("export_feedback.py", "--feedback_db", db, "--output_dir", mine, "--overwrite_output_dir")
    assert sorted(os.listdir(mine)) == sorted(os.listdir(earlier)) and (mine / "squad.json").read_text() == before
    inside = tmp_path / "inside"  # the store in the directory an export would replace whole
    inside.mkdir()
    moved = store_with(inside / "feedback.sqlite", LABELS[:3])
    proc = run_script("export_feedback.py", "--feedback_db", moved, "--output_dir", inside, "--overwrite_output_dir",
                      check=False)
    assert_user_error(proc, f"--output_dir {inside}: holds the --feedback_db {moved}")
    assert os.path.isfile(moved)


def test_a_postgresql_store_exports_the_same_and_its_password_is_not_written(exported, tmp_path):
    """The store several servers share: the same files as from SQLite; export.json names it without its password;
    a database of this server that is no store is refused and gets no table."""
    _, earlier, _ = exported
    server = Postgres()
    try:
        url = server.database("labels").replace("://qa@", "://qa:s3cret@")  # trust: the password is not checked
        store_with(url, LABELS)
        out = tmp_path / "out"
        run_script("export_feedback.py", "--feedback_db", url, "--output_dir", out)
        for name in ("squad.json", "questions.jsonl", "dpr.json"):
            assert (out / name).read_text() == open(os.path.join(earlier, name)).read()
        written = (out / "export.json").read_text()
        assert "s3cret" not in written and json.loads(written)["feedback_db"] == url.replace("s3cret", "***")
        other = server.database("other")
        proc = run_script("export_feedback.py", "--feedback_db", other, "--output_dir", tmp_path / "none",
                          check=False)
        assert_user_error(proc, "holds no feedback labels (no table qa_amp_feedback)")
        engine = sa.create_engine(other)
        assert sa.inspect(engine).get_table_names() == [] and not os.path.exists(tmp_path / "none")
        engine.dispose()
    finally:
        server.stop()

"""Loading and validating SQuAD-format files: every user error is one line naming the file and the example."""

import json

import pytest
from conftest import SAMPLE

from utils.errors import UserError
from utils.reader.squad_data import split_by_article
from utils.files.squad import load_squad


def write(tmp_path, obj, name="data.json"):
    path = tmp_path / name
    path.write_text(obj if isinstance(obj, str) else json.dumps(obj))
    return str(path)


def squad(qas, context="Ada built a loom in 1823.", title="T"):
    return {"version": "v2.0", "data": [{"title": title, "paragraphs": [{"context": context, "qas": qas}]}]}


def test_loads_the_shipped_sample_v2():
    examples, repaired = load_squad(f"{SAMPLE}/train.json")
    assert len(examples) > 200 and repaired == 0
    impossible = [e for e in examples if not e["answers"]["text"]]
    assert 0 < len(impossible) < len(examples)
    for e in examples:
        for text, start in zip(e["answers"]["text"], e["answers"]["answer_start"]):
            assert e["context"][start:start + len(text)] == text


def test_flattened_json_and_jsonl(tmp_path):
    row = {"id": "x1", "title": "T", "context": "Ada built a loom.", "question": "Who built a loom?",
           "answers": {"text": ["Ada"], "answer_start": [0]}}
    for path in (write(tmp_path, [row]), write(tmp_path, {"data": [row]}, "d2.json"),
                 write(tmp_path, json.dumps(row) + "\n\n", "d.jsonl")):
        examples, _ = load_squad(path)
        assert examples == [row]


def test_off_by_some_answer_start_is_repaired_and_counted(tmp_path):
    path = write(tmp_path, squad([{"id": "q1", "question": "When?", "answers": [{"text": "1823", "answer_start": 3}]}]))
    examples, repaired = load_squad(path)
    assert repaired == 1 and examples[0]["answers"]["answer_start"] == [20]


def test_impossible_questions_have_no_answers(tmp_path):
    qa = {"id": "q1", "question": "Why?", "is_impossible": True, "answers": [],
          "plausible_answers": [{"text": "loom", "answer_start": 12}]}
    examples, _ = load_squad(write(tmp_path, squad([qa])))
    assert examples[0]["answers"] == {"text": [], "answer_start": []}


@pytest.mark.parametrize("content, message", [
    ("{not json", "not valid JSON"),
    ({"data": []}, "the dataset is empty"),
    ({"data": {"x": 1}}, "expected a list"),
    (squad([]), "has no questions"),
    (squad([{"id": "q9", "answers": []}]), "example q9: missing key 'question'"),
    (squad([{"id": "q9", "question": "Who?", "answers": [{"text": "Bob", "answer_start": 0}]}]),
     "example q9: answer 'Bob' does not occur in its context"),
    (squad([{"id": "q9", "question": "Who?", "answers": [{"text": "Ada"}]}]), "example q9: missing key 'answer_start'"),
    (squad([{"id": "q9", "question": "Who?", "answers": []}, {"id": "q9", "question": "What?", "answers": []}]),
     "example q9: duplicate id"),
    (squad([{"id": "q9", "question": "  ", "answers": []}]), "example q9: empty question"),
    ({"data": [{"title": "T"}]}, "missing key 'paragraphs'"),
    (squad([{"id": "q9", "question": "Who?", "is_impossible": True, "answers": [{"text": "Ada", "answer_start": 0}]}]),
     "example q9: 'is_impossible' is true but it lists 1 answer(s)"),
    (squad([{"id": "q9", "question": "Who?", "is_impossible": False, "answers": []}]),
     "example q9: 'is_impossible' is false but it lists no answers"),
    (squad([{"id": "q9", "question": "Who?", "is_impossible": "no", "answers": []}]),
     "example q9: 'is_impossible' should be bool"),
    ([{"id": "r1", "context": "c", "question": "q", "answers": {"text": ["c"], "answer_start": ["0"]}}],
     "example r1: 'answers' needs"),
])
def test_bad_input_is_a_one_line_error_naming_file_and_example(tmp_path, content, message):
    path = write(tmp_path, content)
    with pytest.raises(UserError) as err:
        load_squad(path)
    assert str(err.value).startswith(path) and message in str(err.value) and "\n" not in str(err.value)


def test_missing_file(tmp_path):
    with pytest.raises(UserError, match="no such file"):
        load_squad(str(tmp_path / "nope.json"))
    with pytest.raises(UserError, match="is a directory, not a file"):
        load_squad(str(tmp_path))


def test_json_lines_errors_name_the_line_and_json_lines_in_a_json_file_are_read(tmp_path):
    row = {"id": "x1", "title": "T", "context": "Ada built a loom.", "question": "Who built a loom?",
           "answers": {"text": ["Ada"], "answer_start": [0]}}
    lines = [json.dumps({**row, "id": f"x{i}"}) for i in range(5)]
    assert [e["id"] for e in load_squad(write(tmp_path, "\n".join(lines), "rows.json"))[0]] == \
        [f"x{i}" for i in range(5)]
    broken = "\n".join(lines[:3] + ['{"id": "x3", "title": "T",'] + lines[4:])
    for name in ("rows.jsonl", "broken.json"):
        with pytest.raises(UserError) as err:
            load_squad(write(tmp_path, broken, name))
        assert f"{name}: line 4: not valid JSON" in str(err.value)


def test_dev_split_is_by_article_without_leakage():
    examples, _ = load_squad(f"{SAMPLE}/train.json")
    train, dev = split_by_article(examples, 0.3, seed=1)
    assert len(train) + len(dev) == len(examples) and dev and train
    assert not {e["title"] for e in train} & {e["title"] for e in dev}
    assert not {e["context"] for e in train} & {e["context"] for e in dev}
    assert split_by_article(examples, 0.3, seed=1) == (train, dev)


def test_one_questions_loader_for_every_layout_with_one_rule_for_ids_answers_and_contexts(tmp_path):
    from utils.files.squad import load_questions

    labelled = squad([{"id": "q1", "question": "Who built a loom?", "answers": [{"text": "Ada", "answer_start": 0}]},
                      {"id": "q2", "question": "Why?", "is_impossible": True, "answers": []}])
    unlabelled = squad([{"id": "q1", "question": "Who built a loom?"}, {"id": "q2", "question": "Why?"}])
    rows = [{"id": "r1", "question": "Who built a loom?", "context": "Ada built a loom in 1823."},
            {"id": "r2", "question": "When?"}]
    got = load_questions(write(tmp_path, labelled), need_context=False)
    assert [q["answers"]["text"] for q in got] == [["Ada"], []]
    assert [q["answers"] for q in load_questions(write(tmp_path, unlabelled, "u.json"))] == [None, None]
    got = load_questions(write(tmp_path, "".join(json.dumps(r) + "\n" for r in rows), "r.jsonl"), need_context=False)
    assert [(q["id"], q["context"], q["answers"]) for q in got] == \
        [("r1", rows[0]["context"], None), ("r2", None, None)]
    cases = [(squad([{"question": "Who?"}]), "data.json: article 'T' paragraph 0 question 0: missing key 'id'"),
             ("".join(json.dumps(r) + "\n" for r in [rows[0], {"question": "Who?"}]),
              "data.json: line 2: missing key 'id'"),
             ("".join(json.dumps(r) + "\n" for r in rows), "data.json: example r2: missing key 'context'"),
             (squad([labelled["data"][0]["paragraphs"][0]["qas"][0], {"id": "q3", "question": "What?"}]),
              "example q3: some questions carry answers and some do not")]
    for content, message in cases:
        with pytest.raises(UserError) as err:
            load_questions(write(tmp_path, content), need_context=True)
        assert message in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(UserError, match="article 'T' paragraph 0 question 0: missing key 'id'"):
        load_squad(write(tmp_path, squad([{"question": "Who?", "answers": []}])))  # training data: the same rule

"""DPR files, negatives selection, evaluation corpus and the SQuAD -> DPR converter."""

import json

import pytest
from conftest import SAMPLE

from make_dpr_data import build
from make_dpr_data import main as convert
from utils.errors import UserError
from utils.files.squad import load_squad
from utils.files.answers import answer_patterns, holds_answer, normalized
from utils.files.corpus import byte_ranges, load_passages, passage_key, stream_passages
from utils.files.dpr import evaluation_corpus, load_dpr, training_passages


def ctx(pid, text=None):
    return {"title": "T", "text": text or f"text of {pid}", "passage_id": pid}


def q(qid, pos, hard=(), neg=()):
    return {"id": qid, "question": f"question {qid}?", "answers": ["x"], "positive_ctxs": [ctx(pos)],
            "hard_negative_ctxs": [ctx(h) for h in hard], "negative_ctxs": [ctx(n) for n in neg]}


def test_negatives_fall_back_from_hard_to_negative_to_random():
    data = [q("a", "p1", hard=["h1"], neg=["n1", "n2"]), q("b", "p2"), q("c", "p3", hard=["h1", "h2", "h3"]),
            q("d", "p4")]
    chosen = training_passages(data, 3, seed=0)
    assert [c["passage_id"] for c in chosen[0]] == ["p1", "h1", "n1", "n2"]
    assert [c["passage_id"] for c in chosen[2]] == ["p3", "h1", "h2", "h3"]
    b = [c["passage_id"] for c in chosen[1]]
    assert b[0] == "p2" and len(b) == 4 and "p2" not in b[1:]  # topped up with other questions' positives
    assert training_passages(data, 3, seed=0) == chosen


def test_evaluation_corpus_adds_missing_gold_passages():
    dev = [q("a", "p1"), q("b", "p9")]
    corpus, added = evaluation_corpus(dev, [ctx("p1"), ctx("p2")])
    assert [c["passage_id"] for c in corpus] == ["p1", "p2", "p9"] and added == 1
    corpus, added = evaluation_corpus([q("a", "p1", hard=["h"])], None)
    assert [c["passage_id"] for c in corpus] == ["p1", "h"] and added == 0


@pytest.mark.parametrize("name", ["corpus.jsonl", "corpus.json"])
def test_one_json_lines_reader_takes_line_and_paragraph_separators_inside_a_passage_as_json_does(tmp_path, name):
    """JSON lines are split at "\n" only: U+2028, U+2029 and U+0085 are legal raw in a JSON string. The corpus
    loader (qa_system.py, BM25, Retriever.index) broke lines at them too (str.splitlines), so a corpus that
    index_corpus.py streamed (split at "\n") was refused there; both read the lines alike now, and report a bad
    line by the same number."""
    texts = ["a line\u2028separator", "a paragraph\u2029separator", "a next\u0085line", "crlf ends this line"]
    lines = [json.dumps(ctx(f"p{i}", t), ensure_ascii=False) for i, t in enumerate(texts)]
    path = tmp_path / name
    path.write_bytes(("\n".join(lines[:3]) + "\n\n" + lines[3] + "\r\n").encode("utf-8"))
    loaded = load_passages(str(path))
    streamed = [p for start, stop in byte_ranges(str(path), 2) for p, _, _ in stream_passages(str(path), start, stop)]
    assert loaded == streamed and [p["text"] for p in loaded] == texts
    path.write_bytes(path.read_bytes() + b'{"passage_id": "p9", "text": \n')
    for read in (lambda: load_passages(str(path)), lambda: list(stream_passages(str(path), 0, path.stat().st_size))):
        with pytest.raises(UserError, match=f"{name}: line 6: not valid JSON"):
            read()


def test_passage_key_falls_back_to_text():
    assert passage_key({"text": "abc", "passage_id": None}) == "text:abc"


@pytest.mark.parametrize("content, message", [
    ("[", "not valid JSON"),
    ("[]", "the dataset is empty"),
    ('[{"id": "q7", "question": "Who?", "positive_ctxs": []}]',
     "question q7: needs at least one entry in 'positive_ctxs'"),
    ('[{"id": "q7", "positive_ctxs": [{"text": "x"}]}]', "question q7: missing or empty 'question'"),
    ('[{"id": "q7", "question": "Who?", "positive_ctxs": [{"title": "t"}]}]', "question q7: every passage needs"),
])
def test_bad_dpr_files(tmp_path, content, message):
    path = tmp_path / "d.json"
    path.write_text(content)
    with pytest.raises(UserError) as err:
        load_dpr(str(path))
    assert str(err.value).startswith(str(path)) and message in str(err.value)


def test_converter_on_the_sample(tmp_path):
    examples, _ = load_squad(f"{SAMPLE}/train.json")
    data, passages = build(examples, num_hard_negatives=2, num_negatives=1, seed=0)
    assert len(data) == sum(1 for e in examples if e["answers"]["text"])
    assert len(passages) == len({e["context"] for e in examples})
    by_id = {e["id"]: e for e in examples}
    with_hard = 0
    for row in data:
        ex = by_id[row["id"]]
        assert row["positive_ctxs"][0]["text"] == ex["context"]
        for c in row["hard_negative_ctxs"] + row["negative_ctxs"]:
            assert c["passage_id"] != row["positive_ctxs"][0]["passage_id"]
            assert not holds_answer(normalized(c["text"]), answer_patterns(row["answers"]))
        with_hard += bool(row["hard_negative_ctxs"])
    assert with_hard > 0.9 * len(data)

    out, corpus = tmp_path / "dpr.json", tmp_path / "passages.jsonl"
    convert([f"{SAMPLE}/train.json", "--output", str(out), "--passages", str(corpus)])
    assert len(load_dpr(str(out))) == len(data) and len(load_passages(str(corpus))) == len(passages)


def test_shipped_dpr_sample_is_what_the_converter_makes(tmp_path):
    out = tmp_path / "dev.json"
    convert([f"{SAMPLE}/dev.json", "--output", str(out)])
    assert json.loads(out.read_text()) == json.load(open(f"{SAMPLE}/dpr_dev.json"))


def test_converter_creates_the_output_directories(tmp_path):
    out, corpus = tmp_path / "new" / "dir" / "dpr.json", tmp_path / "other" / "passages.jsonl"
    convert([f"{SAMPLE}/dev.json", "--output", str(out), "--passages", str(corpus)])
    assert len(load_dpr(str(out))) == 44 and len(load_passages(str(corpus))) == 6

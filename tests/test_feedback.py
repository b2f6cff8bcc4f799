"""Feedback on the served answers, as users give it: serve.py started as a real process, asked over real HTTP, its
answers labelled through POST /feedback and read back through GET /feedback, on a SQLite file and on a throwaway
PostgreSQL server; bad feedback refused naming the field; a server on another address than loopback takes feedback
only with its token."""

import json
import urllib.error
import urllib.request

import pytest
from conftest import SAMPLE
from postgres import Postgres
from test_serve import Server

from utils.files.squad import load_questions
from utils.reader.trained import Reader

TOKEN = "s3cret-token-for-the-tests"


def call(server, path, data=None, token=None, raw=None):
    """(status, JSON body) of a request to `server`, with `token` as its bearer."""
    body = raw if raw is not None else (json.dumps(data).encode() if data is not None else None)
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    try:
        with urllib.request.urlopen(urllib.request.Request(server.url + path, data=body, headers=headers),
                                    timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


@pytest.fixture(scope="module")
def server(trained_models, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("feedback")
    s = Server(trained_models, tmp, "--feedback_db", tmp / "labels.sqlite")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def answers(server):
    """The server's answers (k = 3) to the sample's first questions, with at least one answered."""
    questions = [q["question"] for q in load_questions(f"{SAMPLE}/dev.json")][:12]
    status, body = call(server, "/ask", {"question": questions, "k": 3})
    assert status == 200 and any(a["answer"] for a in body["answers"])
    return list(zip(questions, body["answers"]))


def feedback(question, answer, verdict, span=None) -> dict:
    """A POST /feedback body for `answer` (as /ask gave it), as the page sends it."""
    shown = [{"passage_id": p["passage_id"], "position": p["position"]} for p in answer["passages"]]
    ids = [p["passage_id"] for p in answer["passages"]]
    body = {"question": question, "verdict": verdict, "passages": shown, "index_version": answer["index_version"],
            "reader": answer["settings"]["reader"], "answer": answer["answer"],
            "answer_passage": ids.index(answer["passage_id"]) if answer["answer"] else None}
    return {**body, **({"span": span} if span else {})}


def own_span(answer) -> dict:
    ids = [p["passage_id"] for p in answer["passages"]]
    return {"passage": ids.index(answer["passage_id"]), "start": answer["start"], "end": answer["end"],
            "text": answer["answer"]}


def test_each_verdict_is_stored_with_the_passages_as_they_were_read(server, answers, trained_models):
    (q1, answered), (q2, other) = next((qa for qa in answers if qa[1]["answer"])), answers[1]
    chosen = other["passages"][2]["text"]  # the user selects the passage's third word onward, 12 characters
    start = len(" ".join(chosen.split(" ")[:2])) + 1
    span = {"passage": 2, "start": start, "end": start + 12, "text": chosen[start:start + 12]}
    sent = [feedback(q1, answered, "right", own_span(answered)), feedback(q2, other, "span", span),
            feedback(q2, other, "wrong"), feedback(q2, other, "no_answer")]
    stored = []
    for body in sent:
        status, got = call(server, "/feedback", body)
        assert status == 201, got
        stored.append(got)
    status, listed = call(server, "/feedback?limit=100")
    assert status == 200 and listed["labels"][-4:] == stored and listed["next"] is None
    right, selected, wrong, none = stored
    reader = Reader.files_fingerprint(trained_models[0])
    assert answered["settings"]["reader"] == reader
    assert all(s["reader"] == reader and s["index_version"] == answered["index_version"] for s in stored)
    assert right["answer"] == answered["answer"] == right["given"] and right["passage_id"] == answered["passage_id"]
    assert right["text"][right["answer_start"]:right["answer_end"]] == answered["answer"]
    assert selected["text"] == chosen and selected["answer"] == chosen[start:start + 12]
    assert (selected["answer_start"], selected["answer_end"]) == (start, start + 12)
    assert [p["text"] for p in selected["shown"]] == [p["text"] for p in other["passages"]]
    assert wrong["answer"] is None and wrong["passage_id"] is None and wrong["verdict"] == "wrong"
    assert none["verdict"] == "no_answer" and none["answer_start"] is None
    # paged: each label once, in the order written
    first, total = call(server, "/feedback?limit=2")[1], listed["total"]
    rest = call(server, f"/feedback?after={first['next']}&limit=100")[1]
    assert first["labels"] + rest["labels"] == listed["labels"] and total == len(listed["labels"])


def broken(answers, how: str) -> dict:
    (question, answer) = next(qa for qa in answers if qa[1]["answer"])
    body = feedback(question, answer, "right", own_span(answer))
    span = body["span"]
    text = answer["passages"][span["passage"]]["text"]
    changes = {
        "outside": lambda: span.update(end=len(text) + 5, text=text[span["start"]:] + "xxxxx"),
        "not_the_text": lambda: span.update(text=span["text"].upper() + "!"),
        "verdict": lambda: body.update(verdict="maybe"),
        "position": lambda: body["passages"][0].update(position=body["passages"][0]["position"] + 1),
        "version": lambda: body.update(index_version=7),
        "no_span": lambda: body.update(verdict="span", span=None),
        "span_with_wrong": lambda: body.update(verdict="wrong"),
        "other_field": lambda: body.update(top_k=3),
        "offset_type": lambda: span.update(start="3"),
        "span_passage": lambda: span.update(passage=9),
        "reader": lambda: body.update(reader="0" * 32),
        "right_elsewhere": lambda: span.update(passage=(span["passage"] + 1) % len(body["passages"])),
        "right_on_abstention": lambda: body.update(answer=None, answer_passage=None),
        "passage_without_answer": lambda: body.update(verdict="wrong", span=None, answer=None),
        "blank_span": lambda: span.update(start=text.index(" "), end=text.index(" ") + 1, text=" "),
    }
    changes[how]()
    return body


@pytest.mark.parametrize("how, status, field", [
    ("outside", 422, "span.end"), ("not_the_text", 422, "span.text"), ("verdict", 422, "verdict"),
    ("position", 422, "passages[0]"), ("version", 409, "index_version"), ("no_span", 422, "span"),
    ("span_with_wrong", 422, "span"), ("other_field", 422, "top_k"), ("offset_type", 422, "span.start"),
    ("span_passage", 422, "span.passage"), ("reader", 409, "reader"), ("right_elsewhere", 422, "span.passage"),
    ("right_on_abstention", 422, "span"), ("passage_without_answer", 422, "answer_passage"),
    ("blank_span", 422, "span.text")])
def test_bad_feedback_is_refused_naming_the_field_and_writes_nothing(server, answers, how, status, field):
    before = call(server, "/feedback?limit=1")[1]["total"]
    code, body = call(server, "/feedback", broken(answers, how))
    assert (code, body["field"]) == (status, field) and body["error"].startswith(field + ":"), body
    assert call(server, "/feedback?limit=1")[1]["total"] == before


def test_an_oversized_or_malformed_body_and_a_bad_page_are_refused(server, answers):
    before = call(server, "/feedback?limit=1")[1]["total"]
    question, answer = answers[0]
    for field, body in [("question", {**feedback(question, answer, "wrong"), "question": "q\ud800"}),
                        ("question", {**feedback(question, answer, "wrong"), "question": "q\u0000"})]:
        code, refused = call(server, "/feedback", raw=json.dumps(body).encode())  # \ud800 as JSON sends it
        assert (code, refused["field"]) == (422, field), refused
    for after in (-1, 2 ** 31, 10 ** 20):
        assert call(server, f"/feedback?after={after}")[1]["field"] == "after"
    code, body = call(server, "/feedback", raw=b'{"question": "' + b"x" * (2 << 20) + b'"}')
    assert code == 413 and body["field"] == "body"
    code, body = call(server, "/feedback", raw=b'{"question": ')
    assert code == 422 and body["field"] == "body"
    assert call(server, "/feedback?limit=0")[0] == 422 and call(server, "/feedback?after=x")[1]["field"] == "after"
    assert call(server, "/feedback?limit=1")[1]["total"] == before
    assert call(server, "/ask", {"question": answers[0][0]})[0] == 200  # and the server serves on


@pytest.fixture(scope="module")
def postgres():
    pg = Postgres()
    yield pg
    pg.stop()


def test_on_another_address_feedback_needs_the_token_and_postgresql_keeps_the_labels(trained_models, postgres,
                                                                                      tmp_path, answers):
    question, answer = answers[0]
    body = feedback(question, answer, "no_answer")
    without = Server(trained_models, tmp_path, "--host", "0.0.0.0", "--feedback_db", tmp_path / "open.sqlite")
    try:  # no token given: no feedback taken nor shown, answers as ever
        assert call(without, "/feedback", body)[0] == 403 and call(without, "/feedback")[0] == 403
        assert call(without, "/ask", {"question": question})[0] == 200
    finally:
        without.stop()
    (tmp_path / "token").write_text(TOKEN + "\n")
    url = postgres.database("served")
    with_token = Server(trained_models, tmp_path, "--host", "0.0.0.0", "--feedback_db", url,
                        "--feedback_token_file", tmp_path / "token")
    try:
        for token in (None, "not-the-token", TOKEN[:-1]):
            status, refused = call(with_token, "/feedback", body, token=token)
            assert status == 401 and "token" in refused["error"]
            assert call(with_token, "/feedback", token=token)[0] == 401
            # refused before the body is read: a bad body, bad JSON or a bad page tells no one but the token's holder
            assert call(with_token, "/feedback", {**body, "verdict": "maybe"}, token=token)[0] == 401
            assert call(with_token, "/feedback", raw=b"{not json", token=token)[0] == 401
            assert call(with_token, "/feedback?limit=0", token=token)[0] == 401
        status, stored = call(with_token, "/feedback", body, token=TOKEN)
        assert status == 201 and stored["verdict"] == "no_answer"
        status, listed = call(with_token, "/feedback", token=TOKEN)
        assert status == 200 and listed["labels"] == [stored] and listed["total"] == 1  # the refused wrote nothing
    finally:
        with_token.stop()

"""The QA system served over HTTP, as users run it: serve.py started as a real process on a free local port, asked
over real HTTP (the API, bad requests, a bounded load), the page driven in a real headless Chromium, and SIGTERM."""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest

from conftest import EMOJI, ROOT, SAMPLE, assert_user_error, free_port, run_script
from serve import ServeArgs
from tolerance import assert_answered_alike, assert_ranked_alike
from utils.errors import UserError
from utils.reader.trained import Reader, ReaderSettings
from utils.files.questions import question_list
from utils.files.squad import load_questions
from utils.system.pipeline import QASystem

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CALIBRATION = (1.5, -0.5, 0.3)  # the module's server runs with --no_answer_calibration 1.5 -0.5 0.3


class Server:
    def __init__(self, models, tmp_path, *extra, passages=f"{SAMPLE}/dpr_passages.jsonl"):
        """`passages` None: the corpus is an --index among `extra`."""
        reader, retriever = models
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(tmp_path / f"serve-{self.port}.log", "w+")
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(ROOT, "serve.py"), "--retriever", retriever, "--reader", reader,
             *(["--passages", passages] if passages else []), "--port", str(self.port),
             *([] if "--feedback_db" in extra else ["--feedback_db", tmp_path / f"feedback-{self.port}.sqlite"]),
             *map(str, extra)],
            cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        deadline = time.time() + 120
        while True:
            status, body = self.get("/health")
            if status == 200:
                break
            assert self.proc.poll() is None and time.time() < deadline, self.output()
            assert status in (None, 503) and (body is None or body["status"] == "loading"), body
            time.sleep(0.2)

    def output(self):
        self.log.seek(0)
        return self.log.read()[-3000:]

    def request(self, path, data=None, raw=None):
        body = raw if raw is not None else (json.dumps(data).encode() if data is not None else None)
        req = urllib.request.Request(self.url + path, data=body, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read())
        except urllib.error.URLError:
            return None, None

    def get(self, path):
        return self.request(path)

    def ask(self, question, k=None, **extra):
        return self.request("/ask", {"question": question, **({"k": k} if k is not None else {}), **extra})

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=60)
        self.log.close()


@pytest.fixture(scope="module")
def server(trained_models, passages, tmp_path_factory):
    s = Server(trained_models, tmp_path_factory.mktemp("serve"), "--no_answer_calibration", *CALIBRATION,
               passages=passages)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def expected(trained_models, passages):
    """QASystem.ask's answers on the sample's questions, at k = 3 (what qa_system.py answers with)."""
    questions = [q["question"] for q in load_questions(f"{SAMPLE}/dev.json")][:24]
    qa = QASystem(trained_models[1], trained_models[0], passages=passages, device="cpu", calibration=CALIBRATION)
    return questions, qa.ask(questions, k=3)


def answered_alike(got, want, trained_models) -> None:
    """A served answer against QASystem.ask's: other batches (other padding, other summation orders), so alike up
    to near-ties; the served answer carries no null-minus-best, so an abstention may differ only where the
    system's own ratio sits at the recorded threshold."""
    threshold = ReaderSettings.load(trained_models[0]).null_threshold
    assert_answered_alike({**got, "null_minus_best": want["null_minus_best"]}, want, threshold)
    assert_ranked_alike([[(p["passage_id"], p["score"]) for p in got["passages"]]],
                        [[(p["passage_id"], p["score"]) for p in want["passages"]]])


def test_ask_answers_as_the_qa_system_does(server, expected, trained_models):
    questions, answers = expected
    status, body = server.ask(questions[:8], k=3)
    assert status == 200 and body["k"] == 3 and len(body["answers"]) == 8
    for got, want in zip(body["answers"], answers):
        answered_alike(got, want, trained_models)
        if got["answer"]:
            assert got["text"][got["start"]:got["end"]] == got["answer"]
        else:
            assert got["score"] is None and got["start"] is None
    status, one = server.ask(questions[0], k=3)  # one question as a string
    assert status == 200
    answered_alike(one["answers"][0], answers[0], trained_models)
    status, health = server.get("/health")
    assert status == 200 and health["ready"] and health["questions_answered"] >= 9
    assert server.get("/openapi.json")[0] == 200


def test_each_answer_gives_its_no_answer_probability_and_the_settings_that_made_it(server, expected, trained_models):
    """--no_answer_calibration shows: every answer's no_answer_probability is QASystem.ask's at the same
    calibration, and the answer says the threshold, rule, weights and calibration it was made with."""
    questions, answers = expected
    status, body = server.ask(questions[:6], k=3)
    assert status == 200
    for got, want in zip(body["answers"], answers):
        assert got["no_answer_probability"] == pytest.approx(want["no_answer_probability"], rel=1e-5, abs=1e-5)
        assert got["settings"] == {"no_answer_threshold": ReaderSettings.load(trained_models[0]).null_threshold,
                                   "unanswerable_share": None, "calibrated": True, "rule": "window",
                                   "retriever_weight": 0.0, "reader": Reader.files_fingerprint(trained_models[0])}


def test_a_request_that_gives_the_share_is_answered_at_its_moved_cut(server, expected, trained_models, passages):
    """"unanswerable_share" in a request moves that request's threshold and probability (QASystem.ask with the same
    share), says so in its settings, and leaves other requests as the server answers them."""
    import math

    questions, answers = expected
    qa = QASystem(trained_models[1], trained_models[0], passages=passages, device="cpu", calibration=CALIBRATION)
    want = qa.ask(questions[:6], k=3, unanswerable_share=0.9)
    status, body = server.ask(questions[:6], k=3, unanswerable_share=0.9)
    assert status == 200
    threshold = ReaderSettings.load(trained_models[0]).null_threshold
    by_hand = threshold - (math.log(9) - math.log(0.3 / 0.7)) / 1.5
    # the moved cut, by hand: the API abstains exactly above it, and it changes answers (the share is not ignored)
    assert all((w["answer"] == "") == (w["null_minus_best"] > by_hand) for w in want)
    assert [w["answer"] for w in want] != [a["answer"] for a in answers[:6]]
    for got, w in zip(body["answers"], want):
        assert_answered_alike({**got, "null_minus_best": w["null_minus_best"]}, w, by_hand)
        assert got["no_answer_probability"] == pytest.approx(w["no_answer_probability"], rel=1e-5, abs=1e-5)
        assert got["settings"]["unanswerable_share"] == 0.9
        assert got["settings"]["no_answer_threshold"] == pytest.approx(by_hand)
    status, body = server.ask(questions[:6], k=3)  # the next request, without: as the server answers
    assert [a["settings"]["unanswerable_share"] for a in body["answers"]] == [None] * 6
    assert all(a["no_answer_probability"] == pytest.approx(w["no_answer_probability"], rel=1e-5, abs=1e-5)
               for a, w in zip(body["answers"], answers))


@pytest.mark.parametrize("request_body, status, field", [
    (b"{not json", 422, "body"),
    (b"[1, 2]", 422, "body"),
    (json.dumps({"k": 3}).encode(), 422, "question"),
    (json.dumps({"question": ""}).encode(), 422, "question"),
    (json.dumps({"question": ["Who?", "  "]}).encode(), 422, "question[1]"),
    (json.dumps({"question": 5}).encode(), 422, "question"),
    (json.dumps({"question": "x" * 1001}).encode(), 422, "question"),
    (json.dumps({"question": "Who?", "k": 0}).encode(), 422, "k"),
    (json.dumps({"question": "Who?", "k": 21}).encode(), 422, "k"),
    (json.dumps({"question": "Who?", "k": "many"}).encode(), 422, "k"),
    (json.dumps({"question": "Who?", "unanswerable_share": 0}).encode(), 422, "unanswerable_share"),
    (json.dumps({"question": "Who?", "unanswerable_share": 1.5}).encode(), 422, "unanswerable_share"),
    (json.dumps({"question": "Who?", "unanswerable_share": "half"}).encode(), 422, "unanswerable_share"),
    (json.dumps({"question": ["Who?"] * 17}).encode(), 413, "question"),
    (b'{"question": "Who built \\ud800 it?"}', 422, "question"),
    (b'{"question": ["Who?", "\\udc00"]}', 422, "question[1]"),
    ('{"question": "Who built the caf\u00e9?"}'.encode("latin-1"), 422, "body"),
    (b"[" * 100_000 + b"]" * 100_000, 422, "body"),
    (b'{"a": ' * 100_000 + b"1" + b"}" * 100_000, 422, "body"),
    (json.dumps({"question": "Who?", "k": "5"}).encode(), 422, "k"),
    (json.dumps({"question": "Who?", "k": True}).encode(), 422, "k"),
    (json.dumps({"question": "Who?", "k": 5.0}).encode(), 422, "k"),
    (json.dumps({"question": "Who?", "unanswerable_share": "0.3"}).encode(), 422, "unanswerable_share"),
    (json.dumps({"question": "Who?", "unanswerable_share": True}).encode(), 422, "unanswerable_share"),
    (json.dumps({"question": "Who?", "top_k": 5}).encode(), 422, "top_k"),
], ids=["malformed", "not-an-object", "missing", "empty", "empty-in-list", "not-a-string", "too-long", "k-0", "k-21",
        "k-text", "share-0", "share-above-1", "share-text", "too-many", "lone-surrogate", "lone-surrogate-in-list",
        "not-utf8", "nested-100k-lists", "nested-100k-objects", "k-string", "k-true", "k-float",
        "share-string", "share-true", "unknown-field"])
def test_bad_requests_are_4xx_naming_the_field_and_the_server_keeps_serving(server, request_body, status, field):
    """Every refusal in the documented shape, the field named once ("k: must be ...", not "k: k must be ..."):
    a body that is not UTF-8 JSON or nested too deeply to parse (which must not take the server down) as much as a
    field of the wrong JSON type ("5", true or 5.0 for k: strict, never read as 5 or 1) or one /ask does not take."""
    got, body = server.request("/ask", raw=request_body)
    assert got == status and body["field"] == field and body["error"].startswith(f"{field}: "), body
    assert not body["error"].removeprefix(f"{field}: ").startswith(field), body
    assert server.ask("Who designed the Corran lighthouse?")[0] == 200


def test_every_error_of_the_app_is_in_the_documented_shape(server):
    """FastAPI's own errors too: a path the app does not serve, a method /ask does not take."""
    assert server.get("/nowhere") == (404, {"error": "Not Found", "field": None})
    assert server.get("/ask") == (405, {"error": "Method Not Allowed", "field": None})


@pytest.mark.parametrize("questions, limits", [(["Who?", "  "], {}), ("   ", {}),
                                               (["Who?", "Where?", "x" * 1001], {"max_chars": 1000})],
                         ids=["blank-in-list", "blank", "too-long"])
def test_the_server_refuses_a_question_in_the_python_apis_words(server, questions, limits):
    """One check of the questions (utils.files.questions) for the API and the server: the same problem in the
    same words, the server's limits added."""
    status, body = server.ask(questions)
    with pytest.raises(UserError) as refused:
        question_list(questions, **limits)
    assert status == 422 and body["error"].split(": ", 1)[1] == str(refused.value).split(": ", 1)[1], body


def test_a_bad_question_fails_its_own_request_only(server, expected, trained_models):
    """Requests asked together share passes: one with a question the models cannot read (a lone surrogate, valid
    JSON) is a 4xx JSON error naming it, and every other request is answered."""
    questions, answers = expected
    results = {}
    bodies = {i: json.dumps({"question": questions[i], "k": 3}).encode() for i in range(6)}
    bodies["bad"] = b'{"question": "Who designed \\ud800?", "k": 3}'
    threads = [threading.Thread(target=lambda i=i: results.update({i: server.request("/ask", raw=bodies[i])}))
               for i in bodies]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert results["bad"] == (422, {"error": "question: not text: character 13 is a lone surrogate (\\ud800)",
                                    "field": "question"})
    for i in range(6):
        status, body = results[i]
        assert status == 200, body
        answered_alike(body["answers"][0], answers[i], trained_models)


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_a_body_over_max_body_bytes_is_refused_unread_and_unparsed(server, chunked):
    """Beyond --max_body_bytes (the default here) a request is a 413 JSON error naming the body, by its
    Content-Length or, for a chunked body (which has none), as it arrives: not read whole, not parsed."""
    body = json.dumps({"question": ["Who?"] * 300_000}).encode()  # more than the default, in JSON that parses
    assert len(body) > 1 << 20
    chunks = (body[i:i + 65536] for i in range(0, len(body), 65536))
    status, answer = server.request("/ask", raw=chunks if chunked else body)
    assert status == 413 and answer["field"] == "body" and answer["error"].startswith("body: "), answer
    assert server.ask("Who designed the Corran lighthouse?")[0] == 200


def test_concurrent_clients_are_answered_correctly_in_shared_passes(server, expected, trained_models):
    """16 clients x 20 questions at once: every answer right, no error, no hang; questions share passes."""
    questions, answers = expected
    want = dict(zip(questions, answers))
    before = server.get("/health")[1]
    errors, done = [], []

    def client(c):
        for i in range(20):
            q = questions[(c * 7 + i) % len(questions)]
            status, body = server.ask(q, k=3)
            if status != 200:
                errors.append((status, body))
                continue
            got = body["answers"][0]
            try:
                answered_alike(got, want[q], trained_models)
            except AssertionError as err:
                errors.append((q, err))
            done.append(q)

    threads = [threading.Thread(target=client, args=(c,)) for c in range(16)]
    t0 = time.time()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=240)
    assert not any(t.is_alive() for t in threads), "a client hung"
    assert not errors and len(done) == 320, errors[:3]
    after = server.get("/health")[1]
    passes = after["passes"] - before["passes"]
    assert after["questions_answered"] - before["questions_answered"] == 320
    assert passes < 320 / 2, f"{passes} passes for 320 questions: requests were not batched"
    assert time.time() - t0 < 240


def test_the_page_shows_the_answer_highlighted_in_its_passage(server, expected, tmp_path):
    playwright = pytest.importorskip("playwright.sync_api")
    assert os.path.exists(CHROMIUM), "Chromium is not installed (.ci/run installs Debian's chromium)"
    questions, answers = expected
    answered = next(i for i, a in enumerate(answers) if a["answer"])
    abstained = next((i for i, a in enumerate(answers) if not a["answer"]), None)
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=[
            "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync"])
        page = browser.new_page()
        page.goto(server.url + "/")
        page.fill("#question", questions[answered])
        page.fill("#k", "3")
        page.click("button[type=submit]")
        page.wait_for_selector("#answer-text", timeout=60000)
        meta = page.inner_text(".meta")  # the probability of no answer, calibrated
        shown = re.search(r"no answer: (\d+)%", meta)
        assert shown and "uncalibrated" not in meta and \
            abs(int(shown[1]) - 100 * answers[answered]["no_answer_probability"]) <= 0.5 + 1e-6
        assert page.inner_text("#answer-mark") == answers[answered]["answer"]  # at its offsets, past the emoji
        passage = page.inner_text("#answer-passage")
        assert passage.startswith(EMOJI) and answers[answered]["answer"] in passage[len(EMOJI):]
        assert len(page.query_selector_all("#passages li")) == 3
        page.screenshot(path=str(tmp_path / "answer.png"), full_page=True)
        assert (tmp_path / "answer.png").stat().st_size > 1000
        if abstained is not None:
            page.fill("#question", questions[abstained])
            page.click("button[type=submit]")
            page.wait_for_function("document.querySelector('#answer-text')?.textContent === 'No answer'")
            assert page.query_selector("#answer-mark") is None
        page.fill("#question", questions[answered])  # the share expected, as the API takes it
        page.fill("#share", "0.9")
        page.click("button[type=submit]")
        page.wait_for_function("document.querySelector('.meta')?.textContent.includes('unanswerable share of 0.9')")
        _, body = server.ask([questions[answered]], k=3, unanswerable_share=0.9)
        shown = re.search(r"no answer: (\d+)%", page.inner_text(".meta"))
        assert abs(int(shown[1]) - 100 * body["answers"][0]["no_answer_probability"]) <= 0.5 + 1e-6
        page.fill("#share", "1.5")  # outside (0, 1): the server's refusal in words
        page.click("button[type=submit]")
        page.wait_for_function("document.querySelector('#error').textContent.length > 0")
        assert "unanswerable_share" in page.inner_text("#error")
        page.fill("#share", "")
        page.fill("#k", "50")  # beyond --max_k: the error in words
        page.click("button[type=submit]")
        page.wait_for_function("document.querySelector('#error').textContent.length > 0")
        assert "k: must be between 1 and 20" in page.inner_text("#error")
        browser.close()


def test_sigterm_drains_the_requests_in_flight_and_exits_0(trained_models, tmp_path):
    s = Server(trained_models, tmp_path)
    result = {}
    many = [f"Who built the loom number {i}?" for i in range(16)]
    asking = threading.Thread(target=lambda: result.update(answer=s.ask(many, k=20)))
    asking.start()
    time.sleep(0.3)  # the request is in flight
    s.proc.send_signal(signal.SIGTERM)
    assert s.proc.wait(timeout=120) == 0, s.output()
    asking.join(timeout=60)
    status, body = result["answer"]
    assert status == 200 and len(body["answers"]) == 16
    assert {a["no_answer_probability"] for a in body["answers"]} == {None}  # a window reader, not calibrated
    assert not body["answers"][0]["settings"]["calibrated"]
    assert s.get("/health") == (None, None)  # no longer listening
    assert "stopped after answering 16 questions" in s.output()
    s.log.close()


def test_an_updated_index_is_picked_up_with_no_failed_request_each_answered_from_one_version(trained_models,
                                                                                            tmp_path):
    """index_corpus.py run again while clients ask: every request succeeds, and each is answered from one version
    of the index (every passage it read from the old version or every one from the new: the update retitles them
    all); the server then serves the new version, whose passages say where in their document they came from."""
    corpus, index = tmp_path / "corpus.jsonl", tmp_path / "index"
    rows = [json.loads(line) for line in open(f"{SAMPLE}/dpr_passages.jsonl")]
    rows = [{**r, "document": f"notes/doc{i // 4}.txt", "passage": i % 4} for i, r in enumerate(rows)]
    corpus.write_text("".join(json.dumps(r) + "\n" for r in rows))
    build = ["--retriever", trained_models[1], "--passages", corpus, "--output_dir", index]
    run_script("index_corpus.py", *build)
    s = Server(trained_models, tmp_path, "--index", index, "--reload_check_seconds", 0.2, passages=None)
    try:
        assert s.get("/health")[1]["index_version"] == 1
        seen, stop = [], threading.Event()

        def client():
            while not stop.is_set():
                status, body = s.ask(["Who designed the Corran lighthouse?", "When was the loom built?"], k=8)
                seen.append((status, body))

        clients = [threading.Thread(target=client) for _ in range(3)]
        for c in clients:
            c.start()
        corpus.write_text("".join(json.dumps({**r, "title": r["title"] + " (revised)"}) + "\n" for r in rows))
        run_script("index_corpus.py", *build)
        deadline = time.time() + 60
        while s.get("/health")[1]["index_version"] != 2:
            assert time.time() < deadline, s.output()
            time.sleep(0.1)
        time.sleep(1.0)  # requests answered from the new version too
        stop.set()
        for c in clients:
            c.join(timeout=60)
        assert "reloaded the index" in s.output()
    finally:
        s.stop()
    assert seen and all(status == 200 for status, _ in seen), [b for status, b in seen if status != 200][:1]
    versions = []
    for _, body in seen:
        revised = {p["title"].endswith("(revised)") for a in body["answers"] for p in a["passages"]}
        assert len(revised) == 1, "a request answered from a mix of two versions"
        versions.append(revised.pop())
    assert versions[0] is False and versions[-1] is True and versions == sorted(versions)
    passage = seen[-1][1]["answers"][0]["passages"][0]
    position = rows[[r["passage_id"] for r in rows].index(passage["passage_id"])]
    assert passage["source"] == {"document": position["document"], "passage": position["passage"]}


def test_a_bad_start_is_a_one_line_error_and_the_default_address_is_loopback(trained_models, tmp_path):
    reader, retriever = trained_models
    proc = run_script("serve.py", "--retriever", retriever, "--reader", str(tmp_path / "nowhere"), "--passages",
                      f"{SAMPLE}/dpr_passages.jsonl", check=False)
    assert_user_error(proc, "nowhere: no such directory")
    proc = run_script("serve.py", "--retriever", retriever, "--reader", reader, "--passages",
                      f"{SAMPLE}/dpr_passages.jsonl", "--max_body_bytes", 0, check=False)
    assert_user_error(proc, "--max_body_bytes must be at least 1")
    proc = run_script("serve.py", "--retriever", retriever, "--reader", reader, "--passages",
                      f"{SAMPLE}/dpr_passages.jsonl", "--no_answer_calibration", 1.5, -0.5, "--unanswerable_share",
                      0.5, check=False)  # the share moves a cut from the share it was calibrated at: which one?
    assert_user_error(proc, "give the calibration with the share of unanswerable questions it was fitted on")
    assert ServeArgs.__dataclass_fields__["host"].default == "127.0.0.1"


def test_a_port_in_use_is_a_one_line_error_before_anything_loads(trained_models, passages):
    """serve.py takes its port before it loads a model: on a port in use it says so in one line and exits 2."""
    reader, retriever = trained_models
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = run_script("serve.py", "--retriever", retriever, "--reader", reader, "--passages", passages, "--port",
                          port, check=False, timeout=120)
    assert_user_error(proc, f"could not listen on 127.0.0.1:{port}")
    assert proc.stderr.strip().splitlines() == [f"error: could not listen on 127.0.0.1:{port}: address in use"], \
        proc.stderr  # the only line: nothing was loaded (that logs "loading ...") before the port was tried

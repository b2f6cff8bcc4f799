"""The page's feedback buttons, as users press them: serve.py started as a real process over a corpus whose every
passage opens with a character beyond the BMP, its page driven in a real headless Chromium (Right, Wrong, the answer
is my selection, no passage shown answers it), and the labels read back over real HTTP (GET /feedback): a selection
becomes offsets in code points, as Python counts them, wherever the highlight splits its passage; a selection over
two passages is refused on the page; a server on another address than loopback asks for its token, once."""

import json
import os
import re
import urllib.request

import pytest

from conftest import EMOJI, SAMPLE
from test_serve import CALIBRATION, CHROMIUM, Server
from utils.files.squad import load_questions

TOKEN = "page-token-of-the-feedback-tests"
TOKEN_KEY = "qa-amp feedback token"  # the page's sessionStorage key


@pytest.fixture(scope="module")
def server(trained_models, passages, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("feedback-page")
    s = Server(trained_models, tmp, "--no_answer_calibration", *CALIBRATION, "--feedback_db", tmp / "labels.sqlite",
               passages=passages)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def browser():
    playwright = pytest.importorskip("playwright.sync_api")
    assert os.path.exists(CHROMIUM), "Chromium is not installed (.ci/run installs Debian's chromium)"
    with playwright.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=[
            "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync"])
        yield chromium
        chromium.close()


@pytest.fixture(scope="module")
def answered(server):
    """(question, answer at k = 3) of the sample's first question whose answer has words of its passage before it
    (after the emoji) and is two characters or more: a selection can then start before the highlight and end in it."""
    questions = [q["question"] for q in load_questions(f"{SAMPLE}/dev.json")][:16]
    status, body = server.ask(questions, k=3)
    assert status == 200
    for question, a in zip(questions, body["answers"]):
        if a["answer"] and a["start"] > 3 and a["end"] - a["start"] >= 2 and not a["text"][a["end"] - 2].isspace() \
                and len({p["passage_id"] for p in a["passages"]}) == 3:
            return question, a
    pytest.fail(f"no answer fits: {[a['answer'] for a in body['answers']]}")


def labels(server, after=0, token=None) -> dict:
    """GET /feedback: the labels written after label `after`."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(f"{server.url}/feedback?after={after}&limit=1000", headers=headers)
    with urllib.request.urlopen(request, timeout=60) as r:
        return json.loads(r.read())


def last_id(server, token=None) -> int:
    listed = labels(server, token=token)["labels"]
    return listed[-1]["id"] if listed else 0


def ask(page, server, question, share=""):
    page.goto(server.url + "/")
    page.fill("#question", question)
    page.fill("#k", "3")
    page.fill("#share", share)
    page.click("button[type=submit]")
    page.wait_for_selector(".answer .feedback", timeout=60000)


def press(page, button) -> str:
    """Clicks one of the answer's feedback buttons: what the page then says of the label."""
    page.click(f".answer .feedback button.{button}")
    page.wait_for_function("!['saving…', ''].includes(document.querySelector('.said').textContent)", timeout=30000)
    return page.inner_text(".said")


def saved(page, button) -> int:
    said = press(page, button)
    found = re.fullmatch(r"Saved label #(\d+)", said)
    assert found, said
    return int(found[1])


def utf16(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


# Selects, as a user's drag does, from (node, offset) to (node, offset), offsets in UTF-16 units as the DOM counts
# them; `nodes` picks the text nodes by a CSS selector and child index. Returns the selection's text.
SELECT = """([nodes, [from, fromOffset], [to, toOffset]]) => {
  const node = ([selector, child]) => document.querySelector(selector).childNodes[child];
  const range = document.createRange();
  range.setStart(node(nodes[from]), fromOffset);
  range.setEnd(node(nodes[to]), toOffset);
  const selection = window.getSelection();
  selection.removeAllRanges();
  selection.addRange(range);
  return selection.toString();
}"""


def test_each_button_stores_its_label_and_a_selection_in_code_points(server, browser, answered):
    question, a = answered
    text, start, end = a["text"], a["start"], a["end"]
    ids = [p["passage_id"] for p in a["passages"]]
    before = last_id(server)
    page = browser.new_page()
    ask(page, server, question)
    assert page.inner_text("#answer-mark") == a["answer"]
    written = [saved(page, "right")]

    # a selection from the word before the answer (after the emoji) into the highlight: it spans the passage's
    # first text node and the <mark>'s, its offsets in UTF-16 units there
    first = start - 1
    while text[first].isspace() or not text[first - 1].isspace():
        first -= 1
    assert first >= 2, text  # after the emoji and its space
    last = end - 1
    head, mark = ("#answer-passage", 0), ("#answer-mark", 0)
    selected = page.evaluate(SELECT, [[head, mark], [0, utf16(text[:first])], [1, utf16(text[start:last])]])
    assert selected == text[first:last]
    written.append(saved(page, "selection"))

    # a selection in another passage shown, from between the two halves of its emoji (a Range can, a user's drag
    # cannot) to the end of its first word: the emoji is taken whole
    other = next(i for i, p in enumerate(a["passages"]) if p["passage_id"] != a["passage_id"])
    other_text = a["passages"][other]["text"]
    word_end = other_text.index(" ", 2)
    body = (f"#passages li:nth-child({other + 1}) .passage", 0)
    page.evaluate(SELECT, [[body], [0, 1], [0, utf16(other_text[:word_end])]])
    written.append(saved(page, "selection"))

    # the server's refusal, in its words: the label sent with a version of the index that is not serving
    page.route("**/feedback", lambda route: route.continue_(
        post_data=json.dumps({**json.loads(route.request.post_data), "index_version": 99})))
    said = press(page, "wrong")
    assert said.startswith("Not saved: index_version: 99: the answer came from another version"), said
    page.unroute("**/feedback")
    written += [saved(page, "wrong"), saved(page, "no-answer")]
    page.close()

    got = labels(server, after=before)["labels"]
    assert [g["id"] for g in got] == written, "one label per saved click, none for the refused one"
    right, mine, emoji_first, wrong, none = got
    assert [g["verdict"] for g in got] == ["right", "span", "span", "wrong", "no_answer"]
    for g in got:
        assert g["question"] == question and g["given"] == a["answer"] and g["given_passage_id"] == a["passage_id"]
        assert [p["passage_id"] for p in g["shown"]] == ids and g["index_version"] == a["index_version"]
    assert (right["passage_id"], right["answer_start"], right["answer_end"]) == (a["passage_id"], start, end)
    assert right["text"][right["answer_start"]:right["answer_end"]] == right["answer"] == a["answer"]
    # the span in code points: the emoji counts one (in UTF-16 units every offset would be one more)
    assert mine["text"] == text and mine["text"].startswith(EMOJI) and mine["passage_id"] == a["passage_id"]
    assert (mine["answer_start"], mine["answer_end"]) == (first, last)
    assert mine["text"][mine["answer_start"]:mine["answer_end"]] == mine["answer"] == selected
    assert emoji_first["passage_id"] == ids[other] and emoji_first["text"] == other_text
    assert (emoji_first["answer_start"], emoji_first["answer_end"]) == (0, word_end)
    assert emoji_first["answer"] == other_text[:word_end] and emoji_first["answer"].startswith(EMOJI + " ")
    assert wrong["answer"] is None and wrong["answer_start"] is None and wrong["passage_id"] is None
    assert none["answer"] is None and none["answer_start"] is None


def test_a_selection_not_inside_one_passage_is_refused_on_the_page(server, browser, answered):
    question, a = answered
    before = labels(server)["total"]
    page = browser.new_page()
    ask(page, server, question)
    first, second = (f"#passages li:nth-child({i}) .passage" for i in (1, 2))
    selected = page.evaluate(SELECT, [[(first, 0), (second, 0)], [0, 4], [1, 6]])
    assert selected.startswith(a["passages"][0]["text"][3:]) and EMOJI in selected  # the next passage's start
    assert press(page, "selection") == "Not saved: the selection must lie inside a single passage of this answer."
    page.evaluate(SELECT, [[("h1", 0)], [0, 0], [0, 3]])  # the page's title: no passage at all
    assert press(page, "selection") == "Not saved: the selection must lie inside a single passage of this answer."
    page.evaluate("window.getSelection().removeAllRanges()")
    assert press(page, "selection").startswith("Not saved: select the answer in one of the passages shown")
    page.close()
    assert labels(server)["total"] == before


def test_right_on_an_abstention_says_it_was_right_to_abstain(server, browser, answered):
    question, _ = answered
    before = last_id(server)
    page = browser.new_page()
    ask(page, server, question, share="0.999")  # nearly every question unanswerable: it abstains
    assert page.inner_text("#answer-text") == "No answer"
    written = saved(page, "right")
    page.close()
    [label] = labels(server, after=before)["labels"]
    assert label["id"] == written and label["verdict"] == "right" and label["given"] == ""
    assert label["given_passage_id"] is None and label["answer"] is None and label["answer_start"] is None


def test_on_another_address_the_page_asks_for_the_token_once(trained_models, passages, browser, answered,
                                                             tmp_path):
    question, _ = answered
    (tmp_path / "token").write_text(TOKEN + "\n")
    s = Server(trained_models, tmp_path, "--host", "0.0.0.0", "--feedback_db", tmp_path / "labels.sqlite",
               "--feedback_token_file", tmp_path / "token", passages=passages)
    try:
        page = browser.new_page()
        ask(page, s, question)
        assert page.is_hidden("#token-form")
        page.click(".answer .feedback button.right")
        page.wait_for_selector("#token-form", state="visible")
        assert page.get_attribute("#token", "type") == "password"
        assert "feedback token" in page.inner_text("#token-why") and "token" in page.inner_text(".said")
        page.fill("#token", "not-the-token")
        page.click("#token-form button[type=submit]")
        page.wait_for_function("document.querySelector('#token-why').textContent.startsWith('The token was refused')")
        assert page.is_visible("#token-form") and "token" in page.inner_text(".said")
        page.fill("#token", TOKEN)
        page.click("#token-form button[type=submit]")
        page.wait_for_function("document.querySelector('.said').textContent.startsWith('Saved label #')")
        assert page.is_hidden("#token-form") and page.evaluate(f"sessionStorage.getItem({TOKEN_KEY!r})") == TOKEN
        right = int(page.inner_text(".said").removeprefix("Saved label #"))
        wrong = saved(page, "wrong")  # the token kept: not asked again
        assert page.is_hidden("#token-form")
        page.close()
        listed = labels(s, token=TOKEN)
        assert [(g["id"], g["verdict"]) for g in listed["labels"]] == [(right, "right"), (wrong, "wrong")]
        assert listed["total"] == 2  # the requests refused wrote nothing
    finally:
        s.stop()

"""Where the answer is: a server over an index built from a folder of documents gives each answer's and each passage's
document, page and a link; the link serves the document read-only (a PDF as itself, at its page; any other as its
text with the passage highlighted), only a document the index lists and only from inside the folder: `..`, encoded
and absolute paths, a symlink leading outside, another document's passage are not found; an index built from JSON
lines serves nothing. The page's link is followed in a real browser."""

import os
import urllib.error
import urllib.request

import pytest
from fpdf import FPDF

from conftest import run_script
from test_serve import CHROMIUM, Server
from utils.index.index import Index

LIGHTHOUSE = ("The Corran lighthouse was designed by Alan Stevenson and lit in 1860. Its keeper kept a log of every "
              "storm that passed the narrows.")
PDF_PAGES = ["The harbour report covers the year's ships and their cargo.",
             "The second page says the ferry was run by Marta Quell until the bridge opened."]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """(documents folder, the index built from it by index_corpus.py --documents, a secret outside the folder)."""
    root = tmp_path_factory.mktemp("links")
    docs, outside = root / "docs", root / "outside"
    (docs / "guide").mkdir(parents=True)
    outside.mkdir()
    (docs / "lighthouse.txt").write_text(LIGHTHOUSE + "\n")
    (docs / "guide" / "mill.md").write_text("# The mill\n\nThe tide mill was built in 1790 beside the harbour.\n")
    pdf = FPDF()
    pdf.set_font("helvetica", size=12)
    for text in PDF_PAGES:
        pdf.add_page()
        pdf.multi_cell(0, 10, text)
    pdf.output(str(docs / "report.pdf"))
    (outside / "secret.txt").write_text("The vault code of the harbour office is written here.\n")
    os.symlink(outside, docs / "linked")  # followed when read (it leads outside every folder read), never served
    index = root / "index"
    run_script("index_corpus.py", "--retriever", "bm25", "--documents", docs, "--output_dir", index, "--max_words", 20,
               "--overlap_words", 5)  # short passages: the PDF's second page starts one of its own
    return docs, index, outside


def get(url):
    try:
        with urllib.request.urlopen(url, timeout=60) as response:
            return response.status, response.headers.get("content-type"), response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.headers.get("content-type"), err.read()


def position(index, passage_id):
    return next(j for j, p in enumerate(Index.load(str(index)).passages) if p["passage_id"] == passage_id)


def test_answers_link_to_their_documents_which_are_served_from_the_folder_only(trained_models, folder, tmp_path):
    docs, index, _ = folder
    server = Server((trained_models[0], "bm25"), tmp_path, "--index", index, passages=None)
    try:
        status, body = server.ask("Who designed the Corran lighthouse?", k=5)
        assert status == 200
        read = next(p for p in body["answers"][0]["passages"] if p["text"].startswith("The Corran lighthouse"))
        text = read["source"]
        assert text["document"] == "lighthouse.txt"
        assert text["link"] == f"/documents/lighthouse.txt?passage={position(index, read['passage_id'])}"
        status, kind, page = get(server.url + text["link"])
        assert status == 200 and kind.startswith("text/html")
        assert '<mark id="passage">The Corran lighthouse was designed by Alan Stevenson' in page.decode()
        status, kind, original = get(server.url + text["link"] + "&original=1")
        assert status == 200 and kind.startswith("text/plain") and original == (docs / "lighthouse.txt").read_bytes()

        _, body = server.ask("Who ran the ferry until the bridge opened?", k=5)
        report = next(p["source"] for p in body["answers"][0]["passages"] if p["source"]["document"] == "report.pdf"
                      and p["source"].get("page") == 2)
        assert report["link"].endswith("#page=2")
        status, kind, pdf = get(server.url + report["link"].split("#")[0])
        assert status == 200 and kind == "application/pdf" and pdf == (docs / "report.pdf").read_bytes()

        secret = position(index, "linked/secret.txt#0")  # in the index (read through the link), never served
        for path in ("/documents/../../etc/passwd?passage=0", "/documents/%2e%2e/%2e%2e/etc/passwd?passage=0",
                     "/documents/..%2F..%2Fetc%2Fpasswd?passage=0", "/documents//etc/passwd?passage=0",
                     f"/documents/{docs}/lighthouse.txt?passage=0", f"/documents/linked/secret.txt?passage={secret}",
                     f"/documents/lighthouse.txt?passage={secret}", "/documents/lighthouse.txt",
                     "/documents/lighthouse.txt?passage=100000", "/documents/index.json?passage=0"):
            status, _, served = get(server.url + path)
            assert status == 404 and b"vault" not in served and b"root:" not in served, path
    finally:
        server.stop()


def test_an_index_of_json_lines_serves_no_document(trained_models, folder, tmp_path):
    docs, _, _ = folder
    corpus, index = tmp_path / "corpus.jsonl", tmp_path / "index"
    run_script("ingest_documents.py", "--documents", docs, "--output", corpus)
    run_script("index_corpus.py", "--retriever", "bm25", "--passages", corpus, "--output_dir", index)
    server = Server((trained_models[0], "bm25"), tmp_path, "--index", index, passages=None)
    try:
        _, body = server.ask("Who designed the Corran lighthouse?", k=3)
        assert all("link" not in p["source"] for p in body["answers"][0]["passages"])
        assert get(server.url + "/documents/lighthouse.txt?passage=0")[0] == 404
    finally:
        server.stop()


def test_the_pages_link_opens_the_document_at_the_answer(trained_models, folder, tmp_path):
    playwright = pytest.importorskip("playwright.sync_api")
    assert os.path.exists(CHROMIUM), "Chromium is not installed (.ci/run installs Debian's chromium)"
    _, index, _ = folder
    server = Server((trained_models[0], "bm25"), tmp_path, "--index", index, "--no_answer_threshold", 1000,
                    passages=None)  # it always answers: the answer's link is what is followed
    try:
        with playwright.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=[
                "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync"])
            page = browser.new_page()
            page.goto(server.url + "/")
            page.fill("#question", "Who designed the Corran lighthouse?")
            page.fill("#k", "1")
            page.click("button[type=submit]")
            page.wait_for_selector("#answer-link", timeout=60000)
            assert page.inner_text("#answer-link") == "lighthouse.txt"
            with page.context.expect_page() as opened:
                page.click("#answer-link")
            document = opened.value
            document.wait_for_selector("mark#passage")
            assert document.inner_text("mark#passage").startswith("The Corran lighthouse was designed")
            assert document.inner_text("h1") and "lighthouse.txt" in document.inner_text("body")
            browser.close()
    finally:
        server.stop()

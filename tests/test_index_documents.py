"""One command keeps a folder indexed: index_corpus.py --documents reads the folder into the index's own corpus and
builds or updates the index from it, refusing what it would mix up or destroy; --watch stays running and updates the
index whenever a document is added, changed or removed, by content (a touched file is no update, a file rewritten
with its old time is one), and SIGTERM stops it between updates with the index complete."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import ROOT, assert_user_error, run_script
from test_index_corpus import retriever  # noqa: F401
from utils.index.format import DOCUMENTS_CORPUS
from utils.index.index import Index

DOCS = {"lighthouse.md": "# The lighthouse\n\nThe Corran lighthouse was designed by Alan Stevenson. It was lit in "
                         "1860.\n\nIts keeper kept a log of every storm.",
        "mill/tide.txt": "The tide mill turns with the tide. It was built in 1790 beside the harbour.",
        "mill/wind.html": "<html><head><title>The windmill</title></head><body><p>The windmill ground corn for the "
                          "village until 1921.</p></body></html>"}


def write_docs(folder, docs=DOCS):
    for name, text in docs.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def manifest(out):
    return json.loads((out / "index.json").read_text())


def test_documents_are_read_into_the_index_and_updated_by_the_same_command(retriever, tmp_path):  # noqa: F811
    docs, out, dense = tmp_path / "docs", tmp_path / "index", tmp_path / "dense"
    write_docs(docs)
    args = ["--retriever", "bm25", "--documents", docs, "--output_dir", out]
    proc = run_script("index_corpus.py", *args)
    assert "3 documents read" in proc.stdout and (out / DOCUMENTS_CORPUS).is_file()
    index = Index.load(str(out))
    assert {p["document"] for p in index.passages} == set(DOCS) and manifest(out)["documents"] == [str(docs)]
    assert "up to date" in run_script("index_corpus.py", *args).stdout
    (docs / "mill" / "tide.txt").write_text("The tide mill turns with the tide. It was rebuilt in 1901.")
    proc = run_script("index_corpus.py", *args)
    assert "update to version 2" in proc.stdout and "1 passages embedded" in proc.stdout
    assert any("rebuilt in 1901" in p["text"] for p in Index.load(str(out)).passages)
    (out / "notes.txt").write_text("mine")
    run_script("index_corpus.py", *args, "--overwrite_output_dir")
    assert (out / "notes.txt").read_text() == "mine" and manifest(out)["version"] == 1
    run_script("index_corpus.py", "--retriever", retriever, "--documents", docs, "--output_dir", dense)
    assert not Index.load(str(dense)).bm25_only and len(Index.load(str(dense)).passages) == len(index.passages)


@pytest.mark.parametrize("extra, message", [
    (["--passages", "PASSAGES"], "give the corpus as --passages (JSON lines) or as --documents"),
    (["--output_dir", "DOCS/index"], "is one of the --documents, inside one or holds one"),
    (["--output_dir", "TMP"], "is one of the --documents, inside one or holds one"),
    (["--watch", "-1"], "--watch must be 0 (once) or more seconds"),
], ids=["both-corpora", "index-inside-the-folder", "index-holding-the-folder", "negative-watch"])
def test_what_would_mix_up_or_destroy_documents_is_refused(tmp_path, extra, message):
    docs = tmp_path / "docs"
    write_docs(docs)
    (tmp_path / "passages.jsonl").write_text('{"passage_id": "a", "title": "", "text": "a"}\n')
    extra = [str(e).replace("PASSAGES", str(tmp_path / "passages.jsonl")).replace("DOCS", str(docs))
             .replace("TMP", str(tmp_path)) for e in extra]
    args = ["--retriever", "bm25", "--documents", docs, "--output_dir", tmp_path / "index", *extra]
    assert_user_error(run_script("index_corpus.py", *args, check=False), message)
    assert_user_error(run_script("index_corpus.py", "--retriever", "bm25", "--passages", tmp_path / "passages.jsonl",
                                 "--output_dir", tmp_path / "x", "--watch", 1, check=False),
                      "--watch keeps an index of --documents up to date")
    users = tmp_path / "users"
    users.mkdir()
    (users / "report.txt").write_text("mine")
    assert_user_error(run_script("index_corpus.py", "--retriever", "bm25", "--documents", docs, "--output_dir", users,
                                 check=False), "not empty and not an index of this project")
    assert sorted(os.listdir(users)) == ["report.txt"]


def wait_for(what, timeout=60):
    deadline = time.time() + timeout
    while not what():
        assert time.time() < deadline, "timed out"
        time.sleep(0.05)


def test_watch_updates_on_a_changed_content_not_a_touch_and_stops_between_updates(tmp_path):
    docs, out = tmp_path / "docs", tmp_path / "index"
    write_docs(docs)
    proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "index_corpus.py"), "--retriever", "bm25",
                             "--documents", str(docs), "--output_dir", str(out), "--watch", "0.2"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: (out / "index.json").exists() and manifest(out)["complete"])
        wind = docs / "mill" / "wind.html"
        os.utime(wind)  # touched: its content is the same
        time.sleep(1.0)
        assert manifest(out)["version"] == 1
        stat = wind.stat()
        wind.write_text(DOCS["mill/wind.html"].replace("1921", "1931"))  # the same size, then its old time again
        os.utime(wind, ns=(stat.st_atime_ns, stat.st_mtime_ns))
        wait_for(lambda: manifest(out)["version"] == 2)
        assert any("until 1931" in p["text"] for p in Index.load(str(out)).passages)
        (docs / "mill" / "tide.txt").unlink()
        wait_for(lambda: manifest(out)["version"] == 3)
        assert {p["document"] for p in Index.load(str(out)).passages} == {"lighthouse.md", "mill/wind.html"}
    finally:
        proc.send_signal(signal.SIGTERM)
        output = proc.communicate(timeout=60)[0]
    assert proc.returncode == 0, output
    assert manifest(out)["complete"] and not (out / "update.json").exists() and "Traceback" not in output

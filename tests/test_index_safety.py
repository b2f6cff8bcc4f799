"""index_corpus.py loses nothing and says what happened: it never replaces a trained model, deletes only what an index
wrote, keeps the BM25 an index has, refuses a second writer while one runs, cleans up an update it abandons, and
says "up to date" without a made-up speed."""

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np

from conftest import ROOT, SAMPLE, assert_user_error, run_script
from test_index_corpus import edited_corpus, index_args, killed_after_chunks, retriever, vectors_of  # noqa: F401
from test_retriever_api import a_users_project
from utils.index.index import Index


def listing(directory):
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*"))


def test_an_index_never_replaces_a_trained_model_whatever_the_flag(retriever, tmp_path):
    """--output_dir equal to --retriever with --overwrite_output_dir deleted the trained retriever."""
    retriever_dir = tmp_path / "retriever"
    shutil.copytree(retriever, retriever_dir)
    before = listing(retriever_dir)
    for out, message in ((retriever_dir, "is the retriever's directory or inside it"),
                         (retriever_dir / "index", "is the retriever's directory or inside it")):
        for extra in ((), ("--overwrite_output_dir",)):
            proc = run_script("index_corpus.py", *index_args(retriever_dir, out, *extra), check=False)
            assert_user_error(proc, message)
    another_model = tmp_path / "another-model"  # any trained model, not the one indexing
    shutil.copytree(retriever, another_model)
    proc = run_script("index_corpus.py", *index_args(retriever, another_model, "--overwrite_output_dir"), check=False)
    assert_user_error(proc, "holds a trained model, which an index never replaces")
    assert listing(retriever_dir) == before and listing(another_model) == before


def test_overwrite_deletes_only_what_the_index_wrote(retriever, tmp_path):
    """--overwrite_output_dir emptied the whole index directory, a user's notes put inside it included."""
    out = tmp_path / "index"
    run_script("index_corpus.py", *index_args(retriever, out))
    (out / "notes.txt").write_text("mine")
    (out / "mine").mkdir()
    (out / "mine" / "plot.png").write_text("mine too")
    run_script("index_corpus.py", *index_args(retriever, out, "--overwrite_output_dir", "--chunk_passages", 8))
    assert {"mine", "mine/plot.png", "notes.txt"} <= set(listing(out)) and (out / "notes.txt").read_text() == "mine"
    assert len(json.load(open(out / "shard-00000" / "progress.json"))["chunks"]) == 5  # built anew: 33 passages by 8
    assert Index.load(str(out)).count == 33


def test_someone_elses_index_json_is_not_an_index_and_up_to_date_says_no_speed(retriever, tmp_path):
    """A directory holding a web app's index.json was "malformed (no format)"; an index up to date printed "in 0.0 s
    (124000000000.0 passages/s)"."""
    project = tmp_path / "project"
    contents = a_users_project(project)
    proc = run_script("index_corpus.py", *index_args(retriever, project), check=False)
    assert_user_error(proc, f"{project}: not empty and not an index of this project")
    assert listing(project) == contents
    out = tmp_path / "index"
    run_script("index_corpus.py", *index_args(retriever, out))
    proc = run_script("index_corpus.py", *index_args(retriever, out))
    assert "up to date" in proc.stdout and "passages/s" not in proc.stdout


def test_an_update_keeps_the_bm25_the_index_has_unless_told_and_says_so(retriever, tmp_path):
    """An index built with --bm25 true by a retriever without a tuned weight, updated without the flag, lost its
    BM25 silently (and a hybrid server then refused every reload)."""
    corpus, out = tmp_path / "corpus.jsonl", tmp_path / "index"
    lines = open(f"{SAMPLE}/dpr_passages.jsonl").read().splitlines()
    corpus.write_text("\n".join(lines) + "\n")
    run_script("index_corpus.py", *index_args(retriever, out, "--bm25", "true", corpus=corpus))
    rows = edited_corpus(corpus, lines)
    proc = run_script("index_corpus.py", *index_args(retriever, out, corpus=corpus))
    assert "BM25 (kept as the index has it)" in proc.stdout
    meta = json.load(open(out / "index.json"))
    assert meta["version"] == 2 and meta["bm25"] and Index.load(str(out)).bm25 is not None
    corpus.write_text("".join(json.dumps(r) + "\n" for r in rows[:20]))
    proc = run_script("index_corpus.py", *index_args(retriever, out, "--bm25", "false", corpus=corpus))
    assert "BM25 dropped (--bm25 false)" in proc.stdout
    assert not json.load(open(out / "index.json"))["bm25"] and sorted(os.listdir(out)) == ["index.json", "v3"]


def test_a_second_run_on_an_index_being_written_is_refused_and_the_first_finishes(retriever, tmp_path):
    """Two index_corpus.py runs on one directory at once (two cron jobs) appended to the same shard files."""
    out, whole = tmp_path / "index", tmp_path / "whole"
    args = index_args(retriever, out, "--chunk_passages", 1)
    first = subprocess.Popen([sys.executable, os.path.join(ROOT, "index_corpus.py"), *map(str, args)], cwd=ROOT,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not (out / "shard-00000" / "progress.json").exists() and time.time() < deadline:
        time.sleep(0.01)
    first.send_signal(signal.SIGSTOP)  # held mid-build, however fast it is, while the second run starts
    assert first.poll() is None, "the first run ended before the second could start"
    try:
        second = run_script("index_corpus.py", *args, check=False)
    finally:
        first.send_signal(signal.SIGCONT)
    assert_user_error(second, f"{out}: another run is writing this index now")
    assert first.wait(timeout=300) == 0, first.stderr.read()
    run_script("index_corpus.py", *index_args(retriever, whole, "--chunk_passages", 1))
    (a, owner_a, _), (b, owner_b, _) = vectors_of(whole), vectors_of(out)
    assert np.array_equal(a, b) and np.array_equal(owner_a, owner_b)
    handle = os.open(out, os.O_RDONLY)  # released when the run ended: nothing stale is left holding it
    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.close(handle)


def test_an_update_killed_then_its_corpus_put_back_leaves_nothing_behind(retriever, tmp_path):
    """Killed, then the corpus reverted: "up to date", with the unfinished v2/ and update.json left for ever."""
    corpus, out = tmp_path / "corpus.jsonl", tmp_path / "index"
    original = open(f"{SAMPLE}/dpr_passages.jsonl").read()
    corpus.write_text(original)
    run_script("index_corpus.py", *index_args(retriever, out, "--chunk_passages", 1, corpus=corpus))
    before = listing(out)
    edited_corpus(corpus, original.splitlines())
    killed_after_chunks(index_args(retriever, out, "--chunk_passages", 1, corpus=corpus), out / "v2" / "shard-00000",
                        3)
    assert (out / "update.json").exists() and (out / "v2").exists()
    corpus.write_text(original)
    proc = run_script("index_corpus.py", *index_args(retriever, out, "--chunk_passages", 1, corpus=corpus))
    assert "unfinished update to version 2 of a corpus changed since was discarded" in proc.stdout
    assert "up to date" in proc.stdout and listing(out) == before

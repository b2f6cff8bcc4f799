"""A version of the index that is not whole, as serve.py's reload meets it: Index.load refuses it in one line naming
the file (passages cut short, files missing, BM25 cut short or of another corpus), and a real server serving version
1 goes on answering from it while a damaged version 2 sits on disk, says so in /health and in its log once per
version, then picks up the good version 2 when it is published."""

import json
import os
import shutil
import threading
import time

import numpy as np
import pytest

from conftest import SAMPLE, run_script
from test_serve import Server, answered_alike
from utils.errors import UserError
from utils.files.corpus import load_passages
from utils.index.index import Index
from utils.reader.trained import Reader
from utils.runtime.output_dir import staged_directory, write_marker
from utils.search.bm25 import BM25
from utils.system.pipeline import QASystem

SHARD = "shard-00000"


@pytest.fixture(scope="module")
def versions(trained_models, tmp_path_factory):
    """(corpus rows, version 1 of an index with BM25, a copy of it updated to version 2: every passage retitled)."""
    root = tmp_path_factory.mktemp("versions")
    corpus, index, updated = root / "corpus.jsonl", root / "index", root / "updated"
    rows = [json.loads(line) for line in open(f"{SAMPLE}/dpr_passages.jsonl")]
    corpus.write_text("".join(json.dumps(r) + "\n" for r in rows))
    build = ["--retriever", trained_models[1], "--passages", corpus, "--bm25", "true"]
    run_script("index_corpus.py", *build, "--output_dir", index)
    shutil.copytree(index, updated)
    corpus.write_text("".join(json.dumps({**r, "title": r["title"] + " (revised)"}) + "\n" for r in rows))
    run_script("index_corpus.py", *build, "--output_dir", updated)
    assert json.loads((updated / "index.json").read_text())["version"] == 2
    return rows, index, updated


def cut(path, end):
    os.truncate(path, end if end >= 0 else os.path.getsize(path) + end)


def last_offset(shard):
    return int(np.fromfile(shard / "offsets.bin", dtype=np.int64)[-1])


def other_bm25(bm25):
    shutil.rmtree(bm25)
    BM25(load_passages(f"{SAMPLE}/dpr_passages.jsonl")[:10]).save(str(bm25))


DAMAGES = {  # what is done to a copy of version 1, and what the refusal names
    "passages-cut-mid-line": (lambda d: cut(d / SHARD / "passages.jsonl", -10),
                              f"{SHARD}/passages.jsonl holds"),
    "passages-cut-mid-line-no-progress": (lambda d: (os.remove(d / SHARD / "progress.json"),
                                                     cut(d / SHARD / "passages.jsonl", -10)),
                                          f"{SHARD}/passages.jsonl is cut short"),
    "passages-cut-at-a-line-no-progress": (lambda d: (os.remove(d / SHARD / "progress.json"),
                                                      cut(d / SHARD / "passages.jsonl", last_offset(d / SHARD))),
                                           f"{SHARD}/passages.jsonl is cut short"),
    "passages-missing": (lambda d: os.remove(d / SHARD / "passages.jsonl"), f"{SHARD}/passages.jsonl is missing"),
    "offsets-zeroed": (lambda d: (d / SHARD / "offsets.bin").write_bytes(bytes((d / SHARD / "offsets.bin").stat()
                                                                               .st_size)),
                       f"{SHARD}/offsets.bin: the passages' offsets do not rise"),
    "bm25-emptied": (lambda d: cut(d / "bm25" / "data.csc.index.npy", 0), "bm25: data.csc.index.npy is cut short"),
    "bm25-cut": (lambda d: cut(d / "bm25" / "indptr.csc.index.npy", -4), "bm25: indptr.csc.index.npy is cut short"),
    "bm25-vocab-cut": (lambda d: cut(d / "bm25" / "vocab.index.json", -2), "bm25: vocab.index.json is cut short"),
    "bm25-missing-file": (lambda d: os.remove(d / "bm25" / "params.index.json"), "bm25: params.index.json is missing"),
    "bm25-of-another-corpus": (lambda d: other_bm25(d / "bm25"), "bm25: BM25 over 10 passages, the index has"),
}


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_version_not_whole_is_refused_by_index_load_in_one_line_naming_the_file(versions, tmp_path, damage):
    """Index.load (at start and at every reload) checks the version whole, without reading its passages: a file cut
    short or missing is a UserError naming the index and the file, never a traceback nor an index that fails later,
    when a search reads a passage past the end."""
    _, index, _ = versions
    copy = tmp_path / "index"
    shutil.copytree(index, copy)
    assert Index.load(str(copy)).count == 33  # whole, before
    do, names = DAMAGES[damage]
    do(copy)
    with pytest.raises(UserError) as refused:
        Index.load(str(copy))
    message = str(refused.value)
    assert message.startswith(f"{copy}") and names in message and "\n" not in message, message


def publish(index, manifest):
    """A manifest put in place as index_corpus.py puts one: written beside, renamed over the old one."""
    shutil.copyfile(manifest, index / "index.json.new")
    os.replace(index / "index.json.new", index / "index.json")


def test_a_damaged_version_is_not_swapped_in_health_says_why_the_log_once_and_a_good_one_is_picked_up(
        trained_models, versions, tmp_path):
    """A server serving version 1 while a version 2 on disk cannot be loaded (its passages cut short; then a
    manifest naming files that are not there): every request is answered from version 1, /health names the failed
    version and why, the log says it once per manifest published, not at every check; once the files it names are
    there, whole, version 2 is swapped in and the failure cleared."""
    rows, original, updated = versions
    index = tmp_path / "index"
    shutil.copytree(original, index)
    s = Server(trained_models, tmp_path, "--index", index, "--reload_check_seconds", 0.2, passages=None)

    def answered_from(version):
        status, body = s.ask(["Who designed the Corran lighthouse?", "When was the loom built?"], k=5)
        assert status == 200, body
        revised = {p["title"].endswith("(revised)") for a in body["answers"] for p in a["passages"]}
        assert revised == {version == 2}, body

    def health_until(done):
        deadline = time.time() + 60
        while not done(s.get("/health")[1]):
            assert time.time() < deadline, s.output()
            answered_from(1)
            time.sleep(0.1)
        return s.get("/health")[1]

    def failures_logged():
        with open(s.log.name) as f:
            return f.read().count("cannot be loaded")

    try:
        assert s.get("/health")[1]["index_failed"] is None
        shutil.copytree(updated / "v2", index / "v2")
        cut(index / "v2" / SHARD / "passages.jsonl", -10)
        publish(index, updated / "index.json")
        health = health_until(lambda h: h["index_failed"] is not None)
        assert health["index_version"] == 1 and health["ready"] and health["reloads"] == 0, health
        assert health["index_failed"]["version"] == 2, health
        assert f"{index}: v2/{SHARD}/passages.jsonl holds" in health["index_failed"]["error"], health
        for _ in range(10):  # 2 s: 10 checks of the same manifest, each trying it again
            answered_from(1)
            time.sleep(0.2)
        assert failures_logged() == 1, s.output()

        shutil.rmtree(index / "v2")  # a manifest naming files that are not there
        publish(index, updated / "index.json")
        health = health_until(lambda h: "is missing" in (h["index_failed"] or {}).get("error", ""))
        assert health["index_version"] == 1 and health["index_failed"]["version"] == 2, health
        assert f"{index}: v2/{SHARD}/" in health["index_failed"]["error"], health
        time.sleep(2.0)
        answered_from(1)
        assert failures_logged() == 2, s.output()

        shutil.copytree(updated / "v2", tmp_path / "v2")  # the files it names put in place, whole at once
        os.rename(tmp_path / "v2", index / "v2")
        deadline = time.time() + 60  # picked up at a check: each tries the manifest again
        while s.get("/health")[1]["index_version"] != 2:
            assert time.time() < deadline, s.output()
            time.sleep(0.1)
        health = s.get("/health")[1]
        assert health["index_failed"] is None and health["reloads"] == 1, health
        answered_from(2)
        assert failures_logged() == 2 and "reloaded the index" in s.output()
    finally:
        s.stop()


def test_a_reader_published_again_is_swapped_in_between_passes_and_a_damaged_one_never(trained_models,
                                                                                      shared_reader_dir, tmp_path):
    """train_reader.py publishing into the --reader directory of a running server (a reader fine-tuned on the
    labels): the new reader is loaded beside the one serving and swapped in between passes: every request under
    way is answered (200), each by one reader (its answers' settings name it, and are that reader's), /health names
    the reader serving; a reader whose weights are cut short is never swapped in, /health says why."""
    first, second = trained_models[0], shared_reader_dir
    reader = tmp_path / "reader"
    shutil.copytree(first, reader)
    s = Server((str(reader), trained_models[1]), tmp_path, "--reload_check_seconds", 0.2)
    questions = ["Who designed the Corran lighthouse?", "When was the loom built?", "What did the ferry carry?"]
    expected = {Reader.files_fingerprint(d): QASystem(trained_models[1], d, passages=f"{SAMPLE}/dpr_passages.jsonl",
                                                      device="cpu").ask(questions, k=3) for d in (first, second)}
    seen, stop = [], threading.Event()

    def ask_all_along():
        while not stop.is_set():
            seen.append(s.ask(questions, k=3))

    def publish_reader(source, damage=None):  # as train_reader.py publishes: a directory swapped in whole
        with staged_directory(str(reader)) as staging:
            for name in os.listdir(source):
                if os.path.isfile(os.path.join(source, name)):
                    shutil.copyfile(os.path.join(source, name), os.path.join(staging, name))
            if damage:
                damage(staging)
            write_marker(staging, "train_reader.py", "published")

    clients = [threading.Thread(target=ask_all_along) for _ in range(2)]
    try:
        assert s.get("/health")[1]["reader"] == Reader.files_fingerprint(first)
        for c in clients:
            c.start()
        time.sleep(0.5)
        publish_reader(second)
        deadline = time.time() + 60
        while s.get("/health")[1]["reader"] != Reader.files_fingerprint(second):
            assert time.time() < deadline, s.output()
            time.sleep(0.1)
        time.sleep(0.5)
        stop.set()
        for c in clients:
            c.join()
        assert all(status == 200 for status, _ in seen), [b for status, b in seen if status != 200][:1]
        by = [{a["settings"]["reader"] for a in body["answers"]} for _, body in seen]
        assert all(len(readers) == 1 for readers in by)  # each request answered by one reader
        order = [readers.pop() for readers in by]
        assert order[0] == Reader.files_fingerprint(first) and order[-1] == Reader.files_fingerprint(second)
        assert order == sorted(order, key=lambda f: f == Reader.files_fingerprint(second))  # swapped once
        directory = {Reader.files_fingerprint(d): d for d in (first, second)}
        for (_, body), fingerprint in zip(seen, order):  # each as its reader answers
            assert {a["settings"]["rule"] for a in body["answers"]} == {"question" if directory[fingerprint] == second
                                                                        else "window"}
            for got, want in zip(body["answers"], expected[fingerprint]):
                answered_alike(got, want, (directory[fingerprint],))
        health = s.get("/health")[1]
        assert health["reader_reloads"] == 1 and health["reader_failed"] is None

        cut_weights = lambda d: cut(os.path.join(d, "model.safetensors"), -100)  # noqa: E731
        publish_reader(first, damage=cut_weights)
        deadline = time.time() + 60
        while s.get("/health")[1]["reader_failed"] is None:
            assert time.time() < deadline, s.output()
            time.sleep(0.1)
        health = s.get("/health")[1]
        assert health["reader"] == Reader.files_fingerprint(second) and health["reader_reloads"] == 1, health
        assert "model.safetensors" in health["reader_failed"]["error"] or "safetensors" in \
            health["reader_failed"]["error"].lower(), health
        status, body = s.ask(questions, k=3)
        assert status == 200 and {a["settings"]["reader"] for a in body["answers"]} == {order[-1]}
    finally:
        stop.set()
        s.stop()

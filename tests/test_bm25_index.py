"""An index of BM25 alone (index_corpus.py --retriever bm25), as a user without a trained retriever runs it: built,
updated (only what changed copied, BM25 built again), resumed after a kill, read by qa_system.py and serve.py
--retriever bm25 --index exactly as the passages themselves are ranked, and reloaded by a running server."""

import json
import time

from conftest import SAMPLE, assert_user_error, run_script
from test_index_corpus import edited_corpus, killed_after_chunks
from test_serve import Server
from utils.files.corpus import load_passages
from utils.index.index import Index
from utils.search.bm25 import BM25

QUESTIONS = ["Who designed the Corran lighthouse?", "When was the loom built?", "What does the seed library lend?",
             "When was the tide mill built?"]


def bm25_index(out, corpus, *extra):
    return run_script("index_corpus.py", "--retriever", "bm25", "--passages", corpus, "--output_dir", out,
                      "--chunk_passages", 4, *extra)


def ranked(searcher, passages, k=8):
    scores, ids, _, _ = searcher.search(QUESTIONS, k)
    return [[(passages[int(j)]["passage_id"], float(s)) for s, j in zip(row_s, row_i) if j >= 0]
            for row_s, row_i in zip(scores, ids)]


def test_a_bm25_index_is_built_updated_and_resumed_as_a_dense_one_and_ranks_as_its_passages(tmp_path):
    """index_corpus.py --retriever bm25 said "bm25: no such directory": a BM25 user had no index, no update and no
    reload, only --passages read whole and BM25 built at every start."""
    corpus, out, killed = tmp_path / "corpus.jsonl", tmp_path / "index", tmp_path / "killed"
    lines = open(f"{SAMPLE}/dpr_passages.jsonl").read().splitlines()
    corpus.write_text("\n".join(lines) + "\n")
    bm25_index(out, corpus)
    index = Index.load(str(out))
    assert index.bm25_only and index.bm25 is not None and not index.shards
    assert list(index.passages) == load_passages(str(corpus))
    assert ranked(index.bm25, index.passages) == ranked(BM25(load_passages(str(corpus))), load_passages(str(corpus)))

    rows = edited_corpus(corpus, lines)  # 3 of 34 passages new or changed
    proc = bm25_index(out, corpus)
    assert "update to version 2" in proc.stdout and "3 passages embedded" in proc.stdout and "BM25" in proc.stdout
    updated = Index.load(str(out))
    assert updated.version == 2 and [p["passage_id"] for p in updated.passages] == [r["passage_id"] for r in rows]
    assert ranked(updated.bm25, updated.passages) == ranked(BM25(rows), rows)  # as a rebuild ranks
    assert "up to date" in bm25_index(out, corpus).stdout

    killed_after_chunks(["--retriever", "bm25", "--passages", corpus, "--output_dir", killed, "--chunk_passages", 1],
                        killed / "shard-00000", 5)
    bm25_index(killed, corpus, "--chunk_passages", 1)
    resumed = Index.load(str(killed))
    assert list(resumed.passages) == rows and ranked(resumed.bm25, resumed.passages) == ranked(BM25(rows), rows)

    proc = run_script("index_corpus.py", "--retriever", "bm25", "--passages", corpus, "--output_dir", tmp_path / "x",
                      "--bm25", "false", check=False)
    assert_user_error(proc, "an index of BM25 alone needs its BM25")


def test_qa_system_and_serve_read_a_bm25_index_as_the_passages_and_the_server_reloads_it(trained_models,
                                                                                         tmp_path):
    reader, retriever = trained_models
    corpus, index = tmp_path / "corpus.jsonl", tmp_path / "index"
    lines = open(f"{SAMPLE}/dpr_passages.jsonl").read().splitlines()
    corpus.write_text("\n".join(lines) + "\n")
    bm25_index(index, corpus)
    common = ["--retriever", "bm25", "--reader", reader, "--questions", f"{SAMPLE}/dev.json", "--max_questions", 12]
    run_script("qa_system.py", *common, "--passages", corpus, "--output_dir", tmp_path / "from-passages")
    run_script("qa_system.py", *common, "--index", index, "--output_dir", tmp_path / "from-index")
    for name in ("predictions.json", "details.jsonl"):
        assert (tmp_path / "from-index" / name).read_text() == (tmp_path / "from-passages" / name).read_text()
    proc = run_script("qa_system.py", *common, "--retriever", retriever, "--index", index, "--output_dir",
                      tmp_path / "dense", check=False)
    assert_user_error(proc, "an index of BM25 alone, without vectors: search it with --retriever bm25")

    server = Server((reader, "bm25"), tmp_path, "--index", index, "--reload_check_seconds", 0.2, passages=None)
    try:
        question = "Who kept the Fennick ferry log?"
        status, body = server.ask(question, k=1)
        assert status == 200 and "Fennick" not in body["answers"][0]["passages"][0]["text"]
        rows = [json.loads(line) for line in lines] + [
            {"passage_id": "ferry#0", "title": "The Fennick ferry", "text": "Marta Quell kept the Fennick ferry log "
             "from 1902 until the bridge opened."}]
        corpus.write_text("".join(json.dumps(r) + "\n" for r in rows))
        bm25_index(index, corpus)
        deadline = time.time() + 60
        while server.get("/health")[1]["index_version"] != 2 and time.time() < deadline:
            time.sleep(0.1)
        status, body = server.ask(question, k=1)
        assert status == 200 and body["answers"][0]["passages"][0]["passage_id"] == "ferry#0"
        assert server.get("/health")[1]["reloads"] == 1
    finally:
        server.stop()

"""index_corpus.py as users run it: every process embeds its shard (2 gloo processes = 1 process, vector for
vector), a killed build resumes to the uninterrupted one's index, a changed corpus or retriever is refused, the index
is searched shard by shard, and FAISS IVF/HNSW indexes built from the shards find what the exact search finds."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from conftest import ROOT, SAMPLE, assert_user_error, run_script
from test_distributed import run_ddp
from test_retriever_api import a_users_project
from tolerance import assert_ranked_alike
from utils.index.faiss_index import build_faiss, faiss_top_k
from utils.index.index import Index
from utils.retriever.retriever import Retriever
from utils.search.exact import search_shards, top_k
from utils.search.shards import merge_columns
from utils.search.vectors import Vectors

ONE_THREAD = {"OMP_NUM_THREADS": "1"}  # the 2-process runs' threads: the same arithmetic in both


@pytest.fixture(scope="module")
def retriever(tiny_bert_dir, tmp_path_factory):
    """A tiny retriever trained on sentence windows of the sample (its index holds windows and their owners)."""
    out = str(tmp_path_factory.mktemp("dpr") / "retriever")
    run_script("train_dpr.py", "--query_model_name_or_path", tiny_bert_dir, "--passage_model_name_or_path",
               tiny_bert_dir, "--output_dir", out, "--max_train_steps", 2, "--window_sentences", 1,
               "--per_device_train_batch_size", 8, "--eval_before_training", "false")
    return out


def index_args(retriever, out, *extra, corpus=f"{SAMPLE}/dpr_passages.jsonl"):
    return ["--retriever", retriever, "--passages", corpus, "--output_dir", out, "--chunk_passages", 4, *extra]


def vectors_of(directory):
    index = Index.load(str(directory))
    return (np.concatenate([np.asarray(v.embeddings) for v in index.shards]),
            np.concatenate([np.asarray(v.owner) + v.offset for v in index.shards]), index)


QUESTIONS = ["Who designed the Corran lighthouse?", "When was the loom built?", "What does the seed library lend?"]


def test_two_processes_build_what_one_builds_and_each_searches_its_shards(retriever, tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    proc = run_script("index_corpus.py", *index_args(retriever, one), env=ONE_THREAD)
    assert "33 passages, 9 chunks in 1 shard(s), sentence windows" in proc.stdout
    run_ddp("index_corpus.py", *index_args(retriever, two))
    (a, owner_a, ia), (b, owner_b, ib) = vectors_of(one), vectors_of(two)
    assert len(ib.shards) == 2 and ib.shards[1].offset == 16  # chunks 0-3 of 4 passages, then chunks 4-8
    assert np.array_equal(a, b) and np.array_equal(owner_a, owner_b)  # vector for vector
    searcher = Retriever(retriever, device="cpu")
    assert searcher.search(ia, QUESTIONS, k=5) == searcher.search(ib, QUESTIONS, k=5)
    assert [p["passage_id"] for p in ia.passages] == [json.loads(line)["passage_id"]
                                                    for line in open(f"{SAMPLE}/dpr_passages.jsonl")]
    # the same ranking as the Retriever API embedding the corpus in memory (other batches: within float rounding)
    memory = searcher.index(f"{SAMPLE}/dpr_passages.jsonl", bm25=False, progress=False)
    np.testing.assert_allclose(np.asarray(memory.shards[0].embeddings), a, rtol=1e-4, atol=1e-5)
    assert_ranked_alike([[(h["passage_id"], h["score"]) for h in r] for r in searcher.search(memory, QUESTIONS, k=5)],
                        [[(h["passage_id"], h["score"]) for h in r] for r in searcher.search(ia, QUESTIONS, k=5)])
    # a question set searched shard by shard, as each process searches its own: the same as all at once
    q = searcher.encode_questions(QUESTIONS)
    whole = search_shards(q, ia.shards, 10)
    parts = [search_shards(q, [v], 10) for v in ib.shards]
    merged = merge_columns([p[0] for p in parts], [p[1] for p in parts], 10)
    # other blocks, other summation orders: the same ranking up to near-ties
    assert_ranked_alike([list(zip(i, s)) for s, i in zip(*whole)], [list(zip(i, s)) for s, i in zip(*merged)])


def test_the_index_read_from_disk_is_searched_as_in_memory_across_many_blocks(retriever, tmp_path):
    """The owners are stored as int32 (utils.index.format): MaxP over many blocks takes them as int64 ones
    (a memory-mapped int32 owner made KBest's index_put fail: found serving a real index)."""
    out = tmp_path / "index"
    run_script("index_corpus.py", *index_args(retriever, out))
    loaded = Index.load(str(out))
    v = loaded.shards[0]
    assert isinstance(v.owner, np.memmap) and v.owner.dtype == np.int32
    q = Retriever(loaded.model_dir, device="cpu").encode_questions(QUESTIONS)
    in_memory = Vectors(np.asarray(v.embeddings), np.asarray(v.owner, dtype=np.int64), v.count, v.offset)
    for k in (5, 30):
        got, want = top_k(q, v, k, block_rows=8, prefilter=False), top_k(q, in_memory, k, block_rows=8, prefilter=False)
        assert np.array_equal(got[1], want[1]) and np.array_equal(got[0], want[0])


def killed_after_chunks(args, shard, chunks: int, env=None) -> None:
    """index_corpus.py with `args` in a child, SIGKILLed once its `shard` has recorded `chunks` chunks."""
    cmd = [sys.executable, os.path.join(ROOT, "index_corpus.py"), *map(str, args)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, **(env or {})})
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        try:
            if len(json.load(open(shard / "progress.json"))["chunks"]) >= chunks:
                break
        except (OSError, ValueError):
            pass
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL, "the job finished before it could be killed"


def test_a_killed_build_resumes_to_the_uninterrupted_index(retriever, tmp_path):
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    run_script("index_corpus.py", *index_args(retriever, whole, "--chunk_passages", 1))
    killed_after_chunks(index_args(retriever, killed, "--chunk_passages", 1), killed / "shard-00000", 5)
    assert not json.load(open(killed / "index.json"))["complete"]
    with pytest.raises(Exception, match="not complete"):
        Index.load(str(killed))
    with open(killed / "shard-00000" / "vectors.bin", "ab") as f:  # as if killed while appending a chunk
        f.write(b"\0" * 1000)
    proc = run_script("index_corpus.py", *index_args(retriever, killed, "--chunk_passages", 1))
    assert "resuming after" in proc.stderr
    (a, owner_a, _), (b, owner_b, _) = vectors_of(whole), vectors_of(killed)
    assert np.array_equal(a, b) and np.array_equal(owner_a, owner_b)


def test_a_changed_corpus_or_retriever_or_layout_is_refused(retriever, tiny_bert_dir, tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    shutil.copy(f"{SAMPLE}/dpr_passages.jsonl", corpus)
    out = tmp_path / "index"
    run_script("index_corpus.py", *index_args(retriever, out, corpus=corpus))
    manifest = json.load(open(out / "index.json"))
    proc = run_script("index_corpus.py", *index_args(retriever, out, corpus=corpus))
    assert "up to date" in proc.stdout and json.load(open(out / "index.json")) == manifest  # nothing rewritten
    json.dump({**manifest, "complete": False}, open(out / "index.json", "w"))  # as an unfinished build
    lines = corpus.read_text().splitlines()
    corpus.write_text("\n".join(lines[:3] + [lines[3].replace("the", "a", 1)] + lines[4:]) + "\n")
    assert_user_error(run_script("index_corpus.py", *index_args(retriever, out, corpus=corpus), check=False),
                      "an unfinished index of another corpus (the file changed since it was started)")
    shutil.copy(f"{SAMPLE}/dpr_passages.jsonl", corpus)
    assert_user_error(run_script("index_corpus.py", *index_args(retriever, out, "--dtype", "float16", corpus=corpus),
                                 check=False), "an unfinished index built with another retriever or settings (dtype")
    proc = run_ddp("index_corpus.py", *index_args(retriever, out, corpus=corpus), check=False)
    assert proc.returncode != 0 and "error: " + str(out) + ": an unfinished index started with 1 processes: " \
        "resume it with as many (this run has 2)" in proc.stderr
    other = tmp_path / "other"
    shutil.copytree(retriever, other)
    settings = json.load(open(other / "retriever_settings.json"))
    json.dump({**settings, "max_passage_length": 128}, open(other / "retriever_settings.json", "w"))
    assert_user_error(run_script("index_corpus.py", *index_args(str(other), out, corpus=corpus), check=False),
                      "(settings differ)")
    run_script("index_corpus.py", *index_args(retriever, out, corpus=corpus))  # the same retriever finishes it
    assert json.load(open(out / "index.json"))["complete"]
    # bad input before anything is written: a duplicate id anywhere, across the shards
    duplicate = tmp_path / "duplicate.jsonl"
    duplicate.write_text("\n".join(lines + [lines[0]]) + "\n")
    message = f"duplicate.jsonl: line 34: duplicate passage_id {json.loads(lines[0])['passage_id']!r} (first at line 1)"
    fresh = tmp_path / "fresh"
    assert_user_error(run_script("index_corpus.py", *index_args(retriever, fresh, corpus=duplicate), check=False),
                      message)
    proc = run_ddp("index_corpus.py", *index_args(retriever, fresh, corpus=duplicate), check=False)  # across shards
    assert proc.returncode != 0 and message in proc.stderr and "Traceback" not in proc.stderr.split("error:")[0]
    assert not fresh.exists()


def edited_corpus(path, lines):
    """The sample corpus with one passage changed, one removed, one added at the front (every later position moves)
    and one at the end: of its 34 passages, 3 are new or changed."""
    rows = [json.loads(line) for line in lines]
    rows[3]["text"] = rows[3]["text"].replace("the", "a", 1)
    del rows[10]
    rows = [{"passage_id": "new-first", "title": "Tide mills", "text": "A tide mill turns with the tide. It was "
             "built in 1790."}] + rows + [{"passage_id": "new-last", "title": "Looms", "text": "The loom was built."}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def by_passage(directory):
    """{passage_id: its vectors (rows), as stored} of an index."""
    vectors, owner, index = vectors_of(directory)
    return {p["passage_id"]: vectors[owner == j] for j, p in enumerate(index.passages)}


def test_an_update_embeds_only_what_changed_keeps_the_rest_bit_for_bit_and_searches_as_a_rebuild(retriever, tmp_path):
    corpus, out, rebuilt = tmp_path / "corpus.jsonl", tmp_path / "index", tmp_path / "rebuilt"
    lines = open(f"{SAMPLE}/dpr_passages.jsonl").read().splitlines()
    corpus.write_text("\n".join(lines) + "\n")
    run_script("index_corpus.py", *index_args(retriever, out, "--bm25", "true", corpus=corpus))
    before = by_passage(out)
    rows = edited_corpus(corpus, lines)
    proc = run_script("index_corpus.py", *index_args(retriever, out, "--bm25", "true", corpus=corpus))
    assert "update to version 2" in proc.stdout and "3 passages embedded" in proc.stdout
    meta = json.load(open(out / "index.json"))
    assert meta["version"] == 2 and meta["embedded"] == 3 and meta["passages"] == 34
    # the previous version's files are gone, the update's record too; nothing else of ours is left behind
    assert sorted(os.listdir(out)) == ["index.json", "v2"]
    after = by_passage(out)
    kept = [r["passage_id"] for i, r in enumerate(rows) if i not in (0, 4, 33)]
    assert len(kept) == 31 and all(np.array_equal(after[k], before[k]) for k in kept)  # bit for bit
    run_script("index_corpus.py", *index_args(retriever, rebuilt, "--bm25", "true", corpus=corpus))
    fresh = by_passage(rebuilt)
    assert list(after) == list(fresh) == [r["passage_id"] for r in rows]
    for k in after:  # the kept vectors were embedded in other batches: equal within float rounding
        np.testing.assert_allclose(after[k], fresh[k], rtol=1e-4, atol=1e-5)
    searcher, a, b = Retriever(retriever, device="cpu"), Index.load(str(out)), Index.load(str(rebuilt))
    assert list(a.passages) == list(b.passages)
    for hybrid in (False, True):
        assert_ranked_alike([[(h["passage_id"], h["score"]) for h in r] for r in searcher.search(a, QUESTIONS, 8,
                                                                                                 hybrid=hybrid)],
                            [[(h["passage_id"], h["score"]) for h in r] for r in searcher.search(b, QUESTIONS, 8,
                                                                                                 hybrid=hybrid)])
    assert "up to date" in run_script("index_corpus.py", *index_args(retriever, out, corpus=corpus)).stdout
    corpus.write_text("".join(json.dumps(r) + "\n" for r in rows[:20]))  # a third version: documents removed
    proc = run_script("index_corpus.py", *index_args(retriever, out, corpus=corpus))
    assert "0 passages embedded" in proc.stdout and sorted(os.listdir(out)) == ["index.json", "v3"]
    assert [p["passage_id"] for p in Index.load(str(out)).passages] == [r["passage_id"] for r in rows[:20]]


def test_a_folder_of_documents_changed_added_and_removed_reembeds_only_their_passages(retriever, tmp_path):
    """The README's third workflow run twice: ingest a folder, index it; then one document edited, one added, one
    deleted, and the same two commands: the update embeds exactly the passages of the edited and the added
    documents (counted), and the index holds the folder as it is now, each passage naming its document."""
    docs, corpus, out = tmp_path / "docs", tmp_path / "corpus.jsonl", tmp_path / "index"
    docs.mkdir()
    rows = [json.loads(line) for line in open(f"{SAMPLE}/dpr_passages.jsonl")]
    for i in range(0, 30, 6):  # 5 documents of 6 paragraphs each
        text = "\n\n".join(r["text"] for r in rows[i:i + 6])
        (docs / f"doc{i // 6}.md").write_text(f"# {rows[i]['title']}\n\n{text}")
    steps = (["ingest_documents.py", "--documents", docs, "--output", corpus, "--max_words", 40],
             ["index_corpus.py", *index_args(retriever, out, corpus=corpus)])
    for step in steps:
        run_script(*step)
    first = {p["passage_id"]: p for p in map(json.loads, open(corpus))}
    (docs / "doc1.md").write_text((docs / "doc1.md").read_text() + "\n\nThe mill was rebuilt in 1901.")
    (docs / "doc2.md").unlink()
    (docs / "new.md").write_text("# Tide mills\n\nA tide mill turns with the tide. It was built in 1790.")
    proc = [run_script(*step) for step in steps][-1]
    now = [json.loads(line) for line in open(corpus)]
    fresh = [p for p in now if p["document"] in ("doc1.md", "new.md")]
    changed = [p for p in fresh if first.get(p["passage_id"], {}).get("text") != p["text"]]
    assert 0 < len(changed) < len(fresh)  # the edit at the end of doc1 changes its last passage only
    assert f"{len(changed)} passages embedded" in proc.stdout
    index = Index.load(str(out))
    assert list(index.passages) == now and not any(p["document"] == "doc2.md" for p in now)
    hit = Retriever(retriever, device="cpu").search(index, ["When was the tide mill built?"], k=len(now))[0]
    assert {h["source"]["document"] for h in hit} == {"doc0.md", "doc1.md", "doc3.md", "doc4.md", "new.md"}


def test_a_killed_update_resumes_and_two_processes_update_as_one(retriever, tmp_path):
    """Killed while embedding, the index still serves its previous version whole; the same command then finishes
    the update, equal (vector for vector) to an uninterrupted one and to one made by 2 processes."""
    corpus, base = tmp_path / "corpus.jsonl", tmp_path / "base"
    lines = open(f"{SAMPLE}/dpr_passages.jsonl").read().splitlines()
    corpus.write_text("\n".join(lines) + "\n")
    run_script("index_corpus.py", *index_args(retriever, base, "--chunk_passages", 1, corpus=corpus), env=ONE_THREAD)
    rows = [json.loads(line) for line in lines]
    changed = [{**r, "text": r["text"] + " It is still there."} if i % 2 else r for i, r in enumerate(rows)]
    corpus.write_text("".join(json.dumps(r) + "\n" for r in changed))
    whole, killed, two = (tmp_path / name for name in ("whole", "killed", "two"))
    for d in (whole, killed, two):
        shutil.copytree(base, d)
    run_script("index_corpus.py", *index_args(retriever, whole, "--chunk_passages", 1, corpus=corpus), env=ONE_THREAD)
    killed_after_chunks(index_args(retriever, killed, "--chunk_passages", 1, corpus=corpus), killed / "v2" /
                        "shard-00000", 5, env=ONE_THREAD)
    assert by_passage(killed).keys() == by_passage(base).keys()  # the previous version, whole
    proc = run_script("index_corpus.py", *index_args(retriever, killed, "--chunk_passages", 1, corpus=corpus),
                      env=ONE_THREAD)
    assert "resuming after" in proc.stderr and "16 passages embedded" in proc.stdout
    run_ddp("index_corpus.py", *index_args(retriever, two, "--chunk_passages", 1, corpus=corpus))
    (a, owner_a, _), (b, owner_b, _), (c, owner_c, _) = vectors_of(whole), vectors_of(killed), vectors_of(two)
    assert np.array_equal(a, b) and np.array_equal(owner_a, owner_b)
    assert np.array_equal(a, c) and np.array_equal(owner_a, owner_c)
    assert sorted(os.listdir(killed)) == ["index.json", "v2"]
    assert len(json.load(open(two / "index.json"))["shards"]) == 2


def test_overwrite_refuses_a_directory_not_written_by_this_project_and_one_holding_the_corpus(retriever, tmp_path):
    """--overwrite_output_dir emptied any directory holding a file named index.json (a manifest that did not parse
    was ignored), and an index directory that holds the corpus being indexed (deleting the corpus)."""
    project = tmp_path / "project"
    contents = a_users_project(project)
    assert_user_error(run_script("index_corpus.py", *index_args(retriever, project, "--overwrite_output_dir"),
                                 check=False), "not empty and not an index")
    assert sorted(str(p.relative_to(project)) for p in project.rglob("*")) == contents
    index, _ = synthetic_index(n=40, dim=4)
    index.save(str(tmp_path / "index"))
    corpus = tmp_path / "index" / "corpus.jsonl"
    shutil.copy(f"{SAMPLE}/dpr_passages.jsonl", corpus)
    assert_user_error(run_script("index_corpus.py", *index_args(retriever, tmp_path / "index", "--overwrite_output_dir",
                                                                corpus=corpus), check=False),
                      "holds the corpus being indexed")
    assert corpus.read_bytes() == open(f"{SAMPLE}/dpr_passages.jsonl", "rb").read()
    assert Index.load(str(tmp_path / "index")).count == 40


def synthetic_index(n=4000, dim=32, clusters=40, seed=0):
    """Clustered unit vectors (real embeddings cluster; uniform random ones are the worst case of any IVF)."""
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((clusters, dim)).astype(np.float32)
    x = centers[rng.integers(0, clusters, n)] + 0.35 * rng.standard_normal((n, dim)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    q = centers[rng.integers(0, clusters, 200)] + 0.35 * rng.standard_normal((200, dim)).astype(np.float32)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    half = n // 2  # two shards, as two processes would have written them
    shards = [Vectors(x[:half], None, half, 0), Vectors(x[half:], None, n - half, half)]
    passages = [{"passage_id": str(i), "title": "", "text": "t"} for i in range(n)]
    built_by = {"model": "synthetic", "passage_encoder": "-", "settings": {}, "precision": "no"}
    return Index(shards, passages, None, built_by), q


@pytest.mark.parametrize("kind, options, search, want", [
    ("flat", {}, {}, 1.0),
    ("ivf", {"nlist": 32}, {"nprobe": 32}, 1.0),  # every cell visited: exact
    ("ivf", {"nlist": 32}, {"nprobe": 4}, 0.85),
    ("ivfpq", {"nlist": 32, "pq_m": 16, "nbits": 6}, {"nprobe": 8}, 0.5),  # 12 bytes a vector, not 128
    ("hnsw", {"hnsw_m": 16}, {"ef_search": 64}, 0.9),
])
def test_faiss_indexes_from_the_shards_find_what_the_exact_search_finds(kind, options, search, want):
    index, q = synthetic_index()
    _, exact = search_shards(torch.from_numpy(q), index.shards, 10)
    faiss_index = build_faiss(index, kind, **options)
    assert faiss_index.ntotal == 4000
    _, found = faiss_top_k(index, faiss_index, q, 10, **search)
    recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(exact.tolist(), found.tolist())])
    assert recall >= want, recall
    if want == 1.0:
        assert recall == 1.0


def strict_json(path):
    """A file's JSON read as strict JSON readers read it: NaN and Infinity are not JSON."""
    def refuse(constant):
        raise AssertionError(f"{path}: {constant} is not JSON")

    with open(path) as f:
        return json.load(f, parse_constant=refuse)


def test_an_index_manifest_and_progress_are_strict_json_a_nan_written_as_null(tmp_path):
    """One atomic writer (utils.files.jsonfiles.write_json_file) for every JSON file: the index's manifest went
    through a second one that wrote NaN."""
    index, _ = synthetic_index(n=40, dim=4)
    index.built_by["settings"] = {"hybrid_dense_weight": float("nan")}
    index.save(str(tmp_path / "index"))
    assert strict_json(tmp_path / "index" / "index.json")["settings"]["hybrid_dense_weight"] is None
    assert strict_json(tmp_path / "index" / "shard-00000" / "progress.json")["passages"] == 20
    assert not [n for n in os.listdir(tmp_path / "index") if n.endswith(".tmp")]

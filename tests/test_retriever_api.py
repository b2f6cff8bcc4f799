"""A trained retriever used as trained: the eval-only mode and the Retriever/Index API rank exactly as the training
run's own evaluation did (rankings.jsonl), an index round-trips through its directory, FAISS agrees with the exact
search, and a directory that is not what it should be is a one-line error."""

import json
import os
import re
import shutil
import warnings

import numpy as np
import pytest

from conftest import SAMPLE, assert_user_error, run_script
from tolerance import assert_ranks_within, assert_top_k_of
from utils.errors import UserError
from utils.files.corpus import load_passages
from utils.files.dpr import load_dpr
from utils.index.faiss_index import build_faiss, search_faiss
from utils.index.index import Index
from utils.retriever.retriever import Retriever
from utils.search.bm25 import BM25
from utils.search.vectors import Vectors

FLAGS = ["--per_device_train_batch_size", 8, "--num_hard_negatives", 1]  # the in-batch rank depends on them


@pytest.fixture(scope="module")
def trained(tiny_bert_dir, tmp_path_factory):
    """A tiny retriever trained on sentence windows of the shipped sample."""
    out = str(tmp_path_factory.mktemp("dpr") / "out")
    run_script("train_dpr.py", "--query_model_name_or_path", tiny_bert_dir, "--passage_model_name_or_path",
               tiny_bert_dir, "--output_dir", out, "--max_train_steps", 6, "--learning_rate", 5e-4,
               "--window_sentences", 1, "--eval_before_training", "false", *FLAGS)
    return out


def rankings(directory):
    return [json.loads(line) for line in open(os.path.join(directory, "rankings.jsonl"))]


def test_the_eval_only_mode_reproduces_the_training_runs_rankings(trained, tmp_path):
    out = tmp_path / "eval"
    proc = run_script("train_dpr.py", "--do_train", "false", "--model_name_or_path", trained, "--validation_file",
                      f"{SAMPLE}/dpr_dev.json", "--passages", f"{SAMPLE}/dpr_passages.jsonl", "--output_dir", out,
                      *FLAGS)
    assert "hybrid at the recorded dense weight" in proc.stdout and "an upper bound" in proc.stdout
    assert rankings(out) == rankings(trained)
    run, now = (json.load(open(os.path.join(d, "eval_results.json")))["metrics"] for d in (trained, out))
    for name in ("top1", "top20", "mrr@10", "mean_rank", "in_batch_avg_rank", "bm25_top1", "rrf_mrr@10",
                 "hybrid_top1", "hybrid_mrr@10", "hybrid_tuned_top1", "hybrid_tuned_dense_weight"):
        assert now[name] == run[name], name  # hybrid_*: cross-fitted in both modes, one meaning
    weight = json.load(open(os.path.join(trained, "retriever_settings.json")))["hybrid_dense_weight"]
    assert now["hybrid_recorded_dense_weight"] == weight == run["hybrid_tuned_dense_weight"]
    assert now["hybrid_recorded_mrr@10"] == run["hybrid_tuned_mrr@10"]  # on the data the weight was tuned on
    assert "hybrid_recorded_top1" not in run and "hybrid_dense_weight" not in run


def test_the_eval_only_mode_embeds_as_trained_and_counts_a_repeated_gold_passage_once(trained, tmp_path):
    bf16 = tmp_path / "bf16"  # a retriever whose run evaluated in bf16
    shutil.copytree(trained, bf16)
    settings = json.load(open(bf16 / "retriever_settings.json"))
    json.dump({**settings, "precision": "bf16"}, open(bf16 / "retriever_settings.json", "w"))
    dev = json.load(open(f"{SAMPLE}/dpr_dev.json"))
    for q in dev:
        q["positive_ctxs"] = q["positive_ctxs"] * 2  # the same positive listed twice
    twice = tmp_path / "twice.json"
    twice.write_text(json.dumps(dev))
    out = tmp_path / "eval"
    proc = run_script("train_dpr.py", "--do_train", "false", "--model_name_or_path", bf16, "--validation_file", twice,
                      "--passages", f"{SAMPLE}/dpr_passages.jsonl", "--output_dir", out, *FLAGS)
    assert "encoders at precision bf16 (as trained)" in proc.stdout
    results = json.load(open(out / "eval_results.json"))
    assert results["precision"] == "bf16"
    run = json.load(open(os.path.join(trained, "eval_results.json")))["metrics"]
    for name in ("bm25_top1", "bm25_mrr@10", "bm25_mean_rank"):  # BM25 does not depend on the precision
        assert results["metrics"][name] == run[name], name


def test_the_eval_only_mode_takes_a_retriever_with_one_shared_encoder(tiny_bert_dir, tmp_path):
    shared = str(tmp_path / "shared")
    run_script("train_dpr.py", "--query_model_name_or_path", tiny_bert_dir, "--shared_encoder", "--output_dir", shared,
               "--max_train_steps", 2, "--eval_before_training", "false", *FLAGS)
    out = tmp_path / "eval"
    run_script("train_dpr.py", "--do_train", "false", "--model_name_or_path", shared, "--validation_file",
               f"{SAMPLE}/dpr_dev.json", "--passages", f"{SAMPLE}/dpr_passages.jsonl", "--output_dir", out, *FLAGS)
    assert rankings(out) == rankings(shared)


def test_the_api_ranks_as_the_training_run_did_and_the_index_round_trips(trained, tmp_path):
    dev = load_dpr(f"{SAMPLE}/dpr_dev.json")
    questions = [q["question"] for q in dev]
    retriever = Retriever(trained, device="cpu")
    index = retriever.index(f"{SAMPLE}/dpr_passages.jsonl", progress=False)
    assert len(index.shards[0].embeddings) > 2 * len(index.passages)  # sentence windows, as trained
    dense = retriever.search(index, questions, k=20)
    # the run embedded the corpus in other batches: its top 20 is the API's, near-ties aside
    column = {p["passage_id"]: j for j, p in enumerate(index.passages)}

    def matrix(results):  # every passage's score, by corpus position
        out = np.full((len(questions), len(column)), -np.inf)
        for i, hits in enumerate(results):
            out[i, [column[h["passage_id"]] for h in hits]] = [h["score"] for h in hits]
        return out

    assert_top_k_of([[column[p] for p in r["top20"]] for r in rankings(trained)],
                    matrix(retriever.search(index, questions, k=len(column))))

    hybrid = retriever.search(index, questions, k=50, hybrid=True)
    every = matrix(retriever.search(index, questions, k=len(column), hybrid=True))
    held = [i for i, (q, hits) in enumerate(zip(dev, hybrid))  # the hybrid at the recorded weight, as rankings.jsonl
            if q["positive_ctxs"][0]["passage_id"] in {h["passage_id"] for h in hits}]
    assert held
    assert_ranks_within([rankings(trained)[i]["hybrid_gold_rank"] for i in held], every[held],
                        [[column[dev[i]["positive_ctxs"][0]["passage_id"]]] for i in held])

    index.save(str(tmp_path / "index"))
    loaded = Index.load(str(tmp_path / "index"))
    assert isinstance(loaded.shards[0].embeddings, np.memmap)
    assert retriever.search(loaded, questions, k=20) == dense
    assert retriever.search(loaded, questions, k=50, hybrid=True) == hybrid

    half = retriever.index(load_passages(f"{SAMPLE}/dpr_passages.jsonl"), dtype="float16", bm25=False, progress=False)
    assert half.shards[0].embeddings.dtype == np.float16
    every = len(index.passages)
    exact, near = (dict(((i, h["passage_id"]), h["score"])
                        for i, hits in enumerate(retriever.search(x, questions, k=every)) for h in hits)
                   for x in (index, half))
    assert exact.keys() == near.keys()
    scale = max(abs(v) for v in exact.values())
    assert max(abs(exact[key] - near[key]) for key in exact) < 2e-3 * scale  # float16 vectors: about 1e-3 off

    q = retriever.encode_questions(questions)
    flat = search_faiss(loaded, build_faiss(loaded, "flat"), q, k=20)  # the same ranking, ties aside
    np.testing.assert_allclose([[h["score"] for h in hits] for hits in flat],
                               [[h["score"] for h in hits] for hits in dense], rtol=1e-5)
    same = [a["passage_id"] == b["passage_id"] for x, y in zip(flat, dense) for a, b in zip(x, y)]
    assert np.mean(same) > 0.95
    hnsw = search_faiss(loaded, build_faiss(loaded, "hnsw"), q, k=5)  # approximate: the best scores agree
    np.testing.assert_allclose([h[0]["score"] for h in hnsw], [h[0]["score"] for h in dense], rtol=1e-4)


def test_the_hybrids_first_hits_do_not_depend_on_how_many_are_asked_for(trained):
    """The hybrid's candidates (and the min-max normalisation over them) widened with k: the top 10 of a k = 10
    search differed from the first 10 of a k = 400 one. They are each ranking's first hybrid_candidates now,
    whatever k, so a deeper search only adds hits after them."""
    questions = [q["question"] for f in ("dpr_dev.json", "dpr_train.json") for q in load_dpr(f"{SAMPLE}/{f}")]
    retriever = Retriever(trained, device="cpu")
    retriever.settings.hybrid_candidates = 4  # fewer than the corpus's passages: k goes past the candidates
    index = retriever.index(f"{SAMPLE}/dpr_passages.jsonl", progress=False)
    every = len(index.passages)
    deep = retriever.search(index, questions, k=every, hybrid=True)
    assert all(len(hits) == every for hits in deep)
    assert all(len({h["passage_id"] for h in hits}) == every for hits in deep)  # each passage once
    for k in (1, 3, 5, 8, 20):
        assert retriever.search(index, questions, k=k, hybrid=True) == [hits[:k] for hits in deep], k
    scores = np.array([[h["score"] for h in hits] for hits in deep])
    assert (np.diff(scores, axis=1) <= 0).all()  # best first, the hits past the candidates included


def test_a_saved_index_is_searched_without_warnings(trained, tmp_path):
    # Its vectors are a read-only memory map: handing a block of it to torch as is warned of undefined behaviour.
    retriever = Retriever(trained, device="cpu")
    retriever.index(f"{SAMPLE}/dpr_passages.jsonl", bm25=False, progress=False).save(str(tmp_path / "index"))
    loaded = Index.load(str(tmp_path / "index"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(retriever.search(loaded, ["Who designed the lighthouse?"], k=3)[0]) == 3


def test_a_malformed_or_mismatched_index_or_retriever_is_a_one_line_error(trained, tmp_path):
    index_dir = tmp_path / "index"
    Retriever(trained, device="cpu").index(f"{SAMPLE}/dpr_passages.jsonl", bm25=False, progress=False).save(
        str(index_dir))

    def broken(edit, message):
        d = tmp_path / f"broken{len(os.listdir(tmp_path))}"
        shutil.copytree(index_dir, d)
        edit(d)
        with pytest.raises(UserError) as err:
            Retriever(trained, device="cpu").check_index(Index.load(str(d)), str(d))
        assert str(err.value).startswith(str(d)) and message in str(err.value) and "\n" not in str(err.value)

    def meta(d, **changes):
        m = json.load(open(d / "index.json"))
        m.update(changes)
        json.dump(m, open(d / "index.json", "w"))

    broken(lambda d: os.remove(d / "index.json"), "not an index (no index.json)")
    broken(lambda d: meta(d, dimension=768), "shard-00000/vectors.bin holds")
    broken(lambda d: (meta(d, dimension=48), np.zeros((json.load(open(d / "index.json"))["vectors"], 48), np.float32)
                      .tofile(d / "shard-00000" / "vectors.bin")), "48-dimensional vectors, but")
    broken(lambda d: meta(d, settings={**json.load(open(d / "index.json"))["settings"], "window_sentences": 2}),
           "built with other settings than")
    broken(lambda d: os.remove(d / "shard-00000" / "owner.bin"), "shard-00000/owner.bin is missing")
    broken(lambda d: meta(d, complete=False), "the index is not complete")
    broken(lambda d: meta(d, format=2), "index format 2, this version reads 3: index the corpus again")
    no_settings = tmp_path / "no-settings"
    shutil.copytree(trained, no_settings)
    os.remove(no_settings / "retriever_settings.json")
    with pytest.raises(UserError, match="not a retriever written by train_dpr.py"):
        Retriever(str(no_settings))
    proc = run_script("train_dpr.py", "--do_train", "false", "--model_name_or_path", no_settings, "--validation_file",
                      f"{SAMPLE}/dpr_dev.json", "--output_dir", tmp_path / "e", check=False)
    assert_user_error(proc, "not a retriever written by train_dpr.py (no retriever_settings.json)")


def test_saving_an_index_destroys_nothing_that_is_not_an_index_and_replaces_an_index_whole(trained, tmp_path):
    index = Retriever(trained, device="cpu").index(f"{SAMPLE}/dpr_passages.jsonl", progress=False)
    reader_copy = tmp_path / "reader"  # a user's directory: a model, say
    reader_copy.mkdir()
    (reader_copy / "config.json").write_text("{}")
    (reader_copy / "model.safetensors").write_text("weights")
    for overwrite in (False, True):
        with pytest.raises(UserError, match="holds a trained model, which an index never replaces"):
            index.save(str(reader_copy), overwrite=overwrite)
    assert sorted(os.listdir(reader_copy)) == ["config.json", "model.safetensors"]
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")
    with pytest.raises(UserError, match="is a file, not a directory"):
        index.save(str(a_file))
    assert a_file.read_text() == "mine"

    target = tmp_path / "index"
    index.save(str(target))
    with pytest.raises(UserError, match="holds an index already: pass overwrite=True"):
        index.save(str(target))
    smaller = Retriever(trained, device="cpu").index(load_passages(f"{SAMPLE}/dpr_passages.jsonl")[:5], bm25=False,
                                                      progress=False)
    # a save that fails half-way (a passage that is not JSON) leaves the old index, whole, and no staging
    smaller.passages[-1] = {**smaller.passages[-1], "title": object()}
    with pytest.raises(TypeError):
        smaller.save(str(target), overwrite=True)
    assert Index.load(str(target)).count == 33
    smaller.passages[-1]["title"] = "t"
    smaller.save(str(target), overwrite=True)
    assert sorted(os.listdir(target)) == ["index.json", "shard-00000"]  # no bm25/
    assert Index.load(str(target)).count == 5
    assert sorted(os.listdir(tmp_path)) == ["index", "notes.txt", "reader"]  # no staging directory left behind


def tiny_index(n=3):
    """An index of n passages with made-up vectors: what saving does not depend on."""
    built_by = {"model": "tiny", "passage_encoder": "-", "settings": {}, "precision": "no"}
    passages = [{"passage_id": f"p{i}", "title": "", "text": f"text {i}"} for i in range(n)]
    return Index([Vectors(np.eye(n, 4, dtype=np.float32), None, n, 0)], passages, None, built_by)


def a_users_project(directory):
    """A user's directory that happens to hold a file named index.json."""
    directory.mkdir()
    (directory / "index.json").write_text('{"name": "my-web-app"}')
    (directory / "notes.txt").write_text("mine")
    (directory / "src").mkdir()
    (directory / "src" / "main.py").write_text("print('mine')")
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*"))


def test_overwriting_replaces_only_a_directory_this_project_wrote_not_any_with_an_index_json(tmp_path):
    """overwrite=True emptied every directory holding a file named index.json: only an index manifest of this
    project, or a run's marker (.qa-amp.json), makes a directory ours to replace."""
    project = tmp_path / "project"
    contents = a_users_project(project)
    for overwrite in (False, True):
        with pytest.raises(UserError, match="not empty and not an index"):
            tiny_index().save(str(project), overwrite=overwrite)
        assert sorted(str(p.relative_to(project)) for p in project.rglob("*")) == contents
    model = tmp_path / "model"  # a run's outputs, a trained model: never replaced by an index (issue 58, item 2)
    model.mkdir()
    (model / ".qa-amp.json").write_text('{"script": "train_reader.py", "state": "published"}')
    (model / "weights.bin").write_text("weights")
    results = tmp_path / "results"  # an evaluation's outputs: not an index either
    results.mkdir()
    (results / ".qa-amp.json").write_text('{"script": "qa_system.py", "state": "evaluated"}')
    (results / "predictions.json").write_text("{}")
    for directory, message in ((model, "holds a trained model"), (results, "an index replaces only an index")):
        for overwrite in (False, True):
            with pytest.raises(UserError, match=message):
                tiny_index().save(str(directory), overwrite=overwrite)
    assert sorted(os.listdir(model)) == [".qa-amp.json", "weights.bin"]
    assert sorted(os.listdir(results)) == [".qa-amp.json", "predictions.json"]


def test_overwriting_an_index_replaces_what_it_wrote_and_nothing_a_user_put_beside_it(tmp_path):
    """overwrite=True deleted every entry of an index directory, a user's notes put inside it included."""
    target = tmp_path / "index"
    tiny_index(3).save(str(target))
    (target / "notes.txt").write_text("mine")
    tiny_index(5).save(str(target), overwrite=True)
    assert sorted(os.listdir(target)) == ["index.json", "notes.txt", "shard-00000"]
    assert (target / "notes.txt").read_text() == "mine" and Index.load(str(target)).count == 5


def test_an_index_built_by_another_retriever_or_a_retrained_one_is_refused(trained, tiny_bert_dir, tmp_path):
    other = str(tmp_path / "other")  # the same settings, other weights
    run_script("train_dpr.py", "--query_model_name_or_path", tiny_bert_dir, "--passage_model_name_or_path",
               tiny_bert_dir, "--output_dir", other, "--max_train_steps", 2, "--learning_rate", 5e-4,
               "--window_sentences", 1, "--eval_before_training", "false", *FLAGS)
    mine = tmp_path / "mine"
    shutil.copytree(trained, mine)
    Retriever(str(mine), device="cpu").index(f"{SAMPLE}/dpr_passages.jsonl", bm25=False, progress=False).save(
        str(tmp_path / "index"))
    loaded = Index.load(str(tmp_path / "index"))
    with pytest.raises(UserError, match="made by another passage encoder than"):
        Retriever(other, device="cpu").check_index(loaded, str(tmp_path / "index"))
    assert len(Retriever(loaded.model_dir, device="cpu").search(loaded, "Who built the loom?", k=2)) == 2
    for name in ("query_encoder", "passage_encoder"):  # as if retrained into the same directory
        shutil.rmtree(mine / name)
        shutil.copytree(os.path.join(other, name), mine / name)
    loaded = Index.load(str(tmp_path / "index"))  # names the retriever that built it; checked at every search
    with pytest.raises(UserError, match="a retriever retrained since"):
        Retriever(loaded.model_dir, device="cpu").search(loaded, "Who built the loom?", k=2)
    reader = str(tmp_path / "nowhere")
    proc = run_script("qa_system.py", "--retriever", other, "--reader", reader, "--index", tmp_path / "index",
                      "--questions", f"{SAMPLE}/dev.json", "--output_dir", tmp_path / "qa", check=False)
    assert_user_error(proc, "no such directory")  # the reader is checked first, before anything is loaded
    from transformers import AutoModelForQuestionAnswering, AutoTokenizer

    reader = str(tmp_path / "reader")  # a reader (a QA head) that is not the problem: the index is
    AutoModelForQuestionAnswering.from_pretrained(tiny_bert_dir).save_pretrained(reader)
    AutoTokenizer.from_pretrained(tiny_bert_dir).save_pretrained(reader)
    proc = run_script("qa_system.py", "--retriever", other, "--reader", reader, "--index", tmp_path / "index",
                      "--questions", f"{SAMPLE}/dev.json", "--output_dir", tmp_path / "qa", check=False)
    assert_user_error(proc, "made by another passage encoder than")
    assert not os.path.exists(tmp_path / "qa")


def test_the_api_takes_one_question_as_a_string_and_refuses_bad_k_and_bad_corpora(trained, tmp_path):
    retriever = Retriever(trained, device="cpu")
    index = retriever.index(f"{SAMPLE}/dpr_passages.jsonl", bm25=False, progress=False)
    question = "Who designed the Corran lighthouse?"
    one = retriever.search(index, question, k=3)
    assert isinstance(one, list) and len(one) == 3 and isinstance(one[0], dict)
    assert one == retriever.search(index, [question], k=3)[0] and retriever.search(index, [], k=3) == []
    assert len(retriever.search(index, question, k=1000)) == 33
    for k in (0, -1):
        with pytest.raises(UserError, match="k must be a whole number of at least 1"):
            retriever.search(index, question, k=k)
    cases = [([], "expected a non-empty list"),
             ([{"title": "t", "text": "a text"}], "passage #0: missing 'passage_id'"),
             ([{"text": "a", "passage_id": "p"}, {"text": "b", "passage_id": "p"}],
              "passage #1: duplicate passage_id 'p' (first at passage #0)"),
             ([{"text": "a", "passage_id": ""}], "passage #0: empty 'passage_id' ''"),
             ([{"text": 3, "passage_id": "p"}], "a 'text' that is a non-empty string")]
    for passages, message in cases:
        with pytest.raises(UserError, match=re.escape(message)):
            retriever.index(passages, progress=False)
    with pytest.raises(UserError, match="BM25 needs at least one passage"):
        BM25([])
    index.save(str(tmp_path / "index"))
    os.remove(tmp_path / "index" / "shard-00000" / "vectors.bin")
    with pytest.raises(UserError, match="shard-00000/vectors.bin is missing"):
        Index.load(str(tmp_path / "index"))


def test_one_corpus_loader_refuses_duplicate_and_empty_ids_for_every_consumer(trained, tmp_path):
    rows = [json.loads(line) for line in open(f"{SAMPLE}/dpr_passages.jsonl")]
    duplicate = tmp_path / "duplicate.jsonl"
    duplicate.write_text("".join(json.dumps(r) + "\n"
                                 for r in rows[:5] + [{**rows[7], "passage_id": rows[2]["passage_id"]}]))
    message = f"duplicate.jsonl: line 6: duplicate passage_id {rows[2]['passage_id']!r} (first at line 3)"
    with pytest.raises(UserError, match=re.escape(message)):
        load_passages(str(duplicate))
    empty = tmp_path / "empty.jsonl"
    empty.write_text(json.dumps(rows[0]) + "\n\n" + json.dumps({**rows[1], "passage_id": " "}) + "\n")
    with pytest.raises(UserError, match=re.escape("empty.jsonl: line 3: empty 'passage_id' ' '")):
        load_passages(str(empty))
    proc = run_script("train_dpr.py", "--do_train", "false", "--model_name_or_path", trained, "--validation_file",
                      f"{SAMPLE}/dpr_dev.json", "--passages", duplicate, "--output_dir", tmp_path / "e", check=False)
    assert_user_error(proc, message)
    proc = run_script("train_reader.py", "--model_name_or_path", trained + "/query_encoder", "--negative_passages", 1,
                      "--passages", duplicate, "--max_train_steps", 1, "--output_dir", tmp_path / "r", check=False)
    assert_user_error(proc, message)

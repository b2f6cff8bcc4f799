"""A reader trained for retrieval: negative passages hold no answer string, are drawn anew each epoch under the seed,
are ranked once (by the main process) for every process, and a run killed mid-way resumes to the same weights."""

import json
import os

import numpy as np

from conftest import SAMPLE, assert_same_weights, assert_user_error, run_killed_at_checkpoint, run_script
from test_distributed import run_ddp
from accelerate import Accelerator

from tolerance import assert_ranked_alike
from utils.reader.negative_passages import epoch_negatives, negative_depth, negative_pools
from utils.reader.passages import ranked_passages
from utils.files.squad import load_squad
from utils.files.answers import answer_patterns, holds_answer, normalized
from utils.files.corpus import load_passages


def test_negative_passages_hold_no_answer_and_are_not_the_questions_own_paragraph():
    examples, _ = load_squad(f"{SAMPLE}/train.json")
    passages = load_passages(f"{SAMPLE}/dpr_passages.jsonl")
    pools = negative_pools(examples, passages, ranked_passages(Accelerator(cpu=True), examples, passages,
                                                               negative_depth(2)), 2)
    assert sum(len(p) for p in pools) > 4 * len(examples)
    for ex, pool in zip(examples, pools):
        assert len(pool) <= 8 and len(set(pool)) == len(pool)
        for j in pool:
            assert passages[j]["text"] != ex["context"]
            assert not holds_answer(normalized(passages[j]["text"]), answer_patterns(ex["answers"]["text"]))


def test_each_epoch_draws_anew_and_the_same_under_the_seed():
    pools = [[3, 5, 7, 9], [1, 2], [], [4, 6, 8, 10]]
    draw = epoch_negatives(pools, 2, 100, seed=42)
    a, b = draw(0), draw(1)
    assert len(a) == len(b) == 6 and not np.array_equal(a, b)  # as many each epoch, not the same ones
    assert np.array_equal(a, epoch_negatives(pools, 2, 100, seed=42)(0))
    assert set(a[:2]) <= {100, 101, 102, 103} and set(a[2:4]) == {104, 105}  # windows numbered pool after pool


def tiny(model_dir, out, *extra):
    return ["--model_name_or_path", model_dir, "--output_dir", out, "--per_device_train_batch_size", 8,
            "--learning_rate", 1e-3, "--eval_before_training", "false", "--max_eval_samples", 8,
            "--negative_passages", 1, "--passages", f"{SAMPLE}/dpr_passages.jsonl", *extra]


def test_a_killed_run_with_negatives_resumes_to_the_same_weights(tiny_bert_dir, tmp_path):
    # 229 windows + 229 negatives per epoch: 58 batches of 8; killed in the second epoch, after its new draw
    args = ["--max_train_steps", 72, "--checkpointing_steps", 30, "--mixed_precision", "bf16"]
    ref = str(tmp_path / "ref")
    proc = run_script("train_reader.py", *tiny(tiny_bert_dir, ref, *args))
    assert "+ 1 negative passages per question per epoch" in proc.stderr
    results = json.load(open(os.path.join(ref, "eval_results.json")))
    assert results["updates"] == results["updates_planned"] == 72
    out = str(tmp_path / "killed")
    run_killed_at_checkpoint("train_reader.py", tiny(tiny_bert_dir, out, *args), out, step=60)
    run_script("train_reader.py", *tiny(tiny_bert_dir, out, *args, "--resume_from_checkpoint", "latest"))
    assert_same_weights(os.path.join(ref, "model.safetensors"), os.path.join(out, "model.safetensors"))


def test_an_index_is_the_retrievers_corpus_in_place_of_the_passages(tmp_path):
    import pytest

    from utils.errors import UserError
    from utils.index.config import RankedCorpusConfig
    from utils.reader.config import PassagesConfig

    corpus, retriever = f"{SAMPLE}/dpr_passages.jsonl", tmp_path / "retriever"
    retriever.mkdir()
    (retriever / "retriever_settings.json").write_text("{}")  # what the parse-time check of a retriever reads
    cases = [(dict(index=str(tmp_path)), 2, "--index is the --retriever's index"),
             (dict(index=str(tmp_path), passages=corpus, retriever=str(retriever)), 2, "not both"),
             (dict(index=str(tmp_path / "nowhere"), retriever=str(retriever)), 2, "nowhere: no such directory"),
             (dict(index=str(tmp_path), retriever=str(retriever)), 1, "--index is for")]
    for corpus_flags, passages_per_question, message in cases:
        with pytest.raises(UserError, match=message):
            PassagesConfig(passages_per_question=passages_per_question).check_corpus(
                RankedCorpusConfig(**corpus_flags))


def test_negatives_need_their_corpus_and_a_retriever_its_passages(tiny_bert_dir, tmp_path):
    proc = run_script("train_reader.py", "--model_name_or_path", tiny_bert_dir, "--output_dir", tmp_path / "o",
                      "--negative_passages", 1, check=False)
    assert_user_error(proc, "--negative_passages N needs --passages")
    proc = run_script("train_reader.py", "--model_name_or_path", tiny_bert_dir, "--output_dir", tmp_path / "o",
                      "--passages_per_question", 4, check=False)
    assert_user_error(proc, "--passages_per_question M needs --passages")
    proc = run_script("train_reader.py", "--model_name_or_path", tiny_bert_dir, "--output_dir", tmp_path / "o",
                      "--passages", f"{SAMPLE}/dpr_passages.jsonl", "--passages_per_question", 1, check=False)
    assert_user_error(proc, "--passages is for")
    retriever = tmp_path / "retriever"
    retriever.mkdir()
    (retriever / "retriever_settings.json").write_text("{}")  # what the parse-time check of a retriever reads
    proc = run_script("train_reader.py", "--model_name_or_path", tiny_bert_dir, "--output_dir", tmp_path / "o",
                      "--retriever", retriever, check=False)
    assert_user_error(proc, "--retriever ranks --passages for")
    proc = run_script("train_reader.py", "--model_name_or_path", tiny_bert_dir, "--output_dir", tmp_path / "o",
                      "--passages", f"{SAMPLE}/dpr_passages.jsonl", "--passages_per_question", 2, "--retriever",
                      tiny_bert_dir, check=False)
    assert_user_error(proc, f"--retriever {tiny_bert_dir}: not a retriever written by train_dpr.py")
    assert not os.path.exists(tmp_path / "o")


RANK_IN_TWO_PROCESSES = '''
import json, os, sys
sys.path.insert(0, {root!r})
from accelerate import Accelerator
from utils.retriever.retriever import ranking_for_run
from utils.files.corpus import load_passages
from utils.files.squad import load_squad
from utils.reader.negative_passages import negative_depth, negative_pools
from utils.reader.passages import ranked_passages
from utils.retriever.retriever import Retriever
from utils.search.bm25 import BM25

out, retriever_dir = sys.argv[1], sys.argv[2]
acc = Accelerator(cpu=True)
encoded, bm25_searches = [], []
encode, search = Retriever.encode_passages, BM25.search

def counted_encode(self, passages, progress=None):  # the corpus a process embeds
    encoded.append(len(passages))
    return encode(self, passages, progress)

def counted_search(self, *args, **kwargs):  # BM25 rankings
    bm25_searches.append(1)
    return search(self, *args, **kwargs)

Retriever.encode_passages, BM25.search = counted_encode, counted_search
examples, _ = load_squad({sample!r} + "/train.json")
corpus, rank = ranking_for_run(acc, retriever_dir, {sample!r} + "/dpr_passages.jsonl", None,
                               os.path.join(out, "run", "retriever_index"))
dense = ranked_passages(acc, examples, corpus, negative_depth(1), rank)
dense_pools = negative_pools(examples, corpus, dense, 1)
scores, ids = rank([ex["question"] for ex in examples], negative_depth(1))
bm25_searches.clear()  # the hybrid searched the index's BM25 above, on every process: its own share
bm25 = ranked_passages(acc, examples, load_passages({sample!r} + "/dpr_passages.jsonl"), negative_depth(1))
json.dump({{"encoded": encoded, "bm25_searches": len(bm25_searches), "dense": dense, "pools": dense_pools,
           "bm25": bm25, "scored": [list(zip(i.tolist(), s.tolist())) for s, i in zip(scores, ids)]}},
          open(os.path.join(out, f"rank{{acc.process_index}}.json"), "w"))
'''


def test_a_retrievers_ranking_is_searched_from_every_process_each_embedding_its_shard(tmp_path, trained_models):
    """2 processes: train_reader.py --retriever indexes the corpus from both processes, each embedding its own shard
    (no process embeds, or searches, the whole corpus alone: at 21M passages that is hours and tens of GB), and
    both search it, each its shards, for the same ranking, the one an in-memory index of the whole corpus gives.
    BM25's ranking is made by process 0 alone and shared."""
    from utils.retriever.retriever import Retriever

    script = tmp_path / "rank_in_two_processes.py"
    script.write_text(RANK_IN_TWO_PROCESSES.format(root=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                                   sample=SAMPLE))
    retriever_dir = trained_models[1]
    run_ddp(str(script), tmp_path, retriever_dir)
    first, second = (json.load(open(tmp_path / f"rank{r}.json")) for r in (0, 1))
    passages = load_passages(f"{SAMPLE}/dpr_passages.jsonl")
    assert 0 < sum(first["encoded"]) < len(passages) and 0 < sum(second["encoded"]) < len(passages)
    assert sum(first["encoded"]) + sum(second["encoded"]) == len(passages)
    examples, _ = load_squad(f"{SAMPLE}/train.json")
    retriever = Retriever(retriever_dir, device="cpu")
    hybrid = retriever.settings.hybrid_by_default
    whole = retriever.index(passages, bm25=hybrid, progress=False)  # one process, the corpus in memory

    scores, ids = retriever.rank(whole, [ex["question"] for ex in examples], negative_depth(1), hybrid)
    alone = [list(zip(i.tolist(), s.tolist())) for s, i in zip(scores, ids)]
    assert first["dense"] == second["dense"] and first["pools"] == second["pools"]
    assert first["dense"] == [[j for j, _ in row if j >= 0] for row in first["scored"]]
    assert_ranked_alike([[(j, s) for j, s in row if j >= 0] for row in first["scored"]],
                        [[(j, s) for j, s in row if j >= 0] for row in alone])
    assert first["pools"] == negative_pools(examples, passages, first["dense"], 1)
    assert (first["bm25_searches"], second["bm25_searches"]) == (1, 0) and first["bm25"] == second["bm25"]

"""A reader trained for retrieval: negative passages hold no answer string, are drawn anew each epoch under the seed,
are ranked once (by the main process) for every process, and a run killed mid-way resumes to the same weights."""

import json
import os

import numpy as np

from conftest import SAMPLE, assert_same_weights, assert_user_error, run_killed_at_checkpoint, run_script
from test_distributed import run_ddp
from utils.reader.negative_passages import epoch_negatives, negative_pools
from utils.files.squad import load_squad
from utils.files.answers import answer_patterns, holds_answer, normalized
from utils.files.corpus import load_passages


def test_negative_passages_hold_no_answer_and_are_not_the_questions_own_paragraph():
    examples, _ = load_squad(f"{SAMPLE}/train.json")
    passages = load_passages(f"{SAMPLE}/dpr_passages.jsonl")
    pools = negative_pools(examples, passages, 2)
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
    proc = run_script("train_reader.py", "--model_name_or_path", tiny_bert_dir, "--output_dir", tmp_path / "o",
                      "--retriever", tiny_bert_dir, check=False)
    assert_user_error(proc, "--retriever ranks --passages for")
    proc = run_script("train_reader.py", "--model_name_or_path", tiny_bert_dir, "--output_dir", tmp_path / "o",
                      "--passages", f"{SAMPLE}/dpr_passages.jsonl", "--passages_per_question", 2, "--retriever",
                      tiny_bert_dir, check=False)
    assert_user_error(proc, f"--retriever {tiny_bert_dir}: not a retriever trained by train_dpr.py")
    assert not os.path.exists(tmp_path / "o")


RANK_IN_TWO_PROCESSES = '''
import json, os, sys
sys.path.insert(0, {root!r})
from accelerate import Accelerator
from transformers import AutoTokenizer
from utils.files.corpus import load_passages
from utils.files.squad import load_squad
from utils.reader.config import WindowConfig
from utils.reader.negative_passages import with_negative_passages
from utils.reader.passages import ranked_passages
from utils.reader.windows_cache import tokenize_windows

out = sys.argv[1]
acc = Accelerator(cpu=True)
calls = []

def rank(passages, questions, depth):  # BM25's ranking, counted: what a trained retriever's encoder would cost
    calls.append(len(questions))
    return ranked_passages([{{"question": q}} for q in questions], passages, depth)

examples, _ = load_squad({sample!r} + "/train.json")
tok = AutoTokenizer.from_pretrained(sys.argv[2])
config = WindowConfig(max_seq_length=128, doc_stride=32, max_query_length=32, cache_dir=os.path.join(out, "cache"))
windows = tokenize_windows(acc, tok, examples, config, labels="answer")
together, epoch_items, pool = with_negative_passages(acc, tok, config, examples, windows,
                                                     load_passages({sample!r} + "/dpr_passages.jsonl"), 1, 42, rank)
json.dump({{"calls": calls, "pool": pool, "epoch0": epoch_items(0).tolist()}},
          open(os.path.join(out, f"rank{{acc.process_index}}.json"), "w"))
'''


def test_negative_pools_are_ranked_by_the_main_process_alone_and_shared(tmp_path, minilm_dir):
    """2 processes: the corpus is ranked once, by process 0 (a trained retriever's ranking loads its model and
    encodes the corpus: not work to repeat on every process), and both train on the same pools."""
    script = tmp_path / "rank_in_two_processes.py"
    script.write_text(RANK_IN_TWO_PROCESSES.format(root=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                                   sample=SAMPLE))
    run_ddp(str(script), tmp_path, minilm_dir)
    first, second = (json.load(open(tmp_path / f"rank{r}.json")) for r in (0, 1))
    assert len(first["calls"]) == 1 and second["calls"] == []
    assert first["pool"] == second["pool"] > 0 and first["epoch0"] == second["epoch0"]

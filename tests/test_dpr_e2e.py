"""train_dpr.py end to end: real subprocesses, real tokenizer, exported encoders loaded by their libraries."""

import json
import os

import pytest
import torch
from conftest import SAMPLE, assert_same_weights, assert_user_error, run_killed_at_checkpoint, run_script
from tolerance import assert_ranks_within

from utils.retriever.bi_encoder import BiEncoder, sentence_transformers_defaults


def tiny_args(model_dir, out, *extra):
    return ["--query_model_name_or_path", model_dir, "--passage_model_name_or_path", model_dir, "--output_dir", out,
            "--per_device_train_batch_size", 8, "--eval_before_training", "false", *extra]


def test_defaults_follow_the_starting_model(minilm_dir, tiny_bert_dir):
    assert sentence_transformers_defaults(minilm_dir) == ("mean", True)
    assert sentence_transformers_defaults(tiny_bert_dir) == (None, None)


def test_training_lowers_the_loss_and_exports_load_with_identical_embeddings(tiny_bert_dir, tmp_path):
    out = str(tmp_path / "run")
    proc = run_script("train_dpr.py", *tiny_args(tiny_bert_dir, out, "--max_train_steps", 30, "--logging_steps", 5,
                                              "--learning_rate", 5e-4, "--export_dpr", "--num_hard_negatives", 2))
    assert "pooling=cls similarity=dot temperature=1.0" in proc.stdout  # DPR convention for a plain BERT
    log = [json.loads(line) for line in open(os.path.join(out, "train_log.jsonl"))]
    assert log[-1]["loss"] < log[0]["loss"] - 0.3, log
    results = json.load(open(os.path.join(out, "eval_results.json")))
    assert {"top1", "top5", "top20", "top100", "mrr@10", "mean_rank", "in_batch_avg_rank", "bm25_top1", "bm25_mrr@10",
            "hybrid_top1", "hybrid_mrr@10"} <= set(results["metrics"])
    rankings = [json.loads(line) for line in open(os.path.join(out, "rankings.jsonl"))]
    assert len(rankings) == 44 and all(len(r["top20"]) == 20 for r in rankings)
    ranked = [(r["gold_rank"], r["bm25_gold_rank"], r["hybrid_gold_rank"]) for r in rankings]
    for kind, column in (("", 0), ("bm25_", 1), ("hybrid_", 2)):
        assert results["metrics"][f"{kind}top1"] == pytest.approx(100 * sum(r[column] == 1 for r in ranked) / 44)

    from sentence_transformers import SentenceTransformer
    from transformers import AutoModel, AutoTokenizer, DPRContextEncoder, DPRQuestionEncoder

    questions = ["Who designed the Harrowgate Lighthouse?", "How tall is the tower of the lighthouse at Corran?"]
    titles, texts = ["Harrowgate Lighthouse", "Orrin Valley"], ["It was designed by Matilda Reyes.", "A railway."]
    ours = BiEncoder.from_pretrained(f"{out}/query_encoder", f"{out}/passage_encoder", False, "cls", False).eval()
    tok = AutoTokenizer.from_pretrained(f"{out}/query_encoder")
    q_in = dict(tok(questions, padding=True, truncation=True, max_length=64, return_tensors="pt"))
    p_in = dict(tok(titles, texts, padding=True, truncation="only_second", max_length=256, return_tensors="pt"))
    with torch.no_grad():
        q_ours, p_ours = ours(query=q_in, passage=p_in)
        st_q = SentenceTransformer(f"{out}/query_encoder", device="cpu").encode(questions, convert_to_tensor=True)
        st_p = SentenceTransformer(f"{out}/passage_encoder", device="cpu").encode(
            [[a, b] for a, b in zip(titles, texts)], convert_to_tensor=True)
        hf_q = AutoModel.from_pretrained(f"{out}/query_encoder")(**q_in).last_hidden_state[:, 0]
        dpr_q = DPRQuestionEncoder.from_pretrained(f"{out}/dpr_question_encoder")(**q_in).pooler_output
        dpr_p = DPRContextEncoder.from_pretrained(f"{out}/dpr_context_encoder")(**p_in).pooler_output
    for theirs, mine in ((st_q, q_ours), (st_p, p_ours), (hf_q, q_ours), (dpr_q, q_ours), (dpr_p, p_ours)):
        torch.testing.assert_close(theirs.float(), mine, atol=1e-5, rtol=1e-4)


def test_window_sentences_rank_each_passage_by_its_best_sentence(tiny_bert_dir, tmp_path):
    """Training and refreshes use sentences; the evaluation's dense ranks, recomputed here from the saved encoders:
    every sentence of every corpus passage embedded with its title, a passage scored by its best sentence."""
    from transformers import AutoTokenizer

    from utils.files.corpus import load_passages, passage_key, unique_passages
    from utils.files.dpr import evaluation_corpus, load_dpr
    from utils.retriever.sentence_windows import sentence_windows, training_windows

    out = str(tmp_path / "run")
    proc = run_script("train_dpr.py", *tiny_args(tiny_bert_dir, out, "--max_train_steps", 6, "--learning_rate", 5e-4,
                                                 "--window_sentences", 1, "--refresh_negatives_every", 3))
    results = json.load(open(os.path.join(out, "eval_results.json")))
    assert results["window_sentences"] == 1 and len(results["negatives_refreshed"]) == 2  # epoch start, update 3
    train = load_dpr(f"{SAMPLE}/dpr_train.json")
    sentences, whole = training_windows(train, 1)
    pool = unique_passages(c for q in sentences
                           for c in q["positive_ctxs"] + q["hard_negative_ctxs"] + q["negative_ctxs"])
    assert len(pool) > 3 * len(unique_passages(c for q in train for c in q["positive_ctxs"]))
    assert proc.stderr.count(f"{len(pool)} passages encoded") == 2  # the refreshes mine sentences
    assert f"({whole} questions keep the whole passage" in proc.stderr

    dev = load_dpr(f"{SAMPLE}/dpr_dev.json")
    corpus, added = evaluation_corpus(dev, load_passages(f"{SAMPLE}/dpr_passages.jsonl"))
    assert added == 0
    windows, owner = sentence_windows(corpus, 1)
    assert len(windows) > 2 * len(corpus)
    model = BiEncoder.from_pretrained(f"{out}/query_encoder", f"{out}/passage_encoder", False, "cls", False).eval()
    tok = AutoTokenizer.from_pretrained(f"{out}/query_encoder")
    with torch.no_grad():
        q = model(query=dict(tok([d["question"] for d in dev], padding=True, truncation=True, max_length=64,
                                 return_tensors="pt")))[0]
        w = model(passage=dict(tok([x["title"] for x in windows], [x["text"] for x in windows], padding=True,
                                   truncation="only_second", max_length=256, return_tensors="pt")))[1]
    scores = torch.stack([(q @ w[owner == i].T).max(1).values for i in range(len(corpus))], dim=1).numpy()
    index = {passage_key(c): i for i, c in enumerate(corpus)}
    gold = [[index[passage_key(c)] for c in d["positive_ctxs"]] for d in dev]
    got = [json.loads(line)["gold_rank"] for line in open(os.path.join(out, "rankings.jsonl"))]
    # one padded batch here, length buckets in the run: the same ranks but where scores are a near-tie
    assert assert_ranks_within(got, scores, gold) < 1  # the tiny model's scores are close: a near-tie may move a rank


def test_minilm_mean_cosine_export_embeds_identically_in_sentence_transformers(minilm_dir, tmp_path):
    out = str(tmp_path / "minilm")
    proc = run_script("train_dpr.py", "--output_dir", out, "--max_train_steps", 2, "--mixed_precision", "bf16",
                      "--eval_before_training", "false", "--per_device_train_batch_size", 8, "--shared_encoder")
    assert "pooling=mean similarity=cosine temperature=0.05 shared" in proc.stdout
    from sentence_transformers import SentenceTransformer

    questions = ["Who founded the Fenwick Beekeepers' Association?"]
    ours = BiEncoder.from_pretrained(f"{out}/query_encoder", f"{out}/query_encoder", True, "mean", True).eval()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(f"{out}/query_encoder")
    with torch.no_grad():
        mine = ours(query=dict(tok(questions, return_tensors="pt")))[0]
        theirs = SentenceTransformer(f"{out}/query_encoder", device="cpu").encode(questions, convert_to_tensor=True)
    torch.testing.assert_close(theirs.float(), mine, atol=1e-5, rtol=1e-4)
    assert abs(mine.norm().item() - 1) < 1e-5


@pytest.mark.parametrize("extra", [[], ["--grad_cache_chunk_size", 3], ["--refresh_negatives_every", 7],
                                   ["--refresh_negatives_every", 5]],
                         ids=["plain", "grad_cache", "refresh_between_checkpoints", "refresh_at_checkpoint"])
def test_sigkilled_run_resumes_to_the_same_weights(tiny_bert_dir, tmp_path, extra):
    """Killed after checkpoint 10. With refreshed negatives every 7 updates the kill falls between two refreshes
    (7 and 14); every 5, right after the refresh that checkpoint 10 carries."""
    args = ["--max_train_steps", 30, "--checkpointing_steps", 5, "--mixed_precision", "bf16", *extra]
    ref = str(tmp_path / "ref")
    run_script("train_dpr.py", *tiny_args(tiny_bert_dir, ref, *args))
    out = str(tmp_path / "killed")
    run_killed_at_checkpoint("train_dpr.py", tiny_args(tiny_bert_dir, out, *args), out, step=10)
    run_script("train_dpr.py", *tiny_args(tiny_bert_dir, out, *args, "--resume_from_checkpoint", "latest"))
    for side in ("query_encoder", "passage_encoder"):
        assert_same_weights(f"{ref}/{side}/model.safetensors", f"{out}/{side}/model.safetensors")


@pytest.mark.parametrize("make_args, expected", [
    (lambda t: ["--train_file", f"{SAMPLE}/train.json", "--validation_file", f"{SAMPLE}/dpr_dev.json"],
     "train.json: this is SQuAD-format data, not DPR; convert it"),
    (lambda t: ["--train_file", str(t / "none.json"), "--validation_file", f"{SAMPLE}/dpr_dev.json"], "no such file"),
    (lambda t: ["--pooling", "mean", "--export_dpr"], "--export_dpr needs --pooling cls"),
    (lambda t: ["--mixed_precision", "fp16"], "fp16 mixed precision needs a GPU"),
    (lambda t: ["--metric_for_best_model", "top3"], "--metric_for_best_model top3: not a metric of this run; "
     "choose one of top1, top5, top20, top100, mrr@10, mean_rank, in_batch_avg_rank"),
    (lambda t: ["--metric_for_best_model", "hybrid_dense_weight"], "--metric_for_best_model hybrid_dense_weight: not"),
    (lambda t: ["--metric_for_best_model", "bm25_top1"], "--metric_for_best_model bm25_top1: not a metric"),
])
def test_bad_input_is_one_line_nonzero_exit_and_no_model(tmp_path, make_args, expected):
    out = tmp_path / "out"
    proc = run_script("train_dpr.py", "--output_dir", out, *make_args(tmp_path), check=False)
    assert_user_error(proc, expected)
    assert not (out / "query_encoder").exists()


def test_the_ranked_corpus_is_the_one_given(tiny_bert_dir, tmp_path):
    """The dev questions' hard negatives (needed for the in-batch rank) are not in --passages: they are encoded
    for the in-batch rank alone, and dense and BM25 rank exactly the passages given."""
    given = [json.loads(line) for line in open(f"{SAMPLE}/dpr_passages.jsonl")]
    given = [p for p in given if p["passage_id"].startswith(("Ansel", "The Orrin"))]
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(p) + "\n" for p in given))
    out = str(tmp_path / "run")
    run_script("train_dpr.py", *tiny_args(tiny_bert_dir, out, "--max_train_steps", 2, "--max_eval_samples", 10,
                                          "--train_file", f"{SAMPLE}/dpr_train.json", "--validation_file",
                                          f"{SAMPLE}/dpr_dev.json", "--passages", corpus, "--num_hard_negatives", 2))
    ids = {p["passage_id"] for p in given}
    rankings = [json.loads(line) for line in open(os.path.join(out, "rankings.jsonl"))]
    assert len(rankings) == 10 and all(set(r["top20"]) == ids for r in rankings)  # every given passage, nothing else
    results = json.load(open(os.path.join(out, "eval_results.json")))
    assert results["corpus_passages"] == len(ids) and results["metrics"]["in_batch_avg_rank"] >= 1
    assert all(r["gold_rank"] <= len(ids) and r["bm25_gold_rank"] <= len(ids) for r in rankings)


def test_a_lower_is_better_metric_keeps_the_lowest(tiny_bert_dir, tmp_path):
    """--metric_for_best_model mean_rank keeps the evaluation with the lowest mean rank (it kept the highest)."""
    import re

    out = str(tmp_path / "run")
    proc = run_script("train_dpr.py", *tiny_args(tiny_bert_dir, out, "--max_train_steps", 8, "--eval_steps", 1,
                                                 "--learning_rate", 1e-3, "--metric_for_best_model", "mean_rank"))
    ranks = {int(step): float(rank) for step, rank in
             re.findall(r"eval @ update (\d+): .*?mean_rank=([0-9.]+)", proc.stdout)}
    assert sorted(ranks) == list(range(1, 9)) and len(set(ranks.values())) > 2, ranks
    best = json.load(open(os.path.join(out, "eval_results.json")))["best_update"]
    assert ranks[best] == min(ranks.values()) and min(ranks.values()) < max(ranks.values())
    assert best == min(s for s, r in ranks.items() if r == min(ranks.values()))  # the first of equal ones

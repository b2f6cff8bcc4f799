"""A retriever taught by a reader (train_dpr.py --reader, utils.retriever.reader_targets): the target by hand from a
tiny reader's logits, the mixed loss by hand, the top passages a question's row takes, a run that resumes
bit-identically with its readings checkpointed, 2 processes = 1 (with GradCache and sentence windows), and bad
flags refused before anything is created."""

import json
import os
import types

import numpy as np
import pytest
import torch
from conftest import SAMPLE, assert_same_weights, assert_user_error, run_killed_at_checkpoint, run_script
from transformers import AutoModelForQuestionAnswering, AutoTokenizer

from utils.reader.decoding import decode_spans
from utils.reader.trained import Reader
from utils.retriever.config import LossConfig, ReaderDistillationConfig
from utils.retriever.dpr_task import DPRTask
from utils.retriever.loss import global_loss
from utils.retriever.reader_targets import passage_log_probability, top_passages

QUESTION = "Who designed the lighthouse?"
PASSAGES = ["The lighthouse was designed by Robert Stevenson in 1810.",
            "The harbour wall was rebuilt after the storm of 1799.",
            "Stevenson's sons designed lighthouses around the coast of Scotland."]


def softmax(x):
    e = np.exp(x - x.max())
    return e / e.sum()


def test_the_target_is_each_passages_share_of_the_readers_answer_probability_by_hand(shared_reader_dir):
    """Read together with shared normalization, the question's start logits over every passage's tokens and [CLS]
    are one softmax, and so are its end logits: a passage's target is its context tokens' start probability times
    their end probability, normalised over the passages (temperature 1), computed here from the model's own logits
    of each passage, one at a time, unpadded."""
    tok = AutoTokenizer.from_pretrained(shared_reader_dir)
    model = AutoModelForQuestionAnswering.from_pretrained(shared_reader_dir).eval()
    starts, ends, contexts = [], [], []
    with torch.no_grad():
        for text in PASSAGES:
            enc = tok(QUESTION, text, return_tensors="pt")
            out = model(**enc)
            starts.append(out.start_logits[0].double().numpy())
            ends.append(out.end_logits[0].double().numpy())
            contexts.append(np.array([s == 1 for s in enc.sequence_ids(0)]))
    z_start = sum(np.exp(s[c]).sum() + np.exp(s[0]) for s, c in zip(starts, contexts))
    z_end = sum(np.exp(e[c]).sum() + np.exp(e[0]) for e, c in zip(ends, contexts))
    joint = np.array([np.exp(s[c]).sum() / z_start * np.exp(e[c]).sum() / z_end
                      for s, e, c in zip(starts, ends, contexts)])
    by_hand = joint / joint.sum()

    decoded = Reader(shared_reader_dir, device="cpu", mixed_precision="no").spans(
        [{"id": str(i), "question": QUESTION, "context": t} for i, t in enumerate(PASSAGES)])
    scores = np.array([passage_log_probability(decoded[str(i)]) for i in range(len(PASSAGES))])
    np.testing.assert_allclose(softmax(scores), by_hand, rtol=1e-5)


def test_a_passage_the_reader_rules_out_keeps_a_finite_target_from_its_context_tokens():
    """Where the no-answer holds all but e^-40 of a window's mass, log(e^lse - e^null) is lost to float64 (it was
    -inf, and a -inf reading is taken for no passage: left out of the KL, so the retriever was never taught to rank
    such a passage lower). The score is the log-sum-exp over the context tokens themselves, by hand."""
    offsets = [None, None, (0, 3), (4, 9), (10, 15), None]  # [CLS], a question token, 3 context tokens, [SEP]
    start, end = np.array([40.0, -5.0, 0.0, -1.0, -2.0, -5.0]), np.array([38.0, -5.0, -3.0, 0.5, -1.0, -5.0])
    reading = decode_spans(["q"], ["q"], [offsets], [start], [end], contexts={"q": "abc defgh ijklm"},
                           shared_norm=True)["q"]
    by_hand = np.log(np.exp(start[2:5]).sum()) + np.log(np.exp(end[2:5]).sum())
    assert np.isfinite(passage_log_probability(reading))
    np.testing.assert_allclose(passage_log_probability(reading), by_hand, rtol=1e-12)


def test_a_questions_row_takes_its_first_distinct_passages_by_their_best_window():
    # units 0-1 are windows of passage 10, 2 of 11, 3-4 of 12, 5 of 13
    keys = np.array([10, 10, 11, 12, 12, 13])
    ranked = np.array([[1, 0, 3, 2, 5, 4], [4, 3, 1, 0, -1, -1], [5, 5, -1, -1, -1, -1]])
    units, valid = top_passages(ranked, keys, 3)
    assert units.tolist() == [[1, 3, 2], [4, 1, 4], [5, 5, 5]]  # short rows repeat their first, not valid
    assert valid.tolist() == [[True, True, True], [True, True, False], [True, False, False]]


def test_the_loss_mixes_the_in_batch_loss_and_the_kl_to_the_reader_by_hand(shared_reader_dir):
    """(1 - w) x the in-batch loss over each question's positive and negatives + w x the mean over questions of
    KL(softmax(reader / T) || softmax(q . p / temperature)) over its top passages, a -inf reading left out."""
    torch.manual_seed(0)
    n_q, own, top, dim, temperature, w, t = 3, 2, 3, 8, 0.5, 0.3, 2.0
    q, p = torch.randn(n_q, dim, dtype=torch.float64), torch.randn(n_q * (own + top), dim, dtype=torch.float64)
    keys = torch.arange(n_q * (own + top))
    reader_scores = torch.tensor([[-1.0, -3.0, -2.0], [0.5, -np.inf, -0.5], [-4.0, -4.0, 1.0]], dtype=torch.float64)
    task = DPRTask.__new__(DPRTask)
    task.data = types.SimpleNamespace(own=own)
    task.loss = LossConfig(temperature=temperature, grad_cache_chunk_size=None)
    task.reader = ReaderDistillationConfig(shared_reader_dir, top, w, t)
    for_backward, logged = task._loss(q, p, keys, reader_scores)

    rows = p.view(n_q, own + top, dim).numpy()
    kls = []
    for i in range(n_q):
        ok = np.isfinite(reader_scores[i].numpy())
        target = softmax(reader_scores[i].numpy()[ok] / t)
        student = softmax(rows[i, own:][ok] @ q[i].numpy() / temperature)
        kls.append((target * (np.log(target) - np.log(student))).sum())
    in_batch, _ = global_loss(q, torch.from_numpy(rows[:, :own].reshape(-1, dim)),
                              keys.view(n_q, own + top)[:, :own].reshape(-1), temperature)
    expected = (1 - w) * in_batch.item() + w * np.mean(kls)
    assert logged.item() == pytest.approx(expected, rel=1e-6)
    assert for_backward.item() == pytest.approx(expected, rel=1e-6)  # one process: nothing to scale


def reader_args(model, reader, out, per_device, *extra):
    return ["--query_model_name_or_path", model, "--passage_model_name_or_path", model, "--output_dir", out,
            "--per_device_train_batch_size", per_device, "--learning_rate", 5e-4, "--logging_steps", 1,
            "--per_device_eval_batch_size", 5, "--num_hard_negatives", 1, "--eval_before_training", "false",
            "--reader", reader, "--distill_passages", 3, *extra]


def test_a_taught_run_resumes_to_the_same_weights_on_its_checkpointed_readings(tiny_bert_dir, shared_reader_dir,
                                                                               tmp_path):
    """Killed after checkpoint 10, between refreshes (every 7 updates): the resumed run trains on the readings the
    interrupted one checkpointed, and reads only what entered a question's top passages since."""
    args = ["--max_train_steps", 20, "--checkpointing_steps", 5, "--refresh_negatives_every", 7,
            "--mixed_precision", "bf16"]
    ref, out = str(tmp_path / "ref"), str(tmp_path / "killed")
    run_script("train_dpr.py", *reader_args(tiny_bert_dir, shared_reader_dir, ref, 8, *args))
    run_killed_at_checkpoint("train_dpr.py", reader_args(tiny_bert_dir, shared_reader_dir, out, 8, *args), out,
                             step=10)
    run_script("train_dpr.py", *reader_args(tiny_bert_dir, shared_reader_dir, out, 8, *args,
                                            "--resume_from_checkpoint", "latest"))
    for side in ("query_encoder", "passage_encoder"):
        assert_same_weights(f"{ref}/{side}/model.safetensors", f"{out}/{side}/model.safetensors")
    results = json.load(open(f"{ref}/eval_results.json"))
    assert results["reader"]["model"] == shared_reader_dir and results["reader"]["passages"] == 3
    refreshes = results["negatives_refreshed"]
    assert refreshes[0]["read"] > 0 and all("read" in r for r in refreshes)
    resumed = json.load(open(f"{out}/eval_results.json"))["negatives_refreshed"]
    what = lambda rs: [(r["when"], r["fingerprint"], r["read"]) for r in rs]  # noqa: E731 (not the seconds)
    assert what(resumed) == what(refreshes)
    # a resume that changes what teaches the run (the reader, its passages) is refused in one line naming the flag,
    # before anything is loaded: not a crash in Accelerate's load_state, nor old readings mixed with new ones
    more = ["--resume_from_checkpoint", "latest", "--max_train_steps", 25]
    taught = reader_args(tiny_bert_dir, shared_reader_dir, out, 8, *args, *more)
    proc = run_script("train_dpr.py", *taught, "--distill_passages", 4, check=False)
    assert_user_error(proc, "--distill_passages: the checkpoint's run had 3, this run has 4")
    untaught = [a for a in taught if a not in ("--reader", shared_reader_dir, "--distill_passages", 3)]
    assert_user_error(run_script("train_dpr.py", *untaught, check=False), "--reader: the checkpoint's run had")


def test_two_processes_are_taught_as_one_with_grad_cache_on_sentence_windows(tiny_bert_no_dropout_dir,
                                                                            shared_reader_dir, tmp_path):
    """Each process reads its chunks of the (question, passage) pairs and every process gets every reading: the
    losses and weights of 2 processes x 8 in GradCache chunks of 3 are those of 1 x 16 at once, on sentence windows
    (the reader reads their passages; dropout off; refreshes at epoch 0 and update 2)."""
    from test_distributed import TOL, assert_updates_close, log, run_ddp

    single, ddp = str(tmp_path / "single"), str(tmp_path / "ddp")
    args = ["--max_train_steps", 4, "--refresh_negatives_every", 2, "--window_sentences", 1]
    run_script("train_dpr.py", *reader_args(tiny_bert_no_dropout_dir, shared_reader_dir, single, 16, *args),
               env={"OMP_NUM_THREADS": "1"})
    run_ddp("train_dpr.py", *reader_args(tiny_bert_no_dropout_dir, shared_reader_dir, ddp, 8, *args,
                                         "--grad_cache_chunk_size", 3))
    torch.testing.assert_close([r["loss"] for r in log(ddp)], [r["loss"] for r in log(single)], **TOL)
    for side in ("query_encoder", "passage_encoder"):
        assert_updates_close(f"{tiny_bert_no_dropout_dir}/model.safetensors", f"{single}/{side}/model.safetensors",
                             f"{ddp}/{side}/model.safetensors")
    reads = [[r["read"] for r in json.load(open(f"{d}/eval_results.json"))["negatives_refreshed"]]
             for d in (single, ddp)]
    assert reads[0] == reads[1] and reads[0][0] > 0


@pytest.fixture(scope="module")
def window_reader_dir(tiny_bert_dir, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("window-reader") / "out")
    run_script("train_reader.py", "--model_name_or_path", tiny_bert_dir, "--output_dir", out, "--max_train_steps", 2,
               "--per_device_train_batch_size", 4, "--eval_before_training", "false")
    return out


@pytest.mark.parametrize("make_args, expected", [
    (lambda r, w: ["--reader", r], "--reader needs --refresh_negatives_every N"),
    (lambda r, w: ["--reader", w, "--refresh_negatives_every", 2], "it was trained a window at a time"),
    (lambda r, w: ["--reader", r, "--refresh_negatives_every", 2, "--distill_passages", 1],
     "--distill_passages 1: give at least 2"),
    (lambda r, w: ["--reader", r, "--refresh_negatives_every", 2, "--distillation_weight", 0],
     "--distillation_weight 0.0: give a share in (0, 1]"),
    (lambda r, w: ["--distillation_temperature", 2], "--distill_passages, --distillation_weight and "
     "--distillation_temperature need --reader"),
    (lambda r, w: ["--reader", f"{SAMPLE}", "--refresh_negatives_every", 2], "not a model directory"),
])
def test_bad_reader_flags_are_one_line_errors_before_anything_is_created(tiny_bert_dir, shared_reader_dir,
                                                                        window_reader_dir, tmp_path, make_args,
                                                                        expected):
    out = tmp_path / "out"
    proc = run_script("train_dpr.py", "--query_model_name_or_path", tiny_bert_dir, "--passage_model_name_or_path",
                      tiny_bert_dir, "--output_dir", out, *make_args(shared_reader_dir, window_reader_dir),
                      check=False)
    assert_user_error(proc, expected)
    assert not os.path.exists(out)


def test_the_loop_a_reader_trained_on_a_retrievers_passages_then_a_retriever_from_a_taught_one(
        trained_models, tiny_bert_no_dropout_dir, shared_reader_dir, tmp_path):
    """FiD-KD's rounds: train_reader.py --retriever ranks the passages a training question reads with the retriever
    (as the QA system ranks with it, not BM25), and train_dpr.py starts from a taught retriever's encoders."""
    from accelerate import Accelerator

    from utils.files.corpus import load_passages
    from utils.reader.passages import ranked_passages
    from utils.retriever.retriever import ranking_for_run
    from utils.retriever.retriever import Retriever

    _, retriever_dir = trained_models
    passages = load_passages(f"{SAMPLE}/dpr_passages.jsonl")
    questions = [q["question"] for q in json.load(open(f"{SAMPLE}/dpr_dev.json"))[:8]]
    examples = [{"question": q} for q in questions]
    accelerator = Accelerator(cpu=True)
    corpus, rank = ranking_for_run(accelerator, retriever_dir, f"{SAMPLE}/dpr_passages.jsonl", None,
                                   str(tmp_path / "retriever_index"))
    assert [corpus[j] for j in range(len(corpus))] == passages  # the corpus as its index holds it
    ranked = ranked_passages(accelerator, examples, corpus, 5, rank)
    retriever = Retriever(retriever_dir, device="cpu")
    hybrid = retriever.settings.hybrid_by_default
    hits = retriever.search(retriever.index(passages, bm25=hybrid, progress=False), questions, 5, hybrid)
    position = {p["passage_id"]: j for j, p in enumerate(passages)}
    assert ranked == [[position[h["passage_id"]] for h in row] for row in hits]
    assert ranked != ranked_passages(accelerator, examples, passages, 5)  # not BM25's

    taught, reader = str(tmp_path / "taught"), str(tmp_path / "reader")
    run_script("train_dpr.py", *reader_args(tiny_bert_no_dropout_dir, shared_reader_dir, taught, 8,
                                            "--max_train_steps", 2, "--refresh_negatives_every", 2))
    index = str(tmp_path / "index")  # the retriever's prebuilt index, searched instead of the corpus re-embedded
    run_script("index_corpus.py", "--retriever", taught, "--passages", f"{SAMPLE}/dpr_passages.jsonl",
               "--output_dir", index)
    run_script("train_reader.py", "--model_name_or_path", shared_reader_dir, "--output_dir", reader,
               "--per_device_train_batch_size", 4, "--max_train_steps", 2, "--passages_per_question", 3,
               "--index", index, "--retriever", taught, "--eval_before_training", "false")
    assert not os.path.exists(f"{reader}/retriever_index")
    again = str(tmp_path / "again")
    run_script("train_dpr.py", *reader_args(f"{taught}/query_encoder", reader, again, 8, "--max_train_steps", 2,
                                            "--refresh_negatives_every", 2, "--passage_model_name_or_path",
                                            f"{taught}/passage_encoder"))
    assert json.load(open(f"{again}/eval_results.json"))["reader"]["model"] == reader

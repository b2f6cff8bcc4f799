"""The reader trained with shared normalization: one softmax per question over all the windows of all its passages
(the loss computed by hand), one no-answer per question, the windows and their labels from real tokenisation, the
reading rule that follows, and the training run itself: resumed and on 2 processes it trains as uninterrupted and
on 1."""

import json
import math
import os

import numpy as np
import pytest
import torch
from conftest import SAMPLE, assert_same_weights, run_killed_at_checkpoint, run_script

from utils.reader.decoding import decode_spans
from utils.reader.passages import drawn
from utils.reader.shared_norm import group_batch, shared_norm_loss
from utils.reader.windows import prepare_windows
from utils.files.answers import answer_spans
from utils.system.answer import answer, combine


def lse(x):
    x = np.asarray(x, dtype=np.float64)
    return x.max() + np.log(np.exp(x - x.max()).sum())


def test_a_questions_loss_is_one_softmax_over_all_its_windows_computed_by_hand():
    torch.manual_seed(0)
    starts, ends = torch.randn(3, 6), torch.randn(3, 6)
    # question 0 reads windows 0 and 1 (its answer starts at 2 of window 1, ends at 3), question 1 window 2 (no answer)
    allowed = torch.tensor([[1, 0, 1, 1, 1, 0], [1, 0, 0, 1, 1, 1], [1, 1, 1, 1, 0, 0]], dtype=torch.bool)
    start_target, end_target = torch.zeros(3, 6, dtype=torch.bool), torch.zeros(3, 6, dtype=torch.bool)
    start_target[1, 3], end_target[1, 4] = True, True
    start_target[2, 0], end_target[2, 0] = True, True
    batch = {"group": torch.tensor([0, 0, 1]), "allowed": allowed, "start_target": start_target,
             "end_target": end_target}
    loss = shared_norm_loss(starts, ends, batch)

    def question(logits, rows, target):
        every = [logits[r, c].item() for r in rows for c in range(6) if allowed[r, c]]
        return lse(every) - lse([logits[r, c].item() for r, c in target])

    by_hand = (question(starts, [0, 1], [(1, 3)]) + question(ends, [0, 1], [(1, 4)])
               + question(starts, [2], [(2, 0)]) + question(ends, [2], [(2, 0)])) / 4
    assert loss.item() == pytest.approx(by_hand, rel=1e-6)


def test_an_unanswerable_question_has_one_no_answer_over_all_its_windows():
    """Its target is every window's [CLS] together: the loss is -log of their summed probability, not a sum of
    per-window losses (which would ask every window to be sure on its own)."""
    starts = torch.tensor([[2.0, 0.5, -1.0], [0.0, 1.0, 3.0]])
    ends = torch.tensor([[1.0, 0.0, 0.0], [-1.0, 2.0, 0.5]])
    cls = torch.zeros(2, 3, dtype=torch.bool)
    cls[:, 0] = True
    batch = {"group": torch.tensor([0, 0]), "allowed": torch.ones(2, 3, dtype=torch.bool), "start_target": cls,
             "end_target": cls}
    p_start = np.exp(lse([2.0, 0.0]) - lse(starts.flatten().tolist()))
    p_end = np.exp(lse([1.0, -1.0]) - lse(ends.flatten().tolist()))
    assert shared_norm_loss(starts, ends, batch).item() == pytest.approx(-(np.log(p_start) + np.log(p_end)) / 2)


def test_windows_label_every_occurrence_and_a_question_without_a_visible_answer_trains_towards_no_answer(tokenizer):
    context = "Ada built a loom. Later Ada sold the loom to a mill in Dunhallow."
    spans = answer_spans(context, ["Ada", "loom"])
    assert spans == [(0, 3), (12, 16), (24, 27), (37, 41)]
    # whole tokens of the normalised text only, as the one matcher finds them: not "Adams", "Ada's", "loom-makers"
    assert answer_spans("Adams and Ada's loom-makers, loom, Ada", ["Ada", "loom"]) == [(29, 33), (35, 38)]
    batch = {"question": ["Who built it?", "Who built it?"], "context": [context, "A railway crosses the valley."],
             "spans": [spans, []], "pair": [0, 1]}
    enc = prepare_windows(batch, tokenizer, 64, 16, 16, labels="spans")
    windows = [{k: enc[k][i] for k in enc} for i in range(len(enc["input_ids"]))]
    assert [w["pair"] for w in windows] == [0, 1]
    labelled = [tokenizer.decode(windows[0]["input_ids"][s:e + 1]) for s, e in zip(windows[0]["starts"],
                                                                                   windows[0]["ends"])]
    assert labelled == ["ada", "loom", "ada", "loom"] and windows[1]["starts"] == []
    b = group_batch(windows, [0, 0], [True], tokenizer.pad_token_id)
    assert b["start_target"][0].sum() == 4 and not b["start_target"][1].any()  # the negative passage: no target
    assert b["allowed"][1, 0] and not b["allowed"][1, 1]  # its [CLS] is a choice, the question tokens are not
    b = group_batch(windows[1:], [0], [True], tokenizer.pad_token_id)  # the answer in none of the windows read
    assert b["start_target"][0, 0] and b["start_target"][0].sum() == 1


def test_the_draw_is_a_function_of_seed_epoch_and_question():
    pools = [[{"passage": j, "spans": []} for j in range(12)] for _ in range(3)]
    assert drawn(pools, 3, 7, 0, 1) == drawn(pools, 3, 7, 0, 1)
    assert drawn(pools, 3, 7, 0, 1) != drawn(pools, 3, 7, 1, 1) or drawn(pools, 3, 7, 0, 1) != drawn(pools, 3, 7, 2, 1)
    assert len(set(drawn(pools, 3, 7, 4, 2))) == 3 and drawn([[]], 3, 7, 0, 0) == []


def test_the_no_answer_of_a_shared_reader_is_one_over_its_windows_and_passages():
    offsets = [None, (0, 3), (4, 9), (10, 12)]
    s = [np.array([1.0, 0.5, 2.0, 0.1]), np.array([0.2, 1.5, 0.3, 0.0])]
    e = [np.array([0.5, 0.2, 1.0, 3.0]), np.array([-1.0, 0.0, 2.5, 0.4])]
    one = decode_spans(["x"], ["x"], [offsets], s[:1], e[:1], contexts={"x": "Ada built a loom"})["x"]
    shared_one = decode_spans(["x"], ["x"], [offsets], s[:1], e[:1], contexts={"x": "Ada built a loom"},
                              shared_norm=True)["x"]
    assert one["null_score"] == shared_one["null_score"] == 1.5  # one window: the same rule either way
    two = decode_spans(["x"], ["x", "x"], [offsets, offsets], s, e, contexts={"x": "Ada built a loom"},
                       shared_norm=True)
    assert two["x"]["null_score"] == pytest.approx(lse([1.0, 0.2]) + lse([0.5, -1.0]))
    # across passages: the log-sum-exp over every passage's windows, and the probability of no answer
    a = {"passage_id": "a", "text": "x", "score": 3.0, "null_score": 0, "null_minus_best": 0, "null_start": 0.0,
         "null_end": 1.0, "lse_start": 2.0, "lse_end": 2.5}
    b = {**a, "passage_id": "b", "score": 4.0, "null_start": -1.0, "null_end": 0.0, "lse_start": 1.0, "lse_end": 1.5}
    c = combine([a, b], shared_norm=True)
    assert c["passage_id"] == "b"
    assert c["null_minus_best"] == pytest.approx(lse([0.0, -1.0]) + lse([1.0, 0.0]) - 4.0)
    want = (math.exp(lse([0.0, -1.0]) - lse([2.0, 1.0])) + math.exp(lse([1.0, 0.0]) - lse([2.5, 1.5]))) / 2
    assert c["no_answer_probability"] == pytest.approx(want)
    assert combine([a, b])["null_minus_best"] == 0  # a reader trained a paragraph at a time keeps its rule


def test_a_span_held_by_several_windows_is_read_as_trained_its_probability_summed_over_them():
    """The loss gives a span the start probability of its first token summed over the windows that hold it whole,
    and the end probability likewise, as it sums the no-answer over every window's [CLS]: the span's score is the
    log-sum-exp of its start logits over those windows plus that of its end logits. Scored by its best window
    instead, against a no-answer summed over the windows, an answer in the overlap of two windows loses 2 ln 2 (the
    old rule abstains here; the trained one answers)."""
    context = "Ada built a loom in 1823 at Dunhallow."
    # [CLS], a question token, five context tokens, [SEP]: window 1 reads "Ada built a loom in", window 2 (stride)
    # "loom in 1823 at Dunhallow."; "loom" (12, 16) is token 5 of the first and token 2 of the second
    first = [None, None, (0, 3), (4, 9), (10, 11), (12, 16), (17, 19), None]
    second = [None, None, (12, 16), (17, 19), (20, 24), (25, 27), (28, 38), None]

    def window(peaks):
        x = np.full(8, -5.0)
        for i, v in peaks.items():
            x[i] = v
        return x

    starts = [window({0: 0.5, 5: 2.0}), window({0: 0.5, 2: 0.0, 4: 1.0})]
    ends = [window({0: 0.5, 5: 0.0}), window({0: 0.5, 2: 2.0, 4: -1.0})]
    read = decode_spans(["x"], ["x", "x"], [first, second], starts, ends, contexts={"x": context},
                        shared_norm=True)["x"]
    null = 2 * 0.5 + 2 * math.log(2)  # both windows' [CLS], start and end
    loom = 2 * math.log(math.exp(2.0) + math.exp(0.0))  # log(e^2 + e^0) for the starts, the same for the ends
    assert (read["text"], read["nbest"][0]["start"], read["nbest"][0]["end"]) == ("loom", 12, 16)
    assert read["score"] == pytest.approx(loom, rel=1e-12) and read["null_score"] == pytest.approx(null, rel=1e-12)
    assert read["null_minus_best"] == pytest.approx(null - loom, rel=1e-12) and read["null_minus_best"] < 0
    assert null - max(2.0 + 0.0, 0.0 + 2.0) > 0  # the best window's score: the old rule abstained
    # a span in one window only keeps its start + end logit
    assert {x["text"]: x["score"] for x in read["nbest"]}["1823"] == 1.0 + -1.0
    # the QA system's rule over this one passage says what the reader says
    c = combine([{"passage_id": "p", **read}], shared_norm=True)
    assert c["text"] == "loom" and c["null_minus_best"] == pytest.approx(read["null_minus_best"], rel=1e-12)
    assert answer(c, 0.0) == "loom"
    # a reader trained a window at a time keeps its best window and its least sure [CLS]
    window_rule = decode_spans(["x"], ["x", "x"], [first, second], starts, ends, contexts={"x": context})["x"]
    assert (window_rule["score"], window_rule["null_score"]) == (2.0, 1.0)


def test_questions_are_grouped_by_the_longest_window_they_read_in_the_epoch(tokenizer, tmp_path):
    from accelerate import Accelerator

    from utils.files.corpus import load_passages
    from utils.files.squad import load_squad
    from utils.reader.config import WindowConfig
    from utils.reader.groups import QuestionGroups

    examples, _ = load_squad(f"{SAMPLE}/train.json")
    windows = WindowConfig(max_seq_length=256, doc_stride=32, max_query_length=32, cache_dir=str(tmp_path))
    passages = load_passages(f"{SAMPLE}/dpr_passages.jsonl")
    groups = QuestionGroups(Accelerator(cpu=True), tokenizer, windows, examples, passages, passages_per_question=2,
                            seed=0)
    for epoch in range(2):
        want = [max(len(groups.windows[r]["input_ids"]) for r in groups.rows(q, epoch)) for q in range(len(groups))]
        assert groups.lengths(epoch).tolist() == want
    # the passages drawn change with the epoch, and so does what pads a batch of them
    assert groups.lengths(0).tolist() != groups.lengths(1).tolist()


def grouped_args(model, out, per_device, *extra):
    return ["--model_name_or_path", model, "--output_dir", out, "--per_device_train_batch_size", per_device,
            "--learning_rate", 1e-3, "--max_train_steps", 6, "--logging_steps", 1, "--group_by_length", "false",
            "--per_device_eval_batch_size", 5, "--passages_per_question", 3, "--passages",
            f"{SAMPLE}/dpr_passages.jsonl", "--eval_before_training", "false", *extra]


def test_a_grouped_run_records_its_rule_and_resumes_to_the_same_weights(tiny_bert_dir, tmp_path):
    ref, killed = str(tmp_path / "ref"), str(tmp_path / "killed")
    # killed after update 2: the resumed run redraws nothing it already drew, and groups by the same lengths
    args = ["--checkpointing_steps", 2, "--group_by_length", "true"]
    run_script("train_reader.py", *grouped_args(tiny_bert_dir, ref, 4, *args))
    settings = json.load(open(os.path.join(ref, "reader_settings.json")))
    assert (settings["normalization"], settings["passages_per_question"]) == ("question", 3)
    results = json.load(open(os.path.join(ref, "eval_results.json")))
    assert "train_questions_per_second" in results
    run_killed_at_checkpoint("train_reader.py", grouped_args(tiny_bert_dir, killed, 4, *args), killed, step=2)
    run_script("train_reader.py", *grouped_args(tiny_bert_dir, killed, 4, *args, "--resume_from_checkpoint", "latest"))
    assert_same_weights(os.path.join(ref, "model.safetensors"), os.path.join(killed, "model.safetensors"))


def test_two_processes_train_a_grouped_reader_as_one(tiny_bert_no_dropout_dir, tmp_path):
    from test_distributed import READER_INVARIANT, TOL, assert_weights_close, log, run_ddp

    single, ddp = str(tmp_path / "single"), str(tmp_path / "ddp")
    run_script("train_reader.py", *grouped_args(tiny_bert_no_dropout_dir, single, 4), env={"OMP_NUM_THREADS": "1"})
    proc = run_ddp("train_reader.py", *grouped_args(tiny_bert_no_dropout_dir, ddp, 2))
    assert "= 4 per update" in proc.stdout
    torch.testing.assert_close([r["loss"] for r in log(ddp)], [r["loss"] for r in log(single)], **TOL)
    assert_weights_close(f"{single}/model.safetensors", f"{ddp}/model.safetensors", READER_INVARIANT)

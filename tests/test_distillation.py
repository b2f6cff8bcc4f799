"""A reader taught by a teacher (train_reader.py --teacher, utils.reader.distillation): the KL by hand, a teacher
equal to the student adding exactly nothing to the labels' share, a run with a teacher that resumes bit-identically
and trains on 2 processes as on 1, the teacher recorded, a mismatched teacher refused before anything is created,
and a student started from the first layers of a model (--num_hidden_layers)."""

import json
import os
import types

import numpy as np
import pytest
import torch
from accelerate import Accelerator
from conftest import SAMPLE, assert_same_weights, assert_user_error, run_killed_at_checkpoint, run_script
from safetensors import safe_open
from transformers import AutoModelForQuestionAnswering, AutoTokenizer

from utils.reader.config import DistillationConfig
from utils.reader.distillation import Teacher, check_teacher, distillation_kl, weights_hash
from utils.reader.reader_task import ReaderTask, SharedNormReaderTask
from utils.reader.shared_norm import shared_norm_loss
from utils.reader.trained import ReaderSettings
from utils.reader.windows import prepare_windows
from utils.runtime.batching import pad_batch


def softmax(x):
    e = np.exp(x - x.max())
    return e / e.sum()


def kl(p_logits, q_logits, temperature):
    p, q = softmax(np.asarray(p_logits) / temperature), softmax(np.asarray(q_logits) / temperature)
    return float((p * (np.log(p) - np.log(q))).sum())


def test_the_kl_is_the_teachers_over_the_students_per_question_or_per_window_computed_by_hand():
    torch.manual_seed(0)
    student, teacher = torch.randn(3, 5), torch.randn(3, 5) * 2
    allowed = torch.tensor([[1, 1, 1, 0, 0], [1, 0, 1, 1, 1], [1, 1, 1, 1, 0]], dtype=torch.bool)
    s, t, a, temperature = student.numpy().astype(np.float64), teacher.numpy().astype(np.float64), allowed.numpy(), 2.0
    # per question: question 0 reads windows 0 and 1 (one distribution over both), question 1 window 2
    q0 = kl(np.concatenate([t[0][a[0]], t[1][a[1]]]), np.concatenate([s[0][a[0]], s[1][a[1]]]), temperature)
    q1 = kl(t[2][a[2]], s[2][a[2]], temperature)
    got = distillation_kl(student, teacher, allowed, temperature, torch.tensor([0, 0, 1]))
    assert got.item() == pytest.approx((q0 + q1) / 2, rel=1e-5)
    per_window = np.mean([kl(t[i][a[i]], s[i][a[i]], temperature) for i in range(3)])
    assert distillation_kl(student, teacher, allowed, temperature).item() == pytest.approx(per_window, rel=1e-5)
    assert distillation_kl(student, student, allowed, temperature).item() == 0.0
    # at any temperature the masked positions stay out (masked after scaling, not before)
    hot = 1e4
    assert distillation_kl(student, teacher * hot, allowed, hot).item() == pytest.approx(
        np.mean([kl(t[i][a[i]] * hot, s[i][a[i]], hot) for i in range(3)]), rel=1e-4)


@pytest.fixture(scope="module")
def qa_dir(tiny_bert_no_dropout_dir, tmp_path_factory):
    """The tiny BERT with a question-answering head: a reader as far as a teacher needs (its head untrained)."""
    path = str(tmp_path_factory.mktemp("qa"))
    torch.manual_seed(1)
    AutoModelForQuestionAnswering.from_pretrained(tiny_bert_no_dropout_dir).save_pretrained(path)
    AutoTokenizer.from_pretrained(tiny_bert_no_dropout_dir).save_pretrained(path)
    return path


def test_a_teacher_equal_to_the_student_leaves_exactly_the_labels_share_of_the_loss(qa_dir):
    teacher = Teacher(Accelerator(cpu=True), DistillationConfig(qa_dir, distillation_weight=0.3))
    student = AutoModelForQuestionAnswering.from_pretrained(qa_dir).eval()
    n, width = 3, 10
    torch.manual_seed(0)
    batch = {"input_ids": torch.randint(5, 100, (n, width)), "attention_mask": torch.ones(n, width, dtype=torch.long),
             "group": torch.tensor([0, 0, 1]), "allowed": torch.ones(n, width, dtype=torch.bool),
             "start_target": torch.zeros(n, width, dtype=torch.bool),
             "end_target": torch.zeros(n, width, dtype=torch.bool)}
    batch["start_target"][0, 2] = batch["end_target"][0, 4] = \
        batch["start_target"][2, 0] = batch["end_target"][2, 0] = 1
    loss = SharedNormReaderTask.compute_loss(types.SimpleNamespace(teacher=teacher), student, batch)
    out = student(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    assert torch.equal(loss, 0.7 * shared_norm_loss(out.start_logits, out.end_logits, batch))
    # a window-level reader likewise, over each window's tokens
    window = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"],
              "start_positions": torch.tensor([2, 0, 0]), "end_positions": torch.tensor([4, 0, 0]),
              "context_start": torch.tensor([1, 2, 1]), "context_end": torch.tensor([8, 9, 9])}
    alone = ReaderTask.compute_loss(types.SimpleNamespace(teacher=None), student, window)
    assert torch.equal(ReaderTask.compute_loss(types.SimpleNamespace(teacher=teacher), student, window), 0.7 * alone)
    assert not any(p.requires_grad for p in teacher.model.parameters())


def test_the_kl_of_a_window_level_student_is_over_the_context_and_the_no_answer_only(tiny_bert_dir, shared_reader_dir,
                                                                                     tokenizer):
    """The question tokens and [SEP]s can start no answer: a shared-normalization teacher never learned its logits
    there (its loss masks them), so whatever it puts there must not reach a window-level student. The teacher's
    logits outside the context and [CLS] are moved by a forward hook: the student's loss does not change."""
    examples = [{"id": str(i), "question": q, "context": c, "answers": a}
                for i, (q, c, a) in enumerate([("Who built the loom?", "Ada built a loom in 1843 near the river.",
                                                {"text": ["Ada"], "answer_start": [0]}),
                                               ("Where is the mill of the old town?", "The mill stood by the weir.",
                                                {"text": [], "answer_start": []})])]
    windows = prepare_windows({k: [ex[k] for ex in examples] for k in ("id", "question", "context", "answers")},
                              tokenizer, 64, 16, 32, labels="answer")
    batch = pad_batch([{k: windows[k][i] for k in windows} for i in range(len(windows["input_ids"]))],
                      tokenizer.pad_token_id)
    context = torch.tensor([[s == 1 for s in windows.sequence_ids(i)] + [False] * (batch["input_ids"].shape[1] - len(
        windows["input_ids"][i])) for i in range(len(windows["input_ids"]))])
    outside = ~context
    outside[:, 0] = False  # [CLS]: the no-answer, which both distributions keep
    teacher = Teacher(Accelerator(cpu=True), DistillationConfig(shared_reader_dir))
    student = AutoModelForQuestionAnswering.from_pretrained(shared_reader_dir).eval()
    task = types.SimpleNamespace(teacher=teacher)
    before = ReaderTask.compute_loss(task, student, batch)

    def elsewhere(module, inputs, out):  # the teacher's mass on positions that can start no answer
        out.start_logits = out.start_logits + 8.0 * outside
        out.end_logits = out.end_logits - 8.0 * outside
        return out
    teacher.model.register_forward_hook(elsewhere)
    assert outside.any() and torch.equal(ReaderTask.compute_loss(task, student, batch), before)


def distil_args(student, teacher, out, per_device, *extra):
    return ["--model_name_or_path", student, "--teacher", teacher, "--output_dir", out, "--per_device_train_batch_size",
            per_device, "--learning_rate", 1e-3, "--max_train_steps", 6, "--logging_steps", 1, "--group_by_length",
            "false", "--per_device_eval_batch_size", 5, "--passages_per_question", 3, "--passages",
            f"{SAMPLE}/dpr_passages.jsonl", "--eval_before_training", "false", *extra]


@pytest.fixture(scope="module")
def teacher_dir(shared_reader_dir):
    """The teacher of the runs below (conftest: a tiny reader trained with shared normalization on the sample)."""
    return shared_reader_dir


def test_a_distilled_run_records_its_teacher_and_resumes_to_the_same_weights(tiny_bert_dir, teacher_dir, tmp_path):
    ref, killed = str(tmp_path / "ref"), str(tmp_path / "killed")
    args = ["--checkpointing_steps", 2, "--distillation_weight", 0.7, "--distillation_temperature", 3]
    run_script("train_reader.py", *distil_args(tiny_bert_dir, teacher_dir, ref, 4, *args))
    recorded = ReaderSettings.load(ref).teacher
    assert recorded == {"model": teacher_dir, "weights_sha256": weights_hash(teacher_dir), "weight": 0.7,
                        "temperature": 3.0, "distil_layers": None}
    run_killed_at_checkpoint("train_reader.py", distil_args(tiny_bert_dir, teacher_dir, killed, 4, *args), killed,
                             step=2)
    run_script("train_reader.py", *distil_args(tiny_bert_dir, teacher_dir, killed, 4, *args,
                                               "--resume_from_checkpoint", "latest"))
    assert_same_weights(os.path.join(ref, "model.safetensors"), os.path.join(killed, "model.safetensors"))
    # a resume that changes what teaches the run is refused in one line naming the flag, before anything is loaded
    before = open(os.path.join(ref, "model.safetensors"), "rb").read()
    resume = ["--resume_from_checkpoint", "latest", "--max_train_steps", 8]
    for changed, flag in ((["--distillation_temperature", 5], "--distillation_temperature"),
                          (["--distillation_weight", 0.5], "--distillation_weight")):
        given = distil_args(tiny_bert_dir, teacher_dir, ref, 4, "--checkpointing_steps", 2, *args[2:], *changed,
                            *resume)
        assert_user_error(run_script("train_reader.py", *given, check=False), f"{flag}: the checkpoint's run had")
    without = [a for a in distil_args(tiny_bert_dir, teacher_dir, ref, 4, "--checkpointing_steps", 2, *resume)
               if a not in ("--teacher", teacher_dir)]
    assert_user_error(run_script("train_reader.py", *without, check=False), "--teacher: the checkpoint's run had")
    assert open(os.path.join(ref, "model.safetensors"), "rb").read() == before
    # the teacher taught: the same run without it ends elsewhere
    alone = str(tmp_path / "alone")
    run_script("train_reader.py", *[a for a in distil_args(tiny_bert_dir, teacher_dir, alone, 4,
                                                           "--checkpointing_steps", 2)
                                    if a not in ("--teacher", teacher_dir)])
    with safe_open(f"{ref}/model.safetensors", "pt") as a, safe_open(f"{alone}/model.safetensors", "pt") as b:
        assert not torch.equal(a.get_tensor("qa_outputs.weight"), b.get_tensor("qa_outputs.weight"))


def test_two_processes_distil_as_one(tiny_bert_no_dropout_dir, teacher_dir, tmp_path):
    from test_distributed import READER_INVARIANT, TOL, assert_weights_close, log, run_ddp

    single, ddp = str(tmp_path / "single"), str(tmp_path / "ddp")
    run_script("train_reader.py", *distil_args(tiny_bert_no_dropout_dir, teacher_dir, single, 4),
               env={"OMP_NUM_THREADS": "1"})
    run_ddp("train_reader.py", *distil_args(tiny_bert_no_dropout_dir, teacher_dir, ddp, 2))
    torch.testing.assert_close([r["loss"] for r in log(ddp)], [r["loss"] for r in log(single)], **TOL)
    assert_weights_close(f"{single}/model.safetensors", f"{ddp}/model.safetensors", READER_INVARIANT)


def test_a_teacher_that_cuts_text_otherwise_is_refused_before_anything_is_created(tiny_bert_dir, teacher_dir,
                                                                                   tmp_path):
    other_windows = str(tmp_path / "t256")  # the same weights, recorded with other windows
    os.makedirs(other_windows)
    for name in os.listdir(teacher_dir):
        if os.path.isfile(os.path.join(teacher_dir, name)):
            os.symlink(os.path.join(teacher_dir, name), os.path.join(other_windows, name))
    os.remove(os.path.join(other_windows, "reader_settings.json"))
    settings = json.load(open(f"{teacher_dir}/reader_settings.json"))
    json.dump({**settings, "max_seq_length": 256}, open(f"{other_windows}/reader_settings.json", "w"))

    other_tokenizer = str(tmp_path / "vocab")  # another vocabulary
    model = AutoModelForQuestionAnswering.from_pretrained(teacher_dir)
    tok = AutoTokenizer.from_pretrained(teacher_dir)
    tok.add_tokens(["loomwright"])
    model.save_pretrained(other_tokenizer)
    tok.save_pretrained(other_tokenizer)

    window_teacher = str(tmp_path / "window")  # trained a window at a time: its scores do not compare across windows
    run_script("train_reader.py", "--model_name_or_path", tiny_bert_dir, "--output_dir", window_teacher,
               "--max_train_steps", 1, "--eval_before_training", "false")

    plain = str(tmp_path / "plain")  # another QA model: no reader_settings.json, read as a window-level reader
    model.save_pretrained(plain)
    AutoTokenizer.from_pretrained(teacher_dir).save_pretrained(plain)
    check_teacher(plain, tiny_bert_dir, 128, 32, 32)  # on the student's windows, whatever they are

    for teacher, expected in [(other_windows, "reads windows of max_seq_length/doc_stride/max_query_length 256/"),
                              (other_tokenizer, "its tokenizer is not the student's"),
                              (window_teacher, "it was trained a window at a time"),
                              (plain, "it has no reader_settings.json, so it is read as a reader trained a window"),
                              (tiny_bert_dir, "not a trained reader")]:
        out = tmp_path / "out"
        proc = run_script("train_reader.py", *distil_args(tiny_bert_dir, teacher, out, 4), check=False)
        assert_user_error(proc, expected)
        assert not out.exists()
    proc = run_script("train_reader.py", "--distillation_weight", 0.5, "--output_dir", tmp_path / "o", check=False)
    assert_user_error(proc, "need --teacher")


def test_a_student_starts_from_the_first_layers_of_its_model(teacher_dir, tmp_path):
    out = str(tmp_path / "one-layer")
    run_script("train_reader.py", "--model_name_or_path", teacher_dir, "--num_hidden_layers", 1, "--output_dir", out,
               "--max_train_steps", 1, "--learning_rate", 1e-12, "--eval_before_training", "false")
    with safe_open(f"{out}/model.safetensors", "pt") as f, safe_open(f"{teacher_dir}/model.safetensors", "pt") as t:
        assert not any(".layer.1." in k for k in f.keys())
        # a step at lr 1e-12 leaves the first layer as the model's
        torch.testing.assert_close(f.get_tensor("bert.encoder.layer.0.attention.self.query.weight"),
                                   t.get_tensor("bert.encoder.layer.0.attention.self.query.weight"))
    assert json.load(open(f"{out}/config.json"))["num_hidden_layers"] == 1
    proc = run_script("train_reader.py", "--model_name_or_path", teacher_dir, "--num_hidden_layers", 3,
                      "--output_dir", tmp_path / "o", check=False)
    assert_user_error(proc, "has 2 layers; give 1 to 2")


@pytest.fixture(scope="module")
def narrow_teacher_dir(tokenizer, tmp_path_factory):
    """A reader 32 wide (the students are 64): the intermediate stage needs a projection to it."""
    from transformers import BertConfig, BertModel

    base = str(tmp_path_factory.mktemp("narrow-base"))
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=512, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0)
    torch.manual_seed(2)
    BertModel(config).save_pretrained(base)
    tokenizer.save_pretrained(base)
    out = str(tmp_path_factory.mktemp("narrow") / "out")
    run_script("train_reader.py", "--model_name_or_path", base, "--output_dir", out, "--per_device_train_batch_size", 4,
               "--learning_rate", 1e-3, "--max_train_steps", 4, "--eval_before_training", "false",
               "--passages_per_question", 2, "--passages", f"{SAMPLE}/dpr_passages.jsonl")
    return out


def test_the_intermediate_loss_is_zero_for_the_student_itself_and_computed_by_hand_through_a_projection(
        qa_dir, narrow_teacher_dir):
    torch.manual_seed(0)
    inputs = {"input_ids": torch.randint(5, 100, (3, 9)), "attention_mask": torch.ones(3, 9, dtype=torch.long)}
    inputs["attention_mask"][1, 6:] = 0
    group = torch.tensor([0, 0, 1])

    itself = Teacher(Accelerator(cpu=True), DistillationConfig(qa_dir, distil_layers="0:0,1:1,2:2"))
    student = AutoModelForQuestionAnswering.from_pretrained(qa_dir).eval()
    itself.attach(student)
    assert itself.attention and not hasattr(student, "distil_projection")
    assert itself.intermediate_loss(student, inputs, group).item() == 0.0

    teacher = Teacher(Accelerator(cpu=True), DistillationConfig(narrow_teacher_dir, distil_layers="0:0,2:1"))
    student = AutoModelForQuestionAnswering.from_pretrained(qa_dir).eval()
    teacher.attach(student)
    loss = teacher.intermediate_loss(student, inputs, group)
    loss.backward()
    assert student.distil_projection.weight.grad.abs().sum() > 0 and student.qa_outputs.weight.grad is not None

    with torch.no_grad():
        s = student(**inputs, output_hidden_states=True, output_attentions=True)
        t = teacher.model(**inputs, output_hidden_states=True, output_attentions=True)
        proj = student.distil_projection
        per_window = []
        for w in range(3):
            n = int(inputs["attention_mask"][w].sum())
            total = 0.0
            for si, ti in ((0, 0), (2, 1)):
                d = proj(s.hidden_states[si][w, :n]) - t.hidden_states[ti][w, :n]
                total += float((d ** 2).mean())
            ps, pt = s.attentions[1][w, :, :n, :n].double(), t.attentions[0][w, :, :n, :n].double()  # layer 2 : 1
            total += float((pt * (pt.log() - ps.log())).sum(-1).mean())  # mean over heads and tokens
            per_window.append(total)
    assert loss.item() == pytest.approx(((per_window[0] + per_window[1]) / 2 + per_window[2]) / 2, rel=1e-4)


def stage_args(student, teacher, out, per_device):
    return ["--model_name_or_path", student, "--teacher", teacher, "--distil_layers", "0:0,1:1,2:2", "--output_dir",
            out, "--per_device_train_batch_size", per_device, "--learning_rate", 1e-3, "--max_train_steps", 4,
            "--logging_steps", 1, "--group_by_length", "false", "--per_device_eval_batch_size", 5,
            "--passages_per_question", 2, "--passages", f"{SAMPLE}/dpr_passages.jsonl", "--eval_before_training",
            "false", "--freeze_word_embeddings", "true"]  # as the recipes: a word seen once gets a near-zero gradient,
    # rounding noise that Adam turns into a step of about lr, in one run and not the other


def test_the_intermediate_stage_trains_on_two_processes_as_on_one_then_the_prediction_layer_follows(
        tiny_bert_no_dropout_dir, narrow_teacher_dir, tmp_path):
    from test_distributed import TOL, assert_weights_close, log, run_ddp

    single, ddp = str(tmp_path / "single"), str(tmp_path / "ddp")
    run_script("train_reader.py", *stage_args(tiny_bert_no_dropout_dir, narrow_teacher_dir, single, 4),
               env={"OMP_NUM_THREADS": "1"})
    run_ddp("train_reader.py", *stage_args(tiny_bert_no_dropout_dir, narrow_teacher_dir, ddp, 2))
    torch.testing.assert_close([r["loss"] for r in log(ddp)], [r["loss"] for r in log(single)], **TOL)
    # the answer heads had no say in this stage: their gradient is exactly 0 on both
    assert_weights_close(f"{single}/model.safetensors", f"{ddp}/model.safetensors", ("qa_outputs.bias",))
    with safe_open(f"{single}/model.safetensors", "pt") as f:
        assert not any(k.startswith("distil_projection.") for k in f.keys())  # the projection served this run alone
    recorded = ReaderSettings.load(single).teacher
    assert recorded["distil_layers"] == "0:0,1:1,2:2"
    assert recorded["weight"] is None and recorded["temperature"] is None  # the layer loss has neither
    final = str(tmp_path / "final")  # the prediction layer, from the stage's output
    run_script("train_reader.py", *distil_args(single, narrow_teacher_dir, final, 4))
    assert ReaderSettings.load(final).teacher["distil_layers"] is None


@pytest.mark.parametrize("extra, expected", [
    (["--distil_layers", "0:0,1:5"], "the teacher has layers 0 to 2 (0: the embeddings), not 5"),
    (["--distil_layers", "1-2"], "give student:teacher layer pairs"),
    (["--distil_layers", "1:1,1:2"], "a student layer learns one teacher layer"),
    (["--distil_layers", "1:1", "--eval_steps", 2], "drop --eval_steps"),
    (["--distil_layers", "1:1", "--distillation_temperature", 3],
     "--distil_layers matches layers, which --distillation_weight and --distillation_temperature"),
    (["--distil_layers", "1:1", "--distillation_weight", 0.3], "drop --distillation_weight"),
])
def test_a_layer_map_the_models_cannot_follow_is_refused(tiny_bert_dir, teacher_dir, tmp_path, extra, expected):
    out = tmp_path / "out"
    proc = run_script("train_reader.py", *distil_args(tiny_bert_dir, teacher_dir, out, 4, *extra), check=False)
    assert_user_error(proc, expected)
    assert not out.exists()

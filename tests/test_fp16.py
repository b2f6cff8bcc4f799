"""fp16 dynamic loss scaling, run for real on the CPU through Accelerate (see tests/harness.py), both scripts.

An update whose gradients overflow must be skipped without a trace in the weights, optimizer state and LR
schedule, halve the scale, and be counted; clipping must see unscaled gradients; a run killed after a skipped
update must resume bit-identically with the scaler's scale and growth tracker restored. Each with fused and
foreach AdamW: a fused optimizer always gets its step() called (the kernel skips internally), which is what
Accelerate's own skip detection watches.
"""

import json
import os

import pytest
import torch
from conftest import assert_same_weights, run_killed_at_checkpoint, run_script
from safetensors.torch import load_file

HARNESS = "tests/harness.py"


def reader_args(model, out, *extra):
    return ["train_reader.py", "--model_name_or_path", model, "--output_dir", out, "--per_device_train_batch_size", 8,
            "--learning_rate", 1e-3, "--eval_before_training", "false", "--mixed_precision", "fp16",
            "--max_eval_samples", 20, *extra]


def dpr_args(model, out, *extra):
    return ["train_dpr.py", "--query_model_name_or_path", model, "--passage_model_name_or_path", model,
            "--output_dir", out, "--per_device_train_batch_size", 8, "--learning_rate", 5e-4,
            "--eval_before_training", "false", "--mixed_precision", "fp16", "--max_eval_samples", 20, *extra]


def read_log(out):
    """Last record per step (a killed run may have logged steps that its resumed run logs again)."""
    records = {}
    for line in open(os.path.join(out, "train_log.jsonl")):
        r = json.loads(line)
        records[r["step"]] = r
    return [records[s] for s in sorted(records)]


def checkpoint_state(out, step):
    ckpt = os.path.join(out, "checkpoints", f"step_{step}")
    return (load_file(os.path.join(ckpt, "model.safetensors")),
            torch.load(os.path.join(ckpt, "optimizer.bin"), weights_only=False),
            torch.load(os.path.join(ckpt, "scaler.pt"), weights_only=False))


def assert_optimizer_states_equal(a, b):
    assert a["state"].keys() == b["state"].keys()
    for key in a["state"]:
        for name, value in a["state"][key].items():
            assert torch.equal(value, b["state"][key][name]), (key, name)


# GradCache changes the backward path, not the optimizer step: one optimizer covers it.
@pytest.mark.parametrize("task, optimizer", [("reader", "fused"), ("reader", "foreach"), ("dpr", "fused"),
                                             ("dpr", "foreach"), ("dpr_grad_cache", "fused")])
def test_fp16_overflow_skips_the_update_and_training_goes_on(tiny_bert_dir, tmp_path, monkeypatch, task, optimizer):
    monkeypatch.setenv("FP16_CPU_INF_AT", "3")
    monkeypatch.setenv("FP16_CPU_OPTIMIZER", optimizer)
    out = str(tmp_path / task)
    extra = ["--max_train_steps", 24, "--logging_steps", 1, "--checkpointing_steps", 1, "--checkpoints_total_limit", 24]
    if task == "reader":
        args = reader_args(tiny_bert_dir, out, *extra)
    else:
        args = dpr_args(tiny_bert_dir, out, *extra,
                        *(["--grad_cache_chunk_size", 3] if task == "dpr_grad_cache" else []))
    proc = run_script(HARNESS, *args)
    assert "precision=fp16" in proc.stdout
    assert "update 3 skipped by the fp16 loss scaler (inf/nan gradients); scale now 32768" in proc.stderr

    log = read_log(out)
    assert [r["step"] for r in log] == list(range(1, 25))
    assert [r["skipped_steps"] for r in log] == [0, 0] + [1] * 22
    assert log[2]["loss_scale"] == log[1]["loss_scale"] / 2 == 32768.0
    assert log[2]["grad_norm"] is None  # not finite: null in strict JSON
    assert log[2]["lr"] == log[1]["lr"]  # the schedule did not advance on the skipped update ...
    assert log[3]["lr"] < log[2]["lr"]  # ... and moves on after it
    first, last = (sum(r["loss"] for r in part) / 8 for part in (log[:8], log[-8:]))  # single steps are noisy
    assert last < first, [r["loss"] for r in log]

    # Update 3 changed nothing: weights and optimizer state at step 3 are those of step 2; update 4 did change them.
    weights_2, optim_2, scaler_2 = checkpoint_state(out, 2)
    weights_3, optim_3, scaler_3 = checkpoint_state(out, 3)
    weights_4, _, _ = checkpoint_state(out, 4)
    assert all(torch.equal(weights_2[k], weights_3[k]) for k in weights_2)
    assert_optimizer_states_equal(optim_2, optim_3)
    assert not all(torch.equal(weights_3[k], weights_4[k]) for k in weights_3)
    assert scaler_3["scale"] == scaler_2["scale"] / 2

    results = json.load(open(os.path.join(out, "eval_results.json")))
    assert results["skipped_fp16_updates"] == 1 and results["updates"] == results["updates_planned"] == 24
    assert results["optimizer"] == f"adamw_{optimizer}"


def test_fp16_clipping_sees_unscaled_gradients_with_accumulation(tiny_bert_no_dropout_dir, tmp_path):
    """The logged norm is what clip_grad_norm_ measured: unscaled, it matches fp32's; scaled it would be 2**16 x."""
    norms = {}
    for precision in ("fp16", "no"):
        out = str(tmp_path / precision)
        args = reader_args(tiny_bert_no_dropout_dir, out, "--max_train_steps", 3, "--logging_steps", 1,
                           "--gradient_accumulation_steps", 2, "--max_grad_norm", 0.5)
        args[args.index("fp16")] = precision
        run_script(HARNESS, *args)
        norms[precision] = [r["grad_norm"] for r in read_log(out)]
    assert all(n > 0.5 for n in norms["no"])  # clipping really clipped
    torch.testing.assert_close(norms["fp16"], norms["no"], rtol=2e-2, atol=0)


@pytest.mark.parametrize("optimizer", ["fused", "foreach"])
def test_fp16_kill_after_a_skipped_update_resumes_bit_identical(tiny_bert_dir, tmp_path, monkeypatch, optimizer):
    # Skip at update 8, checkpoint at 10 (growth tracker 2 of 3), so the scale grows again at update 11 only if
    # the tracker was restored: the scaler's whole state matters after the resume.
    monkeypatch.setenv("FP16_CPU_INF_AT", "8")
    monkeypatch.setenv("FP16_CPU_OPTIMIZER", optimizer)
    monkeypatch.setenv("FP16_CPU_GROWTH_INTERVAL", "3")
    extra = ["--max_train_steps", 20, "--checkpointing_steps", 10, "--logging_steps", 1]
    ref = str(tmp_path / "ref")
    run_script(HARNESS, *reader_args(tiny_bert_dir, ref, *extra))

    out = str(tmp_path / "killed")
    run_killed_at_checkpoint(HARNESS, reader_args(tiny_bert_dir, out, *extra), out, step=10)
    _, _, scaler = checkpoint_state(out, 10)
    ref_log = read_log(ref)
    assert scaler["scale"] == ref_log[9]["loss_scale"] and scaler["_growth_tracker"] == 2
    run_script(HARNESS, *reader_args(tiny_bert_dir, out, *extra, "--resume_from_checkpoint", "latest"))

    log = read_log(out)
    assert [r["loss_scale"] for r in log] == [r["loss_scale"] for r in ref_log]
    assert ref_log[10]["loss_scale"] == 2 * ref_log[9]["loss_scale"]  # grew at update 11
    # Growing the scale every 3 updates soon overflows for real: more skips, the same in both runs.
    assert [r["skipped_steps"] for r in log] == [r["skipped_steps"] for r in ref_log]
    assert_same_weights(os.path.join(ref, "model.safetensors"), os.path.join(out, "model.safetensors"))

"""DDP with real processes: 2 gloo processes on CPU (MULTI_CPU) launched by torchrun, as the README says.

Each test compares a 2-process run (8 per process) with a 1-process run (16) over the same global batches,
dropout off: equal losses and weights mean the processes really split the data and the gradients were
averaged (and for DPR, that gathered negatives reproduce the single-process global-batch loss).
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

from conftest import ROOT, run_script

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
CPU_DDP = {"ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1"}
TOL = dict(atol=2e-5, rtol=1e-4)  # float reductions in another order; everything else is identical


def run_ddp(script, *args):
    """2 CPU processes; exit status 0 and no gloo abort at exit in either process (see utils.runtime.finish)."""
    proc = run_script(script, *args, launcher=TORCHRUN, env=CPU_DDP)
    assert "terminate called" not in proc.stdout + proc.stderr, proc.stderr[-2000:]
    return proc


def log(out):
    return [json.loads(line) for line in open(os.path.join(out, "train_log.jsonl"))]


def assert_weights_close(file_a, file_b, invariant=()):
    """Weights equal within TOL, except parameters the loss is invariant to: their exact gradient is 0, so the
    gradient is pure rounding noise that Adam normalises into steps of about +-lr in either run."""
    a, b = load_file(file_a), load_file(file_b)
    assert a.keys() == b.keys()
    for key in a:
        if key not in invariant:
            torch.testing.assert_close(a[key], b[key], **TOL, msg=key)


# Span logits are softmaxed over positions, so a shift shared by all positions changes nothing: the QA head's bias
# and the last LayerNorm's bias (it only feeds the QA head) get exactly zero gradient.
READER_INVARIANT = ("qa_outputs.bias", "bert.encoder.layer.1.output.LayerNorm.bias")


def assert_updates_close(initial_file, file_a, file_b, rtol=0.03):
    """The two runs moved the weights the same way: |update_a - update_b| / |update_a| < rtol over all parameters
    (L2). Per element Adam turns rounding noise on near-zero gradients into steps of about +-lr, so elementwise
    closeness is not the right test for every parameter."""
    init, a, b = load_file(initial_file), load_file(file_a), load_file(file_b)
    da = torch.cat([(a[k] - init[k]).flatten() for k in init])
    db = torch.cat([(b[k] - init[k]).flatten() for k in init])
    assert (da - db).norm() / da.norm() < rtol, ((da - db).norm() / da.norm()).item()


def reader_args(model, out, per_device, *extra):
    return ["--model_name_or_path", model, "--output_dir", out, "--per_device_train_batch_size", per_device,
            "--learning_rate", 1e-3, "--max_train_steps", 6, "--logging_steps", 1, "--group_by_length", "false",
            "--per_device_eval_batch_size", 5, *extra]


def test_reader_ddp_matches_single_process_and_resumes(tiny_bert_no_dropout_dir, tmp_path):
    single, ddp = str(tmp_path / "single"), str(tmp_path / "ddp")
    run_script("train_reader.py", *reader_args(tiny_bert_no_dropout_dir, single, 16), env={"OMP_NUM_THREADS": "1"})
    proc = run_ddp("train_reader.py", *reader_args(tiny_bert_no_dropout_dir, ddp, 8, "--checkpointing_steps", 3))
    assert "distributed=MULTI_CPU processes=2" in proc.stdout and "= 16 per update" in proc.stdout

    a, b = log(single), log(ddp)
    assert [r["step"] for r in b] == list(range(1, 7))  # one writer: no duplicated lines
    torch.testing.assert_close([r["loss"] for r in b], [r["loss"] for r in a], **TOL)
    assert_weights_close(f"{single}/model.safetensors", f"{ddp}/model.safetensors", READER_INVARIANT)
    # Evaluation gathered from both processes (uneven batches of 5) equals the single-process one exactly.
    before = [json.load(open(f"{d}/eval_results.json"))["metrics_before_training"] for d in (single, ddp)]
    assert before[0] == before[1]
    assert json.load(open(f"{single}/predictions.json")).keys() == json.load(open(f"{ddp}/predictions.json")).keys()

    # Resume under DDP from the mid-run checkpoint: same final weights as the uninterrupted DDP run.
    resumed = str(tmp_path / "resumed")
    os.makedirs(f"{resumed}/checkpoints")
    shutil.copytree(f"{ddp}/checkpoints/step_3", f"{resumed}/checkpoints/step_3")
    run_ddp("train_reader.py", *reader_args(tiny_bert_no_dropout_dir, resumed, 8, "--checkpointing_steps", 3,
                                            "--resume_from_checkpoint", "latest"))
    a, b = load_file(f"{ddp}/model.safetensors"), load_file(f"{resumed}/model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)


def dpr_args(model, out, per_device, *extra):
    return ["--query_model_name_or_path", model, "--passage_model_name_or_path", model, "--output_dir", out,
            "--per_device_train_batch_size", per_device, "--learning_rate", 5e-4, "--max_train_steps", 4,
            "--logging_steps", 1, "--per_device_eval_batch_size", 5, "--num_hard_negatives", 1, *extra]


@pytest.mark.parametrize("extra", [[], ["--grad_cache_chunk_size", 3]], ids=["gathered", "gathered+grad_cache"])
def test_dpr_ddp_global_negatives_match_single_process(tiny_bert_no_dropout_dir, tmp_path, extra):
    single, ddp = str(tmp_path / "single"), str(tmp_path / "ddp")
    run_script("train_dpr.py", *dpr_args(tiny_bert_no_dropout_dir, single, 16), env={"OMP_NUM_THREADS": "1"})
    proc = run_ddp("train_dpr.py", *dpr_args(tiny_bert_no_dropout_dir, ddp, 8, *extra))
    assert "distributed=MULTI_CPU processes=2" in proc.stdout
    a, b = log(single), log(ddp)
    assert [r["step"] for r in b] == [1, 2, 3, 4]
    torch.testing.assert_close([r["loss"] for r in b], [r["loss"] for r in a], **TOL)
    for side in ("query_encoder", "passage_encoder"):
        assert_updates_close(f"{tiny_bert_no_dropout_dir}/model.safetensors", f"{single}/{side}/model.safetensors",
                             f"{ddp}/{side}/model.safetensors")
    before = [json.load(open(f"{d}/eval_results.json"))["metrics_before_training"] for d in (single, ddp)]
    assert before[0] == before[1]
    assert len(open(f"{ddp}/rankings.jsonl").readlines()) == 44


def test_a_crashed_process_ends_the_whole_job(tiny_bert_no_dropout_dir, tmp_path):
    import psutil

    out = str(tmp_path / "crash")
    cmd = TORCHRUN + [os.path.join(ROOT, "train_reader.py"),
                      *map(str, reader_args(tiny_bert_no_dropout_dir, out, 8, "--max_train_steps", 400,
                                            "--checkpointing_steps", 2))]
    proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, **CPU_DDP}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 120
    while not os.path.isdir(f"{out}/checkpoints/step_2") and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    workers = [p for p in psutil.Process(proc.pid).children(recursive=True) if "train_reader.py" in " ".join(p.cmdline())]
    assert len(workers) == 2
    victim = next(p for p in workers if p.environ().get("RANK") == "1")
    victim.send_signal(signal.SIGKILL)
    output, _ = proc.communicate(timeout=120)  # no hang: torchrun tears the other rank down
    assert proc.returncode != 0
    assert "SIGKILL" in output or "Signal 9" in output, output[-2000:]
    assert not os.path.exists(f"{out}/model.safetensors")

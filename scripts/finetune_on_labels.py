"""A trained reader fine-tuned on its users' labels (export_feedback.py's squad.json), its no-answer threshold chosen by
cross-validation over folds of whole documents: never on questions the reader that is scored trained on.

    python scripts/finetune_on_labels.py --reader outputs/reader --labels outputs/labels/squad.json \
        --output_dir outputs/reader-labels -- --passages corpus.jsonl --learning_rate 3e-5

Each of --folds folds of the labels' documents (utils.files.folds: each document whole in one fold) is held out in
turn: train_reader.py continues --reader (its recorded settings and answer rule) on the other folds' labels, then
reads the held-out fold's questions. Every label so gets an out-of-fold reading: the best span and its null score
minus best from a reader that never saw its document. The threshold tuned on those (the official rule) is the one
the final reader, train_reader.py on every label, is published with (into --output_dir, whole, where a server
serving it swaps it in). Flags after `--` go to every train_reader.py run. With --mix_with (the reader's original
training data), each run's training file adds --mix_ratio times as many of its questions as it has labels (drawn
with --seed): what keeps the reader from forgetting what it knew.

--output_dir gets the reader and finetune.json: the threshold; the one the reader as it was gets from the same
labels (tuned on all of them: for other questions, what calibration alone gives); three out-of-fold scores on the
labels, each question scored by what was not chosen on its document: the reader as it was at its recorded
threshold, the same at a threshold tuned on the other folds' labels (calibration alone), the fine-tuned readers at
a threshold tuned on the other folds' out-of-fold readings; each label's out-of-fold reading and which documents
each fold's reader trained on. The train_reader.py runs' own outputs are in a temporary folder, removed at the end.
"""

import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from utils.errors import UserError, exit_on_user_error  # noqa: E402
from utils.files.folds import article_folds, article_of  # noqa: E402
from utils.files.jsonfiles import write_json_file  # noqa: E402
from utils.files.squad import load_squad, squad_document  # noqa: E402
from utils.reader.decoding import abstains  # noqa: E402
from utils.reader.metrics import best_null_threshold, squad_metrics  # noqa: E402
from utils.reader.trained import RUN_RESULTS, Reader, ReaderSettings, fingerprint  # noqa: E402
from utils.runtime.output_dir import ONE_PROCESS, prepare_output_dir, publish_dir  # noqa: E402

# train_reader.py flags that choose a checkpoint on the dev set, which is the held-out fold here: its labels would
# choose the reader that scores them
CHOOSING = ("--eval_steps", "--early_stopping_patience")


def train(reader: str, train_file: str, validation_file: str, output_dir: str, extra: list[str]) -> None:
    """train_reader.py continuing `reader` on `train_file` (its dev set `validation_file`) into `output_dir`."""
    cmd = [sys.executable, os.path.join(ROOT, "train_reader.py"), "--model_name_or_path", reader, "--train_file",
           train_file, "--validation_file", validation_file, "--output_dir", output_dir,
           "--eval_before_training", "false", *extra]
    proc = subprocess.run(cmd, cwd=ROOT, stderr=subprocess.PIPE, text=True)
    if proc.returncode:
        error = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
        raise UserError(f"train_reader.py failed ({' '.join(cmd[2:])}): " + (error[0][7:] if error else
                                                                             proc.stderr[-2000:]))


def readings(reader_dir: str, examples: list[dict]) -> dict:
    """{id: {"text": best span, "null_minus_best"}} of `examples` read by the reader in `reader_dir`."""
    decoded = Reader(reader_dir, sort_by_length=True).spans(examples)
    return {ex["id"]: {"text": decoded[ex["id"]]["text"], "null_minus_best": decoded[ex["id"]]["null_minus_best"]}
            for ex in examples}


def scores(references: dict, read: dict, threshold: float | None) -> dict:
    """EM/F1 of `read` at `threshold` (abstaining where null minus best is above it)."""
    predictions = {q: "" if abstains(r["null_minus_best"], threshold) else r["text"] for q, r in read.items()}
    m = squad_metrics(references, predictions)
    return {"threshold": threshold, "exact": round(m["exact"], 2), "f1": round(m["f1"], 2)}


def tuned(references: dict, read: dict) -> float:
    """The threshold the official rule tunes on `read` (per question)."""
    return best_null_threshold(references, {q: r["text"] for q, r in read.items()},
                               {q: r["null_minus_best"] for q, r in read.items()})[1]


def with_mix(labels: list[dict], mix: list[dict], ratio: float, rng: random.Random) -> list[dict]:
    """`labels` and ratio x as many questions drawn from `mix` (whole list if fewer)."""
    return labels + rng.sample(mix, min(len(mix), round(ratio * len(labels))))


@exit_on_user_error
def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--reader", required=True, help="the trained reader to continue (train_reader.py's output)")
    p.add_argument("--labels", required=True, help="the labels, SQuAD JSON (export_feedback.py's squad.json)")
    p.add_argument("--output_dir", required=True, help="where the fine-tuned reader and finetune.json go")
    p.add_argument("--overwrite_output_dir", action="store_true", help="replace what --output_dir holds")
    p.add_argument("--folds", type=int, default=5, help="folds of whole documents (at most the documents)")
    p.add_argument("--mix_with", help="the reader's original training data (SQuAD JSON), mixed into each run")
    p.add_argument("--mix_ratio", type=float, default=1.0, help="questions of --mix_with per label")
    p.add_argument("--seed", type=int, default=42, help="the draw of --mix_with's questions")
    args, extra = p.parse_known_args()
    extra = [a for a in extra if a != "--"]
    if args.folds < 2:
        raise UserError("--folds must be at least 2")
    if args.mix_ratio < 0:
        raise UserError(f"--mix_ratio must be 0 or more (got {args.mix_ratio})")
    if any(a.replace("-", "_").split("=")[0] in {c.replace("-", "_") for c in CHOOSING} for a in extra):
        raise UserError(f"{' and '.join(CHOOSING)} choose a checkpoint on the held-out fold's labels, which then score "
                        "it: leave them out")
    if os.path.realpath(args.output_dir) == os.path.realpath(args.reader):
        raise UserError(f"--output_dir {args.output_dir} is --reader: the fine-tuned reader never replaces the one "
                        "it starts from (each fine-tuning starts from it again, with every label so far)")
    examples, _ = load_squad(args.labels)  # a label a question (export_feedback.py)
    document = {ex["id"]: article_of(ex) for ex in examples}
    documents = set(document.values())
    if len(documents) < 2:
        raise UserError(f"{args.labels}: the labels of one document: cross-validation over documents needs two")
    folds = article_folds(examples, min(args.folds, len(documents)))
    question_folds = [[ex["id"] for ex in fold] for fold in folds]
    references = {ex["id"]: ex["answers"]["text"] for ex in examples}
    mix = load_squad(args.mix_with)[0] if args.mix_with else []
    prepare_output_dir(ONE_PROCESS, args.output_dir, "evaluate", overwrite=args.overwrite_output_dir)
    rng = random.Random(args.seed)
    work = tempfile.mkdtemp(prefix="qa-amp-finetune-")
    try:
        # --- each fold held out in turn: a reader trained on the others reads it ----------------------------
        out_of_fold, trained_on = {}, []
        for i, held_out in enumerate(folds):
            rest = [ex for j, fold in enumerate(folds) if j != i for ex in fold]  # no document of held_out's
            trained_on.append(sorted({document[ex["id"]] for ex in rest}))
            train_file, held_file = os.path.join(work, f"fold{i}-train.json"), os.path.join(work, f"fold{i}.json")
            write_json_file(train_file, squad_document(with_mix(rest, mix, args.mix_ratio, rng)))
            write_json_file(held_file, squad_document(held_out))
            train(args.reader, train_file, held_file, os.path.join(work, f"fold{i}"), extra)
            out_of_fold.update({q: {**r, "fold": i} for q, r in readings(os.path.join(work, f"fold{i}"),
                                                                          held_out).items()})
            shutil.rmtree(os.path.join(work, f"fold{i}"))  # read: its reader is done with
        threshold = tuned(references, out_of_fold)
        # --- the reader as it was, on the same questions: at its own threshold, and calibrated alike ----------
        before = readings(args.reader, examples)
        recorded = ReaderSettings.load(args.reader) or ReaderSettings()
        calibration = tuned(references, before)
        # --- the final reader: every label, published with the cross-validated threshold ---------------------
        all_file = os.path.join(work, "all.json")
        write_json_file(all_file, squad_document(with_mix(examples, mix, args.mix_ratio, rng)))
        final = os.path.join(work, "final")
        train(args.reader, all_file, args.labels, final, extra)
        settings = ReaderSettings.load(final)
        settings.null_threshold = threshold
        settings.null_threshold_tuned_on = {
            "data": f"{args.labels}: cross-validated over {len(folds)} folds of whole documents (each question read "
                    "by a reader that did not train on its document)", "questions": len(references),
            "fingerprint": fingerprint(examples)}
        settings.save(final)
        report = {"labels": args.labels, "questions": len(references), "documents": len(documents),
                  "folds": len(folds),
                  "threshold": threshold, "reader_as_it_was_threshold_on_the_labels": calibration,
                  "mix_with": args.mix_with, "mix_ratio": args.mix_ratio if mix else None,
                  "train_reader_flags": extra,
                  "out_of_fold": {"reader_as_it_was": scores(references, before, recorded.null_threshold),
                                  "reader_as_it_was_threshold_cross_validated":
                                      cross_validated(references, before, question_folds),
                                  "fine_tuned_threshold_cross_validated":
                                      cross_validated(references, out_of_fold, question_folds)},
                  "trained_on": trained_on, "readings": out_of_fold}
        with publish_dir(ONE_PROCESS, args.output_dir) as out:  # the reader whole, or nothing
            for name in os.listdir(final):  # its results on the labels it trained on left out: in-sample
                if os.path.isfile(os.path.join(final, name)) and not name.startswith(".") and \
                        (name not in RUN_RESULTS or name == "train_log.jsonl"):
                    shutil.copy2(os.path.join(final, name), os.path.join(out, name))
            write_json_file(os.path.join(out, "finetune.json"), report)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rows = report["out_of_fold"]
    print(f"{args.output_dir}: fine-tuned on {len(references)} labels of {report['documents']} documents; "
          f"out-of-fold F1 {rows['fine_tuned_threshold_cross_validated']['f1']} against the reader as it was "
          f"{rows['reader_as_it_was']['f1']} (its threshold) and "
          f"{rows['reader_as_it_was_threshold_cross_validated']['f1']} (a threshold chosen on the labels alike); "
          f"threshold {threshold:.4g}")


def cross_validated(references: dict, read: dict, folds: list[list[str]]) -> dict:
    """EM/F1 of `read` (per question) where each fold's questions are cut at the threshold tuned on the other folds'
    (what a threshold chosen on labels, without fine-tuning, gives on questions it was not chosen on)."""
    predictions = {}
    for i, held_out in enumerate(folds):
        rest = [q for j, fold in enumerate(folds) if j != i for q in fold]
        t = tuned({q: references[q] for q in rest}, {q: read[q] for q in rest})
        predictions.update({q: "" if abstains(read[q]["null_minus_best"], t) else read[q]["text"] for q in held_out})
    m = squad_metrics(references, predictions)
    return {"threshold": "per fold, tuned on the others", "exact": round(m["exact"], 2), "f1": round(m["f1"], 2)}


if __name__ == "__main__":
    main()

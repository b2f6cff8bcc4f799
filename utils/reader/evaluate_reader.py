"""`train_reader.py --do_train false`: a trained reader evaluated on a labelled file, or answering the questions of
an unlabelled one, exactly as it was trained: its recorded null threshold and decoding settings apply, and what
that threshold was tuned on is said."""

import os
import time

import torch

from utils.loop.fit import evaluate_without_grad
from utils.files.jsonfiles import write_json
from utils.loop.output_dir import publish_dir
from utils.loop.process import finish
from utils.reader.decoding import apply_null_threshold
from utils.files.squad import is_impossible, load_questions, load_squad
from utils.reader.reader_task import ReaderTask, prepare_eval_set
from utils.reader.trained import ReaderSettings, fingerprint, load_qa_model


def recorded_threshold_label(settings: ReaderSettings | None, examples: list[dict]) -> str:
    """What the threshold predictions.json uses is, in words."""
    if settings is None:
        return "with no recorded null threshold (no reader_settings.json): threshold 0, transformers' pipeline rule"
    if settings.null_threshold is None:
        return "with no null threshold: the model was trained on SQuAD v1.1 data and always answers"
    tuned = settings.null_threshold_tuned_on or {}
    source = ("tuned on this very file: an upper bound" if tuned.get("fingerprint") == fingerprint(examples)
              else f"tuned on {tuned['data']}, {tuned['questions']} questions" if tuned else "recorded")
    return f"at the model's recorded null threshold ({settings.null_threshold:.3f}, {source})"


def evaluate_or_predict(accelerator, args, tokenizer, collate):
    """--do_train false: evaluate on --validation_file or answer --predict_file with the model as it was saved,
    with its recorded null threshold (reader_settings.json; a QA model without one gets threshold 0, the
    pipeline's rule). On SQuAD v1.1 data every question has an answer, so the model always answers there."""
    settings = ReaderSettings.load(args.model_name_or_path)
    model = accelerator.prepare(load_qa_model(args.model_name_or_path))
    model.eval()
    with publish_dir(accelerator, args.output_dir, state="evaluated") as out:  # all or nothing, nothing stale
        _evaluate_or_predict(accelerator, args, tokenizer, collate, settings, model, out)
    finish(accelerator)


def _evaluate_or_predict(accelerator, args, tokenizer, collate, settings, model, out):
    if args.validation_file:
        examples, _ = load_squad(args.validation_file)
        examples = examples[: args.max_eval_samples] if args.max_eval_samples else examples
        unanswerable = sum(is_impossible(ex) for ex in examples)
        eval_set = prepare_eval_set(accelerator, args, tokenizer, examples, collate)
        task = ReaderTask(accelerator, args, tokenizer, eval_set, unanswerable > 0,
                          (settings or ReaderSettings()) if unanswerable else None)
        result = evaluate_without_grad(task, model)
        m = result["metrics"]
        if unanswerable:
            label = recorded_threshold_label(settings, examples)
            lines = [f"{args.validation_file}: {len(examples)} questions, {unanswerable} unanswerable",
                     f"  {label}: EM {m['recorded_exact']:.2f} F1 {m['recorded_f1']:.2f} (predictions.json)",
                     f"  at threshold 0: EM {m['exact']:.2f} F1 {m['f1']:.2f} (HasAns F1 {m['HasAns_f1']:.2f}, NoAns "
                     f"{m['NoAns_f1']:.2f})",
                     f"  at the threshold tuned on this file ({m['null_threshold']:.3f}, an upper bound): EM "
                     f"{m['tuned_exact']:.2f} F1 {m['tuned_f1']:.2f}"]
            note = (f"recorded_*: predictions.json, {label}; exact/f1/HasAns/NoAns: threshold 0; tuned_*: the "
                    "threshold tuned on this file, an upper bound")
        else:
            label = "SQuAD v1.1 data: every question has an answer, so the model always answers"
            lines = [f"{args.validation_file}: {len(examples)} questions, all answerable",
                     f"  EM {m['exact']:.2f} F1 {m['f1']:.2f} (predictions.json; {label})"]
            note = label
        accelerator.print("\n".join(lines))
        task.write_outputs(out, result)
        write_json(accelerator, os.path.join(out, "eval_results.json"),
                   {"model": args.model_name_or_path, "file": args.validation_file, "metrics": m,
                    "predictions_null_threshold": m.get("recorded_null_threshold"), "note": note})
    if args.predict_file:
        examples = load_questions(args.predict_file, need_context=True)
        threshold = settings.null_threshold if settings else 0.0
        start = time.perf_counter()
        eval_set = prepare_eval_set(accelerator, args, tokenizer, examples, collate)
        task = ReaderTask(accelerator, args, tokenizer, eval_set, False, settings)
        with torch.no_grad():
            decoded = task.spans(model, eval_set)
        seconds = time.perf_counter() - start
        predictions = apply_null_threshold(decoded, threshold)
        write_json(accelerator, os.path.join(out, "predictions.json"), predictions)
        write_json(accelerator, os.path.join(out, "nbest.json"), {
            i: {"answer": predictions[i], "null_score": d["null_score"], "null_minus_best": d["null_minus_best"],
                "nbest": d["nbest"]} for i, d in decoded.items()})
        speed = {"questions": len(examples), "windows": len(eval_set.features), "seconds": round(seconds, 2),
                 "questions_per_second": round(len(examples) / seconds, 2), "null_threshold": threshold,
                 "precision": accelerator.mixed_precision, "processes": accelerator.num_processes}
        write_json(accelerator, os.path.join(out, "predict_results.json"), speed)
        accelerator.print(f"{args.predict_file}: answered {len(examples)} questions ({len(eval_set.features)} windows) in "
                          f"{seconds:.1f} s, {speed['questions_per_second']} questions/s, "
                          f"{recorded_threshold_label(settings, [])}; predictions.json and nbest.json in "
                          f"{args.output_dir}")

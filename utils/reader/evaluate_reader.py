"""`train_reader.py --do_train false`: a trained reader evaluated on a labelled file, or answering the questions of
an unlabelled one, exactly as it was trained: its recorded null threshold and decoding settings apply, and what
that threshold was tuned on is said."""

import os
import time

import torch

from utils.errors import UserError
from utils.files.jsonfiles import write_json
from utils.files.squad import is_impossible, load_questions, load_squad
from utils.loop.fit import evaluate_without_grad
from utils.reader.config import DataConfig, DecodingConfig, WindowConfig
from utils.reader.decoding import apply_null_threshold
from utils.reader.reader_task import ReaderTask, prepare_eval_set
from utils.reader.trained import ReaderSettings, fingerprint, load_qa_model
from utils.runtime.output_dir import publish_dir
from utils.runtime.process import finish


def recorded_threshold_label(recorded: ReaderSettings | None, examples: list[dict]) -> str:
    """What the threshold predictions.json uses is, in words."""
    if recorded is None:
        return "with no recorded null threshold (no reader_settings.json): threshold 0, transformers' pipeline rule"
    if recorded.null_threshold is None:
        return "with no null threshold: the model was trained on SQuAD v1.1 data and always answers"
    tuned = recorded.null_threshold_tuned_on or {}
    source = ("tuned on this very file: an upper bound" if tuned.get("fingerprint") == fingerprint(examples)
              else f"tuned on {tuned['data']}, {tuned['questions']} questions" if tuned else "recorded")
    return f"at the model's recorded null threshold ({recorded.null_threshold:.3f}, {source})"


def check_evaluation(model_dir: str, output_dir: str, validation_file: str | None, predict_file: str | None) -> None:
    """--do_train false's own checks, before anything is loaded."""
    if not (validation_file or predict_file):
        raise UserError("--do_train false needs --validation_file (evaluate) or --predict_file (predict)")
    if validation_file and predict_file:
        raise UserError("give --validation_file or --predict_file, not both: each writes predictions.json")
    if os.path.abspath(output_dir) == os.path.abspath(model_dir):
        raise UserError("--output_dir is the model directory: give another one, the model's own "
                        "predictions.json and eval_results.json would be overwritten")


def evaluate_reader(accelerator, tokenizer, collate, model_dir: str, output_dir: str, data: DataConfig,
                    predict_file: str | None, batch_size: int, window_config: WindowConfig,
                    decoding_config: DecodingConfig):
    """--do_train false: evaluate the reader of `model_dir` on data.validation_file (its first max_eval_samples),
    or answer `predict_file`, as it was saved, with its recorded null threshold (reader_settings.json; a QA model
    without one gets threshold 0, the pipeline's rule), writing to `output_dir`. On SQuAD v1.1 data every question
    has an answer, so the model always answers there. `window_config` and `decoding_config`: the flags', which
    default to the recorded ones (train_reader.py)."""
    recorded = ReaderSettings.load(model_dir)
    model = accelerator.prepare(load_qa_model(model_dir))
    model.eval()
    with publish_dir(accelerator, output_dir, state="evaluated") as out:  # all or nothing, nothing stale
        _evaluate_or_predict(accelerator, tokenizer, collate, model_dir, output_dir, data, predict_file, batch_size,
                             window_config, decoding_config, recorded, model, out)
    finish(accelerator)


def _evaluate_or_predict(accelerator, tokenizer, collate, model_dir, output_dir, data, predict_file, batch_size,
                         window_config, decoding_config, recorded, model, out):
    if data.validation_file:
        examples, _ = load_squad(data.validation_file)
        examples = examples[: data.max_eval_samples] if data.max_eval_samples else examples
        unanswerable = sum(is_impossible(ex) for ex in examples)
        eval_set = prepare_eval_set(accelerator, tokenizer, examples, window_config, batch_size, collate,
                                    name=data.validation_file)
        task = ReaderTask(accelerator, tokenizer, eval_set, unanswerable > 0, window_config, decoding_config,
                          (recorded or ReaderSettings()) if unanswerable else None)
        result = evaluate_without_grad(task, model)
        m = result["metrics"]
        if unanswerable:
            label = recorded_threshold_label(recorded, examples)
            lines = [f"{data.validation_file}: {len(examples)} questions, {unanswerable} unanswerable",
                     f"  {label}: EM {m['recorded_exact']:.2f} F1 {m['recorded_f1']:.2f} (predictions.json)",
                     f"  at threshold 0: EM {m['exact']:.2f} F1 {m['f1']:.2f} (HasAns F1 {m['HasAns_f1']:.2f}, NoAns "
                     f"{m['NoAns_f1']:.2f})",
                     f"  at the threshold tuned on this file ({m['null_threshold']:.3f}, an upper bound): EM "
                     f"{m['tuned_exact']:.2f} F1 {m['tuned_f1']:.2f}"]
            note = (f"recorded_*: predictions.json, {label}; exact/f1/HasAns/NoAns: threshold 0; tuned_*: the "
                    "threshold tuned on this file, an upper bound")
        else:
            label = "SQuAD v1.1 data: every question has an answer, so the model always answers"
            lines = [f"{data.validation_file}: {len(examples)} questions, all answerable",
                     f"  EM {m['exact']:.2f} F1 {m['f1']:.2f} (predictions.json; {label})"]
            note = label
        accelerator.print("\n".join(lines))
        task.write_outputs(out, result)
        write_json(accelerator, os.path.join(out, "eval_results.json"),
                   {"model": model_dir, "file": data.validation_file, "metrics": m,
                    "predictions_null_threshold": m.get("recorded_null_threshold"), "note": note})
    if predict_file:
        examples = load_questions(predict_file, need_context=True)
        threshold = recorded.null_threshold if recorded else 0.0
        start = time.perf_counter()
        eval_set = prepare_eval_set(accelerator, tokenizer, examples, window_config, batch_size, collate,
                                    name=predict_file)
        task = ReaderTask(accelerator, tokenizer, eval_set, False, window_config, decoding_config, recorded)
        with torch.no_grad():
            decoded = task.spans(model, eval_set)
        seconds = time.perf_counter() - start
        predictions = apply_null_threshold(decoded, threshold)
        write_json(accelerator, os.path.join(out, "predictions.json"), predictions)
        write_json(accelerator, os.path.join(out, "nbest.json"), {
            i: {"answer": predictions[i], "null_score": d["null_score"], "null_minus_best": d["null_minus_best"],
                "nbest": d["nbest"]} for i, d in decoded.items()})
        speed = {"questions": len(examples), "windows": len(eval_set.windows), "seconds": round(seconds, 2),
                 "questions_per_second": round(len(examples) / seconds, 2), "null_threshold": threshold,
                 "precision": accelerator.mixed_precision, "processes": accelerator.num_processes}
        write_json(accelerator, os.path.join(out, "predict_results.json"), speed)
        accelerator.print(f"{predict_file}: answered {len(examples)} questions ({len(eval_set.windows)} windows) in "
                          f"{seconds:.1f} s, {speed['questions_per_second']} questions/s, "
                          f"{recorded_threshold_label(recorded, [])}; predictions.json and nbest.json in "
                          f"{output_dir}")

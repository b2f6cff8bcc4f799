"""The reader as a task of the shared training loop, and the reader's evaluate/predict mode.

`ReaderTask` tells `utils.training` how a span-extraction model trains on SQuAD windows (loss over real tokens
only), evaluates (EM/F1, the no-answer threshold tuned on dev for SQuAD v2), saves (weights, tokenizer and
reader_settings.json) and reports (predictions.json, null_scores.json). `evaluate_or_predict` is
`train_reader.py --do_train false`: a trained reader evaluated or answering questions as it was trained.
"""

import hashlib
import os
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from utils.errors import UserError
from utils.features_cache import cached_map
from utils.qa_decoding import apply_null_threshold
from utils.qa_features import prepare_eval_features, prepare_train_features
from utils.qa_metrics import best_null_threshold, squad_metrics
from utils.reader import MODEL_INPUTS, ReaderSettings, decode, fingerprint, load_qa_model, span_logits
from utils.runtime import finish, write_json
from utils.squad_data import is_impossible, load_squad
from utils.training import Task, evaluate, load_weights


def tokenize(accelerator, args, tokenizer, examples, for_training: bool):
    fn = prepare_train_features if for_training else prepare_eval_features
    vocab = hashlib.sha256(tokenizer.backend_tokenizer.to_str().encode()).hexdigest()
    settings = dict(max_seq_length=args.max_seq_length, doc_stride=args.doc_stride,
                    max_query_length=args.max_query_length)
    return cached_map(accelerator, examples, fn, dict(tokenizer=tokenizer, **settings), dict(vocab=vocab, **settings),
                      args.cache_dir, args.preprocessing_num_workers)


@dataclass
class Split:
    """Examples to answer, their windows, and a prepared loader over the windows (in order)."""

    examples: list[dict]
    features: object  # datasets.Dataset with example_id and offset_mapping
    loader: DataLoader


def prepare_split(accelerator, args, tokenizer, examples, collate) -> Split:
    features = tokenize(accelerator, args, tokenizer, examples, for_training=False)
    if len(features) == 0:
        raise UserError("no evaluation windows after tokenisation")
    inputs = [c for c in MODEL_INPUTS if c in features.column_names]
    loader = DataLoader(features.select_columns(inputs), batch_size=args.per_device_eval_batch_size, collate_fn=collate)
    return Split(examples, features, accelerator.prepare(loader))



class ReaderTask(Task):
    tracker_project = "qa-amp-reader"
    samples_name = "windows"

    def __init__(self, accelerator, args, tokenizer, dev: Split, with_no_answer, recorded: ReaderSettings | None = None):
        """`recorded`: the settings of a trained reader being evaluated as it is; its threshold is then the one
        predictions use (and `recorded_*` metrics report), next to threshold 0 and the threshold tuned on `dev`."""
        self.accelerator, self.args, self.tokenizer = accelerator, args, tokenizer
        self.dev, self.with_no_answer, self.recorded = dev, with_no_answer, recorded
        self.null_threshold = None  # of the latest evaluation: what the weights saved next answer with
        self.dev_fingerprint = fingerprint(dev.examples)

    @property
    def metric_directions(self) -> dict[str, str]:
        """What `evaluate` reports, from the same functions: squad_metrics' EM/F1 for this dev set (HasAns/NoAns only
        where such questions exist), then for SQuAD v2 the same at the dev-tuned threshold; all higher-is-better
        (the question counts and the threshold itself are not choosable)."""
        refs = {ex["id"]: ex["answers"]["text"] for ex in self.dev.examples}
        names = [k for k in squad_metrics(refs, dict.fromkeys(refs, "")) if not k.endswith("total")]
        if self.with_no_answer:
            names += [f"tuned_{k}" for k in names]
        return dict.fromkeys(names, "max")

    def compute_loss(self, model, batch):
        """Mean of the start and end cross-entropies over real tokens only. (transformers' own QA loss also
        spreads probability over padding, so it would change with each batch's padded width.)"""
        labels = (batch["start_positions"], batch["end_positions"])
        out = model(**{k: v for k, v in batch.items() if k in MODEL_INPUTS})
        padding = batch["attention_mask"] == 0
        return sum(F.cross_entropy(logits.float().masked_fill(padding, -1e4), target)
                   for logits, target in zip((out.start_logits, out.end_logits), labels)) / 2

    def decode(self, model, split: Split) -> dict:
        """The same decoding as utils.reader.Reader, with the windows' logits gathered across processes: padded to
        a common width, without the duplicates that even batching adds."""
        acc = self.accelerator
        gather = lambda t: acc.gather_for_metrics(acc.pad_across_processes(t, dim=1, pad_index=-1e4))  # noqa: E731
        starts, ends = span_logits(model, split.loader, gather)
        return decode(split.examples, split.features, starts, ends, self.args)

    def evaluate(self, model) -> dict:
        decoded = self.decode(model, self.dev)
        refs = {ex["id"]: ex["answers"]["text"] for ex in self.dev.examples}
        if not self.with_no_answer:  # SQuAD v1.1: every question has an answer, no threshold
            predictions = apply_null_threshold(decoded, None)
            metrics = squad_metrics(refs, predictions)
        else:
            metrics = squad_metrics(refs, apply_null_threshold(decoded, 0.0))
            _, threshold = best_null_threshold(refs, {i: d["text"] for i, d in decoded.items()},
                                               {i: d["null_minus_best"] for i, d in decoded.items()})
            predictions = apply_null_threshold(decoded, threshold)
            metrics.update({f"tuned_{k}": v for k, v in squad_metrics(refs, predictions).items() if "total" not in k})
            metrics["null_threshold"] = threshold
        if self.recorded is not None:
            predictions = apply_null_threshold(decoded, self.recorded.null_threshold)
            metrics.update({f"recorded_{k}": v for k, v in squad_metrics(refs, predictions).items() if "total" not in k})
            metrics["recorded_null_threshold"] = self.recorded.null_threshold
        self.null_threshold = metrics.get("null_threshold")
        return {"metrics": metrics, "predictions": predictions, "decoded": decoded}

    def headline(self, m: dict) -> str:
        line = f"EM {m['exact']:.2f} F1 {m['f1']:.2f}"
        if "HasAns_f1" in m and "NoAns_f1" in m:
            line += (f" (HasAns F1 {m['HasAns_f1']:.2f}, NoAns {m['NoAns_f1']:.2f}); at the dev-tuned null threshold "
                     f"{m['null_threshold']:.3f}: EM {m['tuned_exact']:.2f} F1 {m['tuned_f1']:.2f}")
        return line

    def save(self, model, directory, state_dict):
        """Weights (fp32 master weights; safetensors, transformers 5), tokenizer and reader_settings.json: the
        windowing and the null threshold of the evaluation that chose these weights (tuned on dev for SQuAD v2,
        none, i.e. always answer, for v1.1), the one its predictions.json used."""
        model.save_pretrained(directory, state_dict=state_dict)
        self.tokenizer.save_pretrained(directory)
        a = self.args
        tuned_on = None if self.null_threshold is None else {
            "data": a.validation_file or (f"{a.train_file} (--dev_split {a.dev_split})" if a.dev_split
                                          else f"{a.dataset_name} validation"),
            "questions": len(self.dev.examples), "fingerprint": self.dev_fingerprint}
        ReaderSettings(a.max_seq_length, a.doc_stride, a.max_query_length, a.n_best_size, a.max_answer_length,
                       self.null_threshold, tuned_on).save(directory)

    def write_outputs(self, directory, result):
        write_json(self.accelerator, os.path.join(directory, "predictions.json"), result["predictions"])
        write_json(self.accelerator, os.path.join(directory, "null_scores.json"),
                   {i: d["null_minus_best"] for i, d in result["decoded"].items()})

    def summary(self, result):
        return {"predictions_null_threshold": result["metrics"].get("null_threshold")}

    def load(self, model, directory):
        load_weights(model, os.path.join(directory, "model.safetensors"))


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
    if args.validation_file:
        examples, _ = load_squad(args.validation_file)
        examples = examples[: args.max_eval_samples] if args.max_eval_samples else examples
        unanswerable = sum(is_impossible(ex) for ex in examples)
        split = prepare_split(accelerator, args, tokenizer, examples, collate)
        task = ReaderTask(accelerator, args, tokenizer, split, unanswerable > 0,
                          (settings or ReaderSettings()) if unanswerable else None)
        result = evaluate(task, model)
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
        task.write_outputs(args.output_dir, result)
        write_json(accelerator, os.path.join(args.output_dir, "eval_results.json"),
                   {"model": args.model_name_or_path, "file": args.validation_file, "metrics": m,
                    "predictions_null_threshold": m.get("recorded_null_threshold"), "note": note})
    if args.predict_file:
        examples, _ = load_squad(args.predict_file, labelled=False)
        threshold = settings.null_threshold if settings else 0.0
        start = time.perf_counter()
        split = prepare_split(accelerator, args, tokenizer, examples, collate)
        task = ReaderTask(accelerator, args, tokenizer, split, False, settings)
        with torch.no_grad():
            decoded = task.decode(model, split)
        seconds = time.perf_counter() - start
        predictions = apply_null_threshold(decoded, threshold)
        write_json(accelerator, os.path.join(args.output_dir, "predictions.json"), predictions)
        write_json(accelerator, os.path.join(args.output_dir, "nbest.json"), {
            i: {"answer": predictions[i], "null_score": d["null_score"], "null_minus_best": d["null_minus_best"],
                "nbest": d["nbest"]} for i, d in decoded.items()})
        speed = {"questions": len(examples), "windows": len(split.features), "seconds": round(seconds, 2),
                 "questions_per_second": round(len(examples) / seconds, 2), "null_threshold": threshold,
                 "precision": accelerator.mixed_precision, "processes": accelerator.num_processes}
        write_json(accelerator, os.path.join(args.output_dir, "predict_results.json"), speed)
        accelerator.print(f"{args.predict_file}: answered {len(examples)} questions ({len(split.features)} windows) in "
                          f"{seconds:.1f} s, {speed['questions_per_second']} questions/s, "
                          f"{recorded_threshold_label(settings, [])}; predictions.json and nbest.json in "
                          f"{args.output_dir}")
    finish(accelerator)

"""The reader as a task of the shared training loop (utils.loop.task): how a span-extraction model trains on SQuAD
windows (loss over real tokens only), evaluates (EM/F1, the no-answer threshold tuned on dev for SQuAD v2),
saves (weights, tokenizer and reader_settings.json) and reports (predictions.json, null_scores.json)."""

import os
from dataclasses import dataclass

import torch.nn.functional as F
from accelerate.utils import send_to_device
from torch.utils.data import DataLoader

from utils.errors import UserError
from utils.files.jsonfiles import write_json
from utils.loop.checkpoints import load_weights
from utils.loop.task import Task
from utils.reader.config import DecodingConfig, WindowConfig
from utils.reader.decoding import MODEL_INPUTS, apply_null_threshold, decode_examples, span_logits
from utils.reader.distillation import Teacher, without_projection
from utils.reader.groups import QuestionGroups
from utils.reader.metrics import best_null_threshold, squad_metrics
from utils.reader.shared_norm import allowed_positions, shared_norm_loss
from utils.reader.trained import ReaderSettings, fingerprint, normalization
from utils.reader.windows_cache import tokenize_windows


@dataclass
class EvalSet:
    """Examples to answer (the dev set, or questions to predict), their windows, and a prepared loader over the
    windows in order."""

    examples: list[dict]
    windows: object  # datasets.Dataset with example_id and offset_mapping
    loader: DataLoader
    name: str | None = None  # the examples in words, recorded with a null threshold tuned on them


def prepare_eval_set(accelerator, tokenizer, examples: list[dict], window_config: WindowConfig, batch_size: int,
                     collate, name: str | None = None) -> EvalSet:
    """`examples` in windows, and a loader over them of `batch_size` windows per process, in order."""
    windows = tokenize_windows(accelerator, tokenizer, examples, window_config, labels="offsets")
    if len(windows) == 0:
        raise UserError("no evaluation windows after tokenisation")
    inputs = [c for c in MODEL_INPUTS if c in windows.column_names]
    loader = DataLoader(windows.select_columns(inputs), batch_size=batch_size, collate_fn=collate)
    return EvalSet(examples, windows, accelerator.prepare(loader), name)


class ReaderTask(Task):
    tracker_project = "qa-amp-reader"
    samples_name = "windows"
    passages_per_question = 1  # a paragraph at a time, each window its own softmax

    def __init__(self, accelerator, tokenizer, dev: EvalSet, with_no_answer: bool, window_config: WindowConfig,
                 decoding_config: DecodingConfig, recorded: ReaderSettings | None = None,
                 teacher: Teacher | None = None):
        """`with_no_answer`: the data holds unanswerable questions (SQuAD v2), so a null threshold is tuned.
        `window_config`: the windows `dev` was cut into, recorded with the weights. `recorded`: the settings of a
        trained reader being evaluated as it is; its threshold is then the one predictions use (and `recorded_*`
        metrics report), next to threshold 0 and the threshold tuned on `dev`. `teacher`: a reader whose
        distributions the loss mixes in (utils.reader.distillation)."""
        self.accelerator, self.tokenizer, self.teacher = accelerator, tokenizer, teacher
        self.window_config, self.decoding_config = window_config, decoding_config
        self.dev, self.with_no_answer, self.recorded = dev, with_no_answer, recorded
        self.null_threshold = None  # of the latest evaluation: what the weights saved next answer with
        self.dev_fingerprint = fingerprint(dev.examples)
        # the no-answer rule: a reader trained with shared normalization (or being evaluated as one) has one per
        # question, over all its windows (utils.reader.decoding)
        self.shared_norm = recorded.shared_norm if recorded is not None else self.passages_per_question > 1

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
        """Mean of the start and end cross-entropies over real tokens only (transformers' own QA loss also
        spreads probability over padding, so it would change with each batch's padded width); with a teacher, mixed
        with its distributions over each window's context and [CLS], the positions an answer can take
        (utils.reader.distillation): a shared-normalization teacher never learned its logits on the question."""
        inputs = {k: v for k, v in batch.items() if k in MODEL_INPUTS}
        if self.teacher is not None and self.teacher.layer_pairs:  # the intermediate stage: layers, not answers
            return self.teacher.intermediate_loss(model, inputs)
        labels = (batch["start_positions"], batch["end_positions"])
        out = model(**inputs)
        padding = batch["attention_mask"] == 0
        loss = sum(F.cross_entropy(logits.float().masked_fill(padding, -1e4), target)
                   for logits, target in zip((out.start_logits, out.end_logits), labels)) / 2
        if self.teacher is not None:
            allowed = allowed_positions(batch["context_start"], batch["context_end"], padding.shape[1])
            loss = self.teacher.mixed(loss, out.start_logits, out.end_logits, inputs,
                                      allowed=allowed.to(padding.device))
        return loss

    def spans(self, model, eval_set: EvalSet) -> dict:
        """The same decoding as utils.reader.Reader.spans, with the windows' logits gathered across processes: padded to
        a common width, without the duplicates that even batching adds."""
        acc = self.accelerator
        gather = lambda t: acc.gather_for_metrics(acc.pad_across_processes(t, dim=1, pad_index=-1e4))  # noqa: E731
        starts, ends = span_logits(model, eval_set.loader, gather)
        return decode_examples(eval_set.examples, eval_set.windows, starts, ends, self.decoding_config,
                               shared_norm=self.shared_norm)

    def evaluate(self, model) -> dict:
        decoded = self.spans(model, self.dev)
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
            metrics.update({f"recorded_{k}": v for k, v in squad_metrics(refs, predictions).items()
                            if "total" not in k})
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
        model.save_pretrained(directory, state_dict=without_projection(state_dict))
        self.tokenizer.save_pretrained(directory)
        tuned_on = None if self.null_threshold is None else {
            "data": self.dev.name, "questions": len(self.dev.examples), "fingerprint": self.dev_fingerprint}
        ReaderSettings.from_configs(
            self.window_config, self.decoding_config, null_threshold=self.null_threshold,
            null_threshold_tuned_on=tuned_on, precision=self.accelerator.mixed_precision,
            normalization=normalization(self.shared_norm), passages_per_question=self.passages_per_question,
            teacher=None if self.teacher is None else self.teacher.record()).save(directory)

    def write_outputs(self, directory, result):
        write_json(self.accelerator, os.path.join(directory, "predictions.json"), result["predictions"])
        write_json(self.accelerator, os.path.join(directory, "null_scores.json"),
                   {i: d["null_minus_best"] for i, d in result["decoded"].items()})

    def summary(self, result):
        return {"predictions_null_threshold": result["metrics"].get("null_threshold")}

    def load(self, model, directory):
        load_weights(model, os.path.join(directory, "model.safetensors"))


class SharedNormReaderTask(ReaderTask):
    """The reader trained with shared normalization (train_reader.py --passages_per_question M): the loader yields
    question indices, a batch is all the windows of the passages those questions read this epoch
    (utils.reader.groups), and the loss shares one softmax per question across them (utils.reader.shared_norm).
    Evaluation, saving and outputs are the reader's, with the one no-answer per question rule."""

    samples_name = "questions"

    def __init__(self, accelerator, tokenizer, dev: EvalSet, with_no_answer: bool, window_config: WindowConfig,
                 decoding_config: DecodingConfig, groups: QuestionGroups, teacher: Teacher | None = None):
        self.passages_per_question = groups.passages_per_question  # > 1: read (and recorded) with one softmax
        super().__init__(accelerator, tokenizer, dev, with_no_answer, window_config, decoding_config, teacher=teacher)
        self.groups = groups

    def model_inputs(self, batch):
        return send_to_device(self.groups.batch(batch.tolist(), self.epoch), self.accelerator.device)

    def compute_loss(self, model, batch):
        """The shared-normalization loss (utils.reader.shared_norm); with a teacher, mixed with its distributions
        over each question's windows, as the student's (utils.reader.distillation)."""
        inputs = {k: v for k, v in batch.items() if k in MODEL_INPUTS}
        if self.teacher is not None and self.teacher.layer_pairs:  # the intermediate stage: layers, not answers
            return self.teacher.intermediate_loss(model, inputs, batch["group"])
        out = model(**inputs)
        loss = shared_norm_loss(out.start_logits, out.end_logits, batch)
        if self.teacher is not None:
            loss = self.teacher.mixed(loss, out.start_logits, out.end_logits, inputs, allowed=batch["allowed"],
                                      group=batch["group"])
        return loss

    @staticmethod
    def samples_in(batch):
        return len(batch)  # the loader yields question indices

    def tokens_in(self, batch):
        return self.groups.tokens(batch.tolist(), self.epoch)

"""A trained reader: its settings file, the check that a directory holds one, and the Python API.

A reader trained by train_reader.py saves `reader_settings.json` beside its weights: the windowing and
span-decoding settings of the run and the null threshold it tuned on its dev set (with a fingerprint of the
questions it was tuned on). Everything that answers questions reads it and runs the same code: `Reader` (below),
and `train_reader.py --do_train false` (utils.reader.evaluate_reader), which is also how the run's own
evaluation decodes (utils.reader.decoding).

    from utils.reader import Reader
    reader = Reader("outputs/reader")                       # model, tokenizer and reader_settings.json
    for a in reader.answer([("Who built the loom?", "Ada built a loom in 1843.")]):
        print(a["answer"] or "(no answer)", a["score"])    # "" when the model judges it unanswerable

A directory without reader_settings.json (any transformers QA model) gets the defaults below and the
threshold-0 rule of transformers' pipeline (`handle_impossible_answer`).
"""

import hashlib
import json
import logging
import os
from dataclasses import dataclass
from typing import ClassVar

import torch
import transformers
from safetensors import safe_open
from torch.utils.data import DataLoader
from transformers import AutoConfig, AutoModelForQuestionAnswering, AutoTokenizer

from utils.errors import UserError
from utils.reader.decoding import MODEL_INPUTS, apply_null_threshold, decode_examples, span_logits
from utils.reader.windows import prepare_windows
from utils.runtime.batching import pad_batch
from utils.runtime.model_fingerprint import model_fingerprint
from utils.runtime.settings_file import SettingsFile

logger = logging.getLogger("qa-amp")


SETTINGS_FILE = "reader_settings.json"
# What a run writes beside the reader that does not change how it answers (its fingerprint leaves them out), with
# hidden entries (the run marker, a publication's staging) and subfolders (checkpoints, the best model)
RUN_RESULTS = ("eval_results.json", "predictions.json", "nbest.json", "null_scores.json", "train_log.jsonl")
# Heads older versions could train, by their prefix in model.safetensors: DPR's passage selection and an
# answerability verifier (its weight against the null score was "verifier_weight" in reader_settings.json). Neither
# scores spans, so their weights are ignored: a reader trained with one reads the same spans without it.
OLD_HEADS = {"passage_selection": "a passage-selection head", "answerability": "an answerability verifier"}


@dataclass
class ReaderSettings(SettingsFile):
    """How a reader turns a (question, context) pair into an answer."""
    FILE: ClassVar[str] = SETTINGS_FILE

    # The windows (utils.reader.config.WindowConfig) and the decoding (DecodingConfig): these defaults are the ones
    # a model without reader_settings.json is trained and read with, declared once here (the flags' help says them).
    max_seq_length: int = 384
    doc_stride: int = 128
    max_query_length: int = 64
    n_best_size: int = 20
    max_answer_length: int = 30
    # Predict "" when the null score beats the best span by more than this; None (a model trained on SQuAD v1.1
    # data, where every question has an answer) always answers.
    null_threshold: float | None = 0.0
    # What the threshold was tuned on: {"data": a description, "questions": N, "fingerprint": fingerprint(...)},
    # so that evaluating on that very data can say its score is an upper bound.
    null_threshold_tuned_on: dict | None = None
    # The autocast the run trained and evaluated with ("no", "bf16", "fp16"; None: not recorded, read as "no"): the
    # Reader API, the evaluation mode and the QA system read at it by default, as trained.
    precision: str | None = None
    # How it was trained: "window" (each window its own softmax: a paragraph at a time) or "question" (shared
    # normalization over all the windows of `passages_per_question` passages read with a question,
    # utils.reader.shared_norm): which no-answer rule it reads with (utils.reader.decoding, utils.system.answer).
    normalization: str = "window"
    passages_per_question: int = 1
    # A reader taught by a teacher (utils.reader.distillation): {"model", "weights_sha256", "weight", "temperature",
    # "distil_layers"}.
    teacher: dict | None = None

    @property
    def shared_norm(self) -> bool:
        return self.normalization == normalization(True)

    @classmethod
    def load(cls, directory: str) -> "ReaderSettings | None":
        """The settings saved in a model directory, None if it has none (or is a hub name). A setting this version
        no longer has (an older version's "passage_selection" or "verifier_weight") is ignored; a nonzero
        verifier weight is said, since the threshold saved beside it was tuned with the verifier's term."""
        found = cls.recorded(directory)
        if found is None:
            return None
        known, saved = found
        if saved.get("verifier_weight"):
            logger.warning("%s: its null threshold was tuned with an answerability verifier's term (weight %g), "
                           "which this version does not take: it abstains otherwise than the run that tuned it",
                           directory, saved["verifier_weight"])
        return cls(**known)


def normalization(shared_norm: bool) -> str:
    """The name of a reader's softmax and no-answer rule, as reader_settings.json and every output record it:
    "question" (shared normalization: one over all the windows a question reads) or "window" (one per window)."""
    return "question" if shared_norm else "window"


def fingerprint(examples: list[dict]) -> str:
    """A hash of the questions (ids, questions, contexts, answers), whatever file layout they were read from."""
    rows = [[ex["id"], ex["question"], ex["context"] or "", (ex["answers"] or {"text": []})["text"]] for ex in examples]
    return hashlib.sha256(json.dumps(rows, ensure_ascii=False).encode()).hexdigest()


def check_reader_dir(path: str) -> None:
    """A local directory holding a trained extractive QA model (its config and, where the weights are safetensors,
    the question-answering head): checked before anything is loaded or created, a one-line UserError otherwise."""
    if not os.path.isdir(path):
        raise UserError(f"{path}: no such directory (give a reader trained by train_reader.py, or another local "
                        "extractive QA model directory)")
    if not os.path.isfile(os.path.join(path, "config.json")):
        what = ("a retriever written by train_dpr.py" if os.path.isfile(os.path.join(path, "retriever_settings.json"))
                else "not a model directory")
        raise UserError(f"{path}: {what}, not a reader (no config.json)")
    weights = os.path.join(path, "model.safetensors")
    if os.path.isfile(weights):
        try:
            with safe_open(weights, "pt") as f:
                keys = list(f.keys())
        except Exception as err:  # safetensors raises its own error types
            raise UserError(f"{weights}: unreadable weights ({str(err).splitlines()[0]})") from None
        if not any(k.startswith("qa_outputs.") or ".qa_outputs." in k for k in keys):
            raise UserError(f"{path}: not a trained reader: its weights hold no question-answering head (qa_outputs); "
                            "give a directory written by train_reader.py or another extractive QA model")


def check_layers(path: str, num_hidden_layers: int | None) -> None:
    """`num_hidden_layers` (None: all) is a number of `path`'s layers that a model can start from: at least 1, at most
    as many as it has, of a model whose config counts them as num_hidden_layers."""
    if num_hidden_layers is None:
        return
    try:
        config = AutoConfig.from_pretrained(path)
    except (OSError, ValueError) as err:
        raise UserError(f"{path}: cannot load a model config ({str(err).splitlines()[0]})") from None
    have = getattr(config, "num_hidden_layers", None)
    if have is None:
        raise UserError(f"--num_hidden_layers: {config.model_type} does not count its layers as num_hidden_layers")
    if not 1 <= num_hidden_layers <= have:
        raise UserError(f"--num_hidden_layers {num_hidden_layers}: {path} has {have} layers; give 1 to {have}")


def load_qa_model(path: str, trained: bool = True, num_hidden_layers: int | None = None):
    """AutoModelForQuestionAnswering from `path`. `trained`: the checkpoint must hold the question-answering head
    (a base encoder, or a DPR encoder, would answer with a randomly initialised head). Training starts from any
    encoder: its new head is expected, and transformers' warning about it is silenced for this load only.
    `num_hidden_layers`: only the first N of its layers (check_layers; the rest of its weights are not loaded). A
    head saved by an older version (OLD_HEADS) is left out, said in one log line instead of transformers' report of
    weights it does not know."""
    weights_file = os.path.join(path, "model.safetensors")
    old_head = []
    if os.path.isfile(weights_file):
        with safe_open(weights_file, "pt") as f:
            old_head = sorted(k for k in f.keys() if k.split(".")[0] in OLD_HEADS)
    verbosity = transformers.utils.logging.get_verbosity()
    if not trained or old_head:  # transformers would report the heads it does not know
        transformers.utils.logging.set_verbosity_error()
    try:
        layers = {} if num_hidden_layers is None else {"num_hidden_layers": num_hidden_layers}
        model, info = AutoModelForQuestionAnswering.from_pretrained(path, output_loading_info=True, **layers)
    except (OSError, ValueError) as err:
        raise UserError(f"{path}: cannot load a QA model ({str(err).splitlines()[0]})") from None
    finally:
        transformers.utils.logging.set_verbosity(verbosity)
    missing = sorted(info["missing_keys"])
    if missing and trained:
        raise UserError(f"{path}: not a trained reader: its checkpoint lacks {', '.join(missing[:2])}, so the "
                        "question-answering head would be random; give a directory written by train_reader.py or "
                        "another extractive QA model")
    if missing:
        logger.info("%s: the question-answering head (%s) starts from random weights", path, ", ".join(missing[:2]))
    if old_head:
        described = " and ".join(sorted({OLD_HEADS[k.split(".")[0]] for k in old_head}))
        logger.warning("%s: ignoring %s: %s saved by an older version, which this version does not use (the spans it "
                       "reads are the same without it)", path, ", ".join(old_head), described)
    return model


class Reader:
    """A trained reader loaded once; `answer` takes (question, context) pairs in batches."""

    def __init__(self, model_dir: str, device: str | None = None, batch_size: int = 64,
                 mixed_precision: str | None = None, sort_by_length: bool = False):
        """`mixed_precision`: "bf16" or "fp16" runs the forward passes under autocast (logits are decoded in fp32), "no"
        in fp32; default: the precision it was trained at (reader_settings.json), else "no". `sort_by_length`: batch
        windows of similar lengths (faster; the default batches them in order, as the training run's evaluation
        does, so that the logits, not only the answers, are the same)."""
        check_reader_dir(model_dir)
        self.model_dir, self._fingerprint = model_dir, None
        recorded = ReaderSettings.load(model_dir)
        self.settings = recorded or ReaderSettings()  # none recorded: threshold 0
        self.recorded = recorded is not None
        self.mixed_precision = mixed_precision or self.settings.precision or "no"
        if self.mixed_precision not in ("no", "bf16", "fp16"):
            raise UserError(f"reader precision {self.mixed_precision!r}: choose no, bf16 or fp16")
        if batch_size < 1:
            raise UserError(f"batch_size must be at least 1 (got {batch_size})")
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model = load_qa_model(model_dir).to(self.device).eval()
        self.batch_size, self.sort_by_length = batch_size, sort_by_length
        self.autocast = {"no": None, "bf16": torch.bfloat16, "fp16": torch.float16}[self.mixed_precision]


    @property
    def fingerprint(self) -> str:
        """Which reader gave an answer: a hash of its model's files (`files_fingerprint`)."""
        if self._fingerprint is None:
            self._fingerprint = self.files_fingerprint(self.model_dir)
        return self._fingerprint

    @staticmethod
    def files_fingerprint(model_dir: str) -> str:
        """A hash of the files of `model_dir` that make the reader answer as it does (weights, tokenizer, settings),
        not of its run's results, logs and checkpoints (utils.runtime.model_fingerprint)."""
        return model_fingerprint(model_dir, lambda path: os.sep in path or path.startswith(".") or path in RUN_RESULTS)

    def answer(self, pairs) -> list[dict]:
        """For each (question, context): {"answer" ("" = no answer), "score" (start+end logit of the best span),
        "null_minus_best" (what the threshold compares), "start"/"end" (character offsets, None for no answer),
        "nbest" (the best spans with their scores)}."""
        examples = [{"id": str(i), "question": q, "context": c} for i, (q, c) in enumerate(pairs)]
        decoded = self.spans(examples)
        answers = apply_null_threshold(decoded, self.settings.null_threshold)
        out = []
        for ex in examples:
            d, text = decoded[ex["id"]], answers[ex["id"]]
            span = d["nbest"][0] if text and d["nbest"] else None
            out.append({"answer": text, "score": d["score"], "null_minus_best": d["null_minus_best"],
                        "start": span and span["start"], "end": span and span["end"], "nbest": d["nbest"]})
        return out

    @torch.no_grad()
    def spans(self, examples: list[dict], progress: str | None = None) -> dict:
        """Windows, forward passes in batches of `batch_size` (padded as in evaluation), span decoding. `progress`
        names a progress bar over the windows; the no-answer rule is the one it was trained for."""
        s = self.settings
        windows = prepare_windows({k: [ex[k] for ex in examples] for k in ("id", "question", "context")},
                                   self.tokenizer, s.max_seq_length, s.doc_stride, s.max_query_length, labels="offsets")
        inputs = [k for k in MODEL_INPUTS if k in windows]
        rows = [{k: windows[k][i] for k in inputs} for i in range(len(windows["input_ids"]))]
        order = list(range(len(rows)))
        if self.sort_by_length:
            order.sort(key=lambda i: -len(rows[i]["input_ids"]))
        loader = DataLoader([rows[i] for i in order], batch_size=self.batch_size, collate_fn=lambda r: {
            k: v.to(self.device) for k, v in pad_batch(r, self.tokenizer.pad_token_id).items()})
        with torch.autocast(self.device.type, dtype=self.autocast, enabled=self.autocast is not None):
            outputs = span_logits(self.model, loader, progress=progress)
        position = {i: at for at, i in enumerate(order)}  # each window's place in the sorted batches
        starts, ends = ([xs[position[i]] for i in range(len(rows))] for xs in outputs)
        return decode_examples(examples, windows, starts, ends, s, shared_norm=s.shared_norm)

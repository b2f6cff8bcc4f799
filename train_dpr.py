"""Train a DPR retriever (question encoder + passage encoder) with Accelerate-managed mixed precision.

Runbook (from the repository root, after `pip install -r requirements.txt`):

  python train_dpr.py
      Offline demo: both encoders start from the packaged MiniLM, trained on the shipped DPR sample
      (data/sample/dpr_*.json, made from the reader sample by `python make_dpr_data.py`), CPU
      (its time and scores: docs/RESULTS.md). Prints top-k accuracy and MRR@10 before and after training.

  accelerate launch train_dpr.py --train_file train.json --validation_file dev.json --passages corpus.jsonl \
      --query_model_name_or_path bert-base-uncased --passage_model_name_or_path bert-base-uncased \
      --mixed_precision fp16 --per_device_train_batch_size 32 --num_hard_negatives 1 --export_dpr
      DPR JSON as in facebookresearch/DPR and Haystack 1.x. Under DDP every question sees every passage of
      the global batch as a negative; --grad_cache_chunk_size N trains a large batch in small memory.

  python train_dpr.py --train_file ../shared/data/dpr/train.json --validation_file ../shared/data/dpr/dev.json \
      --passages ../shared/data/dpr/passages.jsonl --mixed_precision bf16 --output_dir outputs/dpr-squad \
      --shared_encoder --per_device_train_batch_size 32 --learning_rate 5e-5 --num_train_epochs 2 \
      --refresh_negatives_every 100 --eval_steps 138 --checkpointing_steps 138 --eval_before_training false \
      --window_sentences 1 --num_hard_negatives 3
      The real-data run (its scores and time: docs/RESULTS.md): trained and ranked on sentences, evaluated dense,
      BM25 and hybrid.

Skeleton (as train_reader.py): config -> data -> model -> utils.loop.run (fit, validate, publish). The flags become
the configs utils/ takes (utils/retriever/config.py, utils/loop/config.py); the task is utils/retriever/dpr_task.py.
The output directory holds query_encoder/ and passage_encoder/ (each loads in SentenceTransformer(dir) and
AutoModel), with --export_dpr also dpr_question_encoder/ and dpr_context_encoder/, plus eval_results.json,
rankings.jsonl (per-question top passages) and train_log.jsonl.
"""

import logging
import os
from dataclasses import dataclass
from typing import Literal, Optional

from utils.errors import UserError, exit_on_user_error
from utils.loop.args import TrainArgs
from utils.loop.optim import build_optimizer
from utils.loop.run import run
from utils.loop.setup import setup
from utils.retriever.bi_encoder import bi_encoder_of, sentence_transformers_defaults
from utils.runtime.flags import arg, check_model_dir, packaged_minilm, parse_args, precision_as_trained
from utils.retriever.config import (EncoderConfig, LossConfig, NegativesConfig, ReaderDistillationConfig,
                                    RetrieverEvaluationConfig)
from utils.retriever.dpr_task import DPRTask
from utils.retriever.training_batches import load_training_data, training_loader
from utils.retriever.encoding import load_tokenizers
from utils.retriever.evaluate_retriever import evaluate_retriever
from utils.retriever.evaluation import RetrievalEvaluation, load_evaluation_data
from utils.retriever.reader_targets import fixed_on_resume
from utils.retriever.settings import PASSAGE_ENCODER, QUERY_ENCODER, RetrieverSettings

logger = logging.getLogger("qa-amp")
SAMPLE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "sample")


@dataclass
class DPRArgs(TrainArgs):
    do_train: bool = arg(True, "Train. With false, only evaluate --model_name_or_path on --validation_file and "
                         "--passages, ranking as it was trained (its retriever_settings.json).")
    model_name_or_path: Optional[str] = arg(None, "With --do_train false: a retriever trained by train_dpr.py (its "
                                            "output directory).")
    query_model_name_or_path: str = arg(packaged_minilm(), "Question encoder to start from (default: packaged MiniLM).")
    passage_model_name_or_path: str = arg(packaged_minilm(),
                                          "Passage encoder to start from (default: packaged MiniLM).")
    shared_encoder: bool = arg(False, "One encoder for questions and passages (--query_model_name_or_path).")
    pooling: Optional[Literal["cls", "mean"]] = arg(
        None, "How an encoder's token vectors become one embedding: 'cls' (the first token's, as in DPR) or 'mean' "
        "(over the real tokens). Default: what a sentence-transformers starting model was trained with, else 'cls'.")
    similarity: Optional[Literal["dot", "cosine"]] = arg(
        None, "Score of a question and a passage: 'dot' (inner product, DPR) or 'cosine' (inner product of "
        "normalised embeddings). Default: 'cosine' if the starting model normalises its embeddings, else 'dot'.")
    temperature: Optional[float] = arg(None, "Logits = similarity / temperature. Default 0.05 for cosine, 1 for dot.")
    embed_title: bool = arg(True, "Encode passages as the pair (title, text) rather than text alone.")
    train_file: Optional[str] = arg(None, "DPR JSON. Default: the shipped sample (data/sample/dpr_train.json).")
    validation_file: Optional[str] = arg(None, "DPR JSON for evaluation. Default: the shipped sample's dev file.")
    passages: Optional[str] = arg(None, "Corpus to rank at evaluation (JSON lines of title/text/passage_id). "
                                        "Default: the sample's corpus on the sample; else every context of the "
                                        "dev file.")
    index: Optional[str] = arg(None, "With --do_train false, instead of --passages: an index of the corpus built by "
                                     "index_corpus.py with this retriever; each process searches its share of the "
                                     "shards.")
    window_sentences: int = arg(
        0, "Retrieve windows of N consecutive sentences (each encoded with its passage's title), not whole passages: "
        "each question trains against the window of its positive passage that holds its answer, with windows as "
        "negatives, and a passage ranks by its best window (MaxP). 0: one vector per passage (DPR). Recorded in "
        "retriever_settings.json: the Retriever API and --do_train false index and rank the same way.")
    num_hard_negatives: int = arg(1, "Hard negatives per question (topped up from negative_ctxs, then random).")
    refresh_negatives_every: Optional[int] = arg(
        None, "Every N updates and at each epoch start, re-mine each training question's hard negatives with the "
        "model being trained (ANCE-style): the best-ranked training passages that are neither a positive nor "
        "contain an answer string.")
    reader: Optional[str] = arg(
        None, "Learn from this reader (trained by train_reader.py with --passages_per_question): at every negatives "
        "refresh it reads each training question's current top --distill_passages passages, and the loss mixes in "
        "KL(reader || retriever) over them, the reader's share of the answer per passage as the target (FiD-KD). "
        "Needs --refresh_negatives_every.")
    distill_passages: Optional[int] = arg(None, "With --reader: N, the top passages per question it reads. Default 4.")
    distillation_weight: Optional[float] = arg(None, "With --reader: w, the loss is (1 - w) x in-batch + w x KL. "
                                               "Default 0.5.")
    distillation_temperature: Optional[float] = arg(None, "With --reader: T, the target is softmax(reader's passage "
                                                    "log probabilities / T). Default 1.")
    group_by_length: bool = arg(False, "Batch questions whose passages have similar lengths (by the longest of each "
                                       "question's first passages). Off: --length_buckets already removes most "
                                       "padding.")
    length_buckets: int = arg(4, "Encode each batch's passages as N sub-batches of similar length, each padded "
                                 "only to its own longest (same embeddings, less padding); 1: one padded batch.")
    grad_cache_chunk_size: Optional[int] = arg(None, "GradCache: questions per forward chunk. The full batch's "
                                               "in-batch negatives at the memory of one chunk.")
    max_query_length: int = arg(64, "Question tokens.")
    max_passage_length: int = arg(256, "Passage tokens (title + text).")
    export_dpr: bool = arg(False, "Also write transformers DPRQuestionEncoder/DPRContextEncoder dirs (Haystack 1.x).")
    output_dir: str = arg("outputs/dpr", "Where the encoders, metrics, rankings and checkpoints go.")
    learning_rate: float = arg(2e-5, "Peak learning rate of AdamW.")
    num_train_epochs: Optional[float] = arg(None, "Training epochs (default 4 on the shipped sample, 2 otherwise).")
    metric_for_best_model: str = arg(
        "mrr@10", "Metric for best-model keeping and early stopping: top1, top5, top20, top100, mrr@10 (higher is "
        "better), mean_rank, in_batch_avg_rank (lower is better) of the dense ranking, or of a hybrid with BM25: "
        "hybrid_top1, rrf_mrr@10, ...")
    per_device_train_batch_size: int = arg(16, "Questions per micro-batch per process.")

    def use_shipped_sample(self) -> None:
        """No data given: the offline demo on the shipped DPR sample, with more passes (it is tiny)."""
        if self.validation_file or self.passages:
            raise UserError("--validation_file/--passages need a --train_file")
        self.train_file = os.path.join(SAMPLE_DIR, "dpr_train.json")
        self.validation_file = os.path.join(SAMPLE_DIR, "dpr_dev.json")
        self.passages = os.path.join(SAMPLE_DIR, "dpr_passages.jsonl")
        if self.num_train_epochs is None:
            self.num_train_epochs = 4.0

    def use_trained_retriever(self) -> None:
        """--do_train false: the encoders and every ranking setting come from the trained retriever's directory."""
        if self.train_file:
            raise UserError("--do_train false only evaluates: drop --train_file")
        if not self.model_name_or_path or not self.validation_file:
            raise UserError("--do_train false needs --model_name_or_path (a retriever trained by train_dpr.py) and "
                            "--validation_file")
        if os.path.abspath(self.output_dir) == os.path.abspath(self.model_name_or_path):
            raise UserError("--output_dir is the retriever's directory: give another one, its eval_results.json and "
                            "rankings.jsonl would be overwritten")
        recorded = RetrieverSettings.load(self.model_name_or_path)
        for name in ("pooling", "similarity", "temperature", "shared_encoder", "embed_title", "window_sentences",
                     "max_query_length", "max_passage_length"):
            setattr(self, name, getattr(recorded, name))
        if self.requested_precision is None:  # embed as the run did
            self.mixed_precision = precision_as_trained(recorded.precision)
        self.query_model_name_or_path = os.path.join(self.model_name_or_path, QUERY_ENCODER)
        # one encoder serves both sides when shared (the run saved it under both names)
        self.passage_model_name_or_path = os.path.join(
            self.model_name_or_path, QUERY_ENCODER if recorded.shared_encoder else PASSAGE_ENCODER)

    def validate(self):
        self.check_input_files("train_file", "validation_file", "passages")
        for name in ("query_model_name_or_path", "passage_model_name_or_path"):
            check_model_dir(getattr(self, name), name)
        if not self.do_train:
            self.use_trained_retriever()
        elif self.model_name_or_path:
            raise UserError("--model_name_or_path is the trained retriever of --do_train false; to train from an "
                            "encoder, give --query_model_name_or_path (and --passage_model_name_or_path)")
        elif self.train_file is None:
            self.use_shipped_sample()
        if self.num_train_epochs is None:
            self.num_train_epochs = 2.0
        if not self.validation_file:
            raise UserError("give --validation_file (DPR JSON) to evaluate retrieval")
        if self.index is not None and (self.do_train or self.passages):
            raise UserError("--index is for --do_train false, instead of --passages")
        if self.shared_encoder and self.passage_model_name_or_path != self.query_model_name_or_path \
                and self.passage_model_name_or_path != packaged_minilm():
            raise UserError("--shared_encoder uses --query_model_name_or_path only; drop --passage_model_name_or_path")
        st_pooling, st_normalize = sentence_transformers_defaults(self.query_model_name_or_path)
        self.pooling = self.pooling or st_pooling or "cls"
        self.similarity = self.similarity or ("cosine" if st_normalize else "dot")
        if self.temperature is None:
            self.temperature = 0.05 if self.similarity == "cosine" else 1.0
        for config in (EncoderConfig, NegativesConfig, LossConfig, RetrieverEvaluationConfig):
            self.config(config)  # their own checks, before anything is loaded
        self.reader_distillation_config()
        super().validate()

    def fixed_on_resume(self) -> dict:
        return fixed_on_resume(self.reader_distillation_config())  # a resume keeps its reader

    def reader_distillation_config(self) -> ReaderDistillationConfig | None:
        """What a reader adds to the loss (None: no --reader); its settings only with a reader."""
        given = {k: getattr(self, k) for k in ("distill_passages", "distillation_weight", "distillation_temperature")
                 if getattr(self, k) is not None}
        if self.reader is None:
            if given:
                raise UserError("--distill_passages, --distillation_weight and --distillation_temperature "
                                "need --reader")
            return None
        if not self.do_train:
            raise UserError("--reader teaches a training run: drop it with --do_train false")
        if not self.refresh_negatives_every:
            raise UserError("--reader needs --refresh_negatives_every N: the passages it reads are each question's "
                            "current top ones, found again at every refresh")
        return ReaderDistillationConfig(self.reader, **given)


@exit_on_user_error
def main(argv=None):
    # --- config --------------------------------------------------------------------------------------
    args = parse_args(DPRArgs, argv)
    encoders = args.config(EncoderConfig)  # the bi-encoder, and how it reads questions and passages
    negatives = args.config(NegativesConfig)  # what each question trains against besides its positive
    loss = args.config(LossConfig)
    eval_config = args.config(RetrieverEvaluationConfig)  # what the retriever is ranked on
    loop = args.loop_config()  # what the shared loop takes (utils.loop.config)
    accelerator = setup(loop, training=args.do_train)
    loss.check_distributed(accelerator.distributed_type)
    accelerator.print(f"encoders: pooling={encoders.pooling} similarity={encoders.similarity} temperature="
                      f"{loss.temperature} {'shared' if encoders.shared_encoder else 'separate'} "
                      f"hard_negatives={negatives.num_hard_negatives}")

    # --- data ----------------------------------------------------------------------------------------
    q_tok, p_tok = load_tokenizers(encoders.query_model_name_or_path, encoders.passage_model_name_or_path,
                                   encoders.shared_encoder, encoders.max_query_length, encoders.max_passage_length)
    dev = load_evaluation_data(eval_config, negatives)
    if not args.do_train:
        return evaluate_retriever(accelerator, args.model_name_or_path, args.output_dir, encoders, eval_config,
                                  q_tok, p_tok, dev)
    reader = args.reader_distillation_config()  # None, or the reader the retriever learns from
    data = load_training_data(args.train_file, args.max_train_samples, encoders, negatives, q_tok, p_tok,
                              reader.distill_passages if reader else 0)
    logger.info("train: %d questions x (1 positive + %d negatives); dev: %d questions; corpus: %d passages",
                len(data.questions), negatives.num_hard_negatives, len(dev.questions), len(dev.corpus))
    if len(data.questions) < args.per_device_train_batch_size * accelerator.num_processes:
        raise UserError(f"{args.train_file}: {len(data.questions)} questions are fewer than one global batch "
                        f"({args.per_device_train_batch_size} x {accelerator.num_processes} processes)")
    train_loader = training_loader(data, args.per_device_train_batch_size, args.seed, args.group_by_length)

    # --- model ---------------------------------------------------------------------------------------
    model = bi_encoder_of(encoders)
    if encoders.export_dpr and model.query_encoder.config.model_type != "bert":
        raise UserError(f"--export_dpr needs BERT-architecture encoders (got {model.query_encoder.config.model_type})")
    optimizer = build_optimizer(model, loop.optimizer, accelerator.device)
    model, optimizer, train_loader = accelerator.prepare(model, optimizer, train_loader)

    # --- fit, validate, publish ----------------------------------------------------------------------
    evaluation = RetrievalEvaluation(accelerator, encoders, eval_config, q_tok, p_tok, dev)
    task = DPRTask(accelerator, encoders, negatives, loss, data, evaluation, q_tok, p_tok, reader)
    run(accelerator, loop, task, model, optimizer, train_loader)


if __name__ == "__main__":
    main()

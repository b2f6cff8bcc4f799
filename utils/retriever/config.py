"""What the DPR retriever's training and evaluation take, parsed from train_dpr.py's command line: `EncoderConfig`
(the bi-encoder, how it reads questions and passages, the formats it is saved in), `NegativesConfig` (what each
question trains against besides its positive), `LossConfig` (the contrastive loss and how a step computes it),
`ReaderDistillationConfig` (what a trained reader adds to it: --reader), `RetrieverEvaluationConfig` (what a retriever
is ranked on), and the loop's settings whose defaults are DPR's (`DPRLoopConfig`, `DPROptimizerConfig`). Each field
is the flag of its name, with its help string and its checks beside it (the errors name the flag).
"""

from dataclasses import dataclass
from typing import Literal, Optional

from accelerate.utils import DistributedType

from utils.errors import UserError, check_at_least_one
from utils.loop.config import LoopConfig, OptimizerConfig, max_eval_samples_arg
from utils.reader.trained import ReaderSettings, check_reader_dir
from utils.runtime.flags import arg, packaged_minilm


@dataclass(frozen=True)
class EncoderConfig:
    query_model_name_or_path: str = arg(packaged_minilm(), "Question encoder to start from (default: packaged MiniLM).")
    passage_model_name_or_path: str = arg(packaged_minilm(),
                                          "Passage encoder to start from (default: packaged MiniLM).")
    shared_encoder: bool = arg(False, "One encoder for questions and passages (--query_model_name_or_path).")
    # None, here and in similarity: train_dpr.py's resolve fills them in from the starting model
    pooling: Optional[Literal["cls", "mean"]] = arg(
        None, "How an encoder's token vectors become one embedding: 'cls' (the first token's, as in DPR) or 'mean' "
        "(over the real tokens). Default: what a sentence-transformers starting model was trained with, else 'cls'.")
    similarity: Optional[Literal["dot", "cosine"]] = arg(
        None, "Score of a question and a passage: 'dot' (inner product, DPR) or 'cosine' (inner product of "
        "normalised embeddings). Default: 'cosine' if the starting model normalises its embeddings, else 'dot'.")
    embed_title: bool = arg(True, "Encode passages as the pair (title, text) rather than text alone.")
    # the unit trained on, mined and ranked
    window_sentences: int = arg(
        0, "Retrieve windows of N consecutive sentences (each encoded with its passage's title), not whole passages: "
        "each question trains against the window of its positive passage that holds its answer, with windows as "
        "negatives, and a passage ranks by its best window (MaxP). 0: one vector per passage (DPR). Recorded in "
        "retriever_settings.json: the Retriever API and --do_train false index and rank the same way.")
    length_buckets: int = arg(4, "Encode each batch's passages as N sub-batches of similar length, each padded "
                                 "only to its own longest (same embeddings, less padding); 1: one padded batch.")
    max_query_length: int = arg(64, "Question tokens.")
    max_passage_length: int = arg(256, "Passage tokens (title + text).")
    # transformers' DPR encoders pool the [CLS] token
    export_dpr: bool = arg(False, "Also write transformers DPRQuestionEncoder/DPRContextEncoder dirs (Haystack 1.x).")

    def __post_init__(self):
        if self.pooling not in ("cls", "mean", None):
            raise UserError(f"--pooling must be cls or mean (got {self.pooling})")
        if self.similarity not in ("dot", "cosine", None):
            raise UserError(f"--similarity must be dot or cosine (got {self.similarity})")
        if self.window_sentences < 0:
            raise UserError("--window_sentences must be >= 0 (0: whole passages)")
        check_at_least_one(self, "length_buckets")
        if self.export_dpr and self.pooling not in ("cls", None):
            raise UserError("--export_dpr needs --pooling cls: transformers' DPR encoders pool the [CLS] token")


@dataclass(frozen=True)
class NegativesConfig:
    # its hard negatives first, topped up from its negative_ctxs, then from other questions' positives
    num_hard_negatives: int = arg(1, "Hard negatives per question (topped up from negative_ctxs, then random).")
    refresh_negatives_every: Optional[int] = arg(
        None, "Every N updates and at each epoch start, re-mine each training question's hard negatives with the "
        "model being trained (ANCE-style): the best-ranked training passages that are neither a positive nor "
        "contain an answer string.")

    def __post_init__(self):
        if self.num_hard_negatives < 0:
            raise UserError("--num_hard_negatives must be >= 0")
        check_at_least_one(self, "refresh_negatives_every")
        if self.refresh_negatives_every and self.num_hard_negatives < 1:
            raise UserError("--refresh_negatives_every needs --num_hard_negatives of at least 1")


@dataclass(frozen=True)
class LossConfig:
    # None: train_dpr.py's resolve fills it in from the similarity
    temperature: Optional[float] = arg(None, "Logits = similarity / temperature. Default 0.05 for cosine, 1 for dot.")
    # the same loss and gradients as the whole batch at once
    grad_cache_chunk_size: Optional[int] = arg(None, "GradCache: questions per forward chunk. The full batch's "
                                               "in-batch negatives at the memory of one chunk.")

    def __post_init__(self):
        if self.temperature is not None and self.temperature <= 0:
            raise UserError("--temperature must be positive")
        check_at_least_one(self, "grad_cache_chunk_size")

    def check_distributed(self, distributed_type) -> None:
        """Refused before anything trains, once the hardware layout is known."""
        if self.grad_cache_chunk_size and distributed_type == DistributedType.DEEPSPEED:
            # Accelerate's DeepSpeed backward also steps the engine on sync steps, and GradCache calls backward
            # once per chunk: the optimizer would step once per chunk on partial gradients (and ZeRO-2
            # ignores no_sync).
            raise UserError("--grad_cache_chunk_size does not work under DeepSpeed (the engine would step once per "
                            "chunk); use DDP or FSDP, or a smaller --per_device_train_batch_size without GradCache")


@dataclass(frozen=True)
class ReaderDistillationConfig:
    # its share of each question's answer probability over the retriever's top passages is the target learned
    reader: Optional[str] = arg(
        None, "Learn from this reader (trained by train_reader.py with --passages_per_question): at every negatives "
        "refresh it reads each training question's current top --distill_passages passages, and the loss mixes in "
        "KL(reader || retriever) over them, the reader's share of the answer per passage as the target (FiD-KD). "
        "Needs --refresh_negatives_every.")
    distill_passages: Optional[int] = arg(None, "With --reader: N, the top passages per question it reads. Default 4.")
    distillation_weight: Optional[float] = arg(None, "With --reader: w, the loss is (1 - w) x in-batch + w x KL. "
                                               "Default 0.5.")
    # above 1 the target is flatter
    distillation_temperature: Optional[float] = arg(None, "With --reader: T, the target is softmax(reader's passage "
                                                    "log probabilities / T). Default 1.")

    def __post_init__(self):
        given = (self.distill_passages, self.distillation_weight, self.distillation_temperature)
        if self.reader is None:
            if any(v is not None for v in given):
                raise UserError("--distill_passages, --distillation_weight and --distillation_temperature "
                                "need --reader")
            return
        for name, default in (("distill_passages", 4), ("distillation_weight", 0.5), ("distillation_temperature", 1.0)):
            if getattr(self, name) is None:
                object.__setattr__(self, name, default)

    def check_reader(self) -> None:
        """The reader and the settings, checked once (it reads the reader's directory), when train_dpr.py's resolve
        knows the run trains and refreshes its negatives."""
        check_reader_dir(self.reader)
        if not (ReaderSettings.load(self.reader) or ReaderSettings()).shared_norm:
            raise UserError(f"--reader {self.reader}: it was trained a window at a time, so its scores do not compare "
                            "across passages; give a reader trained with --passages_per_question (shared "
                            "normalization)")
        if self.distill_passages < 2:
            raise UserError(f"--distill_passages {self.distill_passages}: give at least 2 (the target is a "
                            "distribution over them)")
        if not 0 < self.distillation_weight <= 1:
            raise UserError(f"--distillation_weight {self.distillation_weight}: give a share in (0, 1]")
        if self.distillation_temperature <= 0:
            raise UserError("--distillation_temperature must be positive")


@dataclass(frozen=True)
class RetrieverEvaluationConfig:
    # its questions, and their positives as the gold passages, ranked against the corpus (CorpusConfig: --passages,
    # default every context of this file; or with --do_train false an --index built with this retriever, each
    # process searching its share of the shards)
    validation_file: Optional[str] = arg(None, "DPR JSON for evaluation, ranked against --passages (default: every "
                                               "context of the file; on the shipped sample its corpus) or, with "
                                               "--do_train false, an --index built with this retriever. Default: the "
                                               "shipped sample's dev file.")
    max_eval_samples: Optional[int] = max_eval_samples_arg()

    def __post_init__(self):
        check_at_least_one(self, "max_eval_samples")


@dataclass(frozen=True)
class DPRLoopConfig(LoopConfig):
    """The loop's settings whose defaults and words are DPR's."""
    output_dir: str = arg("outputs/dpr", "Where the encoders, metrics, rankings and checkpoints go.")
    metric_for_best_model: str = arg(
        "mrr@10", "Metric for best-model keeping and early stopping: top1, top5, top20, top100, mrr@10 (higher is "
        "better), mean_rank, in_batch_avg_rank (lower is better) of the dense ranking, or of a hybrid with BM25: "
        "hybrid_top1, rrf_mrr@10, ...")
    num_train_epochs: Optional[float] = arg(None, "Training epochs (default 4 on the shipped sample, 2 otherwise).")
    per_device_train_batch_size: int = arg(16, "Questions per micro-batch per process.")
    group_by_length: bool = arg(False, "Batch questions whose passages have similar lengths (by the longest of each "
                                       "question's first passages). Off: --length_buckets already removes most "
                                       "padding.")


@dataclass(frozen=True)
class DPROptimizerConfig(OptimizerConfig):
    learning_rate: float = arg(2e-5, "Peak learning rate of AdamW.")

"""What the DPR retriever's training and evaluation take, as small typed configs built at the edge (train_dpr.py's
flags, DPRArgs.config) with their checks beside them: `EncoderConfig` (the bi-encoder, how it reads questions and
passages, the formats it is saved in), `NegativesConfig` (what each question trains against besides its positive),
`LossConfig` (the contrastive loss and how a step computes it), `ReaderDistillationConfig` (what a trained reader
adds to it: --reader) and `RetrieverEvaluationConfig` (what a retriever is ranked on, in which batches). Code below the
script reads its settings by name from these, never from the command line's namespace. A field's flag has the
field's name (`--window_sentences` is `EncoderConfig.window_sentences`): the errors name the flag.
"""

import os
from dataclasses import dataclass
from typing import Optional

from accelerate.utils import DistributedType

from utils.errors import UserError, check_at_least_one
from utils.reader.trained import ReaderSettings, check_reader_dir


@dataclass(frozen=True)
class EncoderConfig:
    query_model_name_or_path: str
    """The question encoder to start from (a directory or a hub name)."""
    passage_model_name_or_path: str
    """The passage encoder to start from; not read with shared_encoder."""
    shared_encoder: bool
    """One encoder, query_model_name_or_path's, for questions and passages."""
    pooling: str
    """How an encoder's token vectors become one embedding: "cls" (the first token's, as in DPR) or "mean" (over
    the real tokens)."""
    similarity: str
    """The score of a question and a passage: "dot" (inner product) or "cosine" (of normalised embeddings)."""
    embed_title: bool
    """A passage is encoded as the pair (title, text), else as its text alone."""
    window_sentences: int
    """0: a passage is one text; N: its windows of N consecutive sentences, each encoded with its passage's title,
    a passage ranking by its best window. The unit trained on, mined, and ranked."""
    max_query_length: int
    """Question tokens."""
    max_passage_length: int
    """Passage tokens (title and text)."""
    length_buckets: int
    """A batch's passages are encoded as this many sub-batches of similar length, each padded only to its own
    longest: the same embeddings, less padding."""
    export_dpr: bool
    """The trained encoders are also saved as transformers' DPRQuestionEncoder and DPRContextEncoder (Haystack 1.x),
    which pool the [CLS] token."""

    def __post_init__(self):
        if self.pooling not in ("cls", "mean"):
            raise UserError(f"--pooling must be cls or mean (got {self.pooling})")
        if self.similarity not in ("dot", "cosine"):
            raise UserError(f"--similarity must be dot or cosine (got {self.similarity})")
        if self.window_sentences < 0:
            raise UserError("--window_sentences must be >= 0 (0: whole passages)")
        check_at_least_one(self, "length_buckets")
        if self.export_dpr and self.pooling != "cls":
            raise UserError("--export_dpr needs --pooling cls: transformers' DPR encoders pool the [CLS] token")


@dataclass(frozen=True)
class NegativesConfig:
    num_hard_negatives: int
    """Negatives per question in its batch besides its positive: its hard negatives first, topped up from its
    negative_ctxs, then from other questions' positives."""
    refresh_negatives_every: Optional[int]
    """Every N updates and at each epoch start, re-mine each question's hard negatives with the model being
    trained (ANCE-style); None: they stay as first chosen."""
    seed: int
    """Seed of the random top-up: the first negatives are a pure function of the data and the seed."""

    def __post_init__(self):
        if self.num_hard_negatives < 0:
            raise UserError("--num_hard_negatives must be >= 0")
        check_at_least_one(self, "refresh_negatives_every")
        if self.refresh_negatives_every and self.num_hard_negatives < 1:
            raise UserError("--refresh_negatives_every needs --num_hard_negatives of at least 1")


@dataclass(frozen=True)
class LossConfig:
    temperature: float
    """Logits = similarity / temperature."""
    grad_cache_chunk_size: Optional[int]
    """GradCache: a step embeds and backpropagates this many questions (with their passages) at a time, for the
    same loss and gradients as the whole batch at once; None: the whole batch at once."""

    def __post_init__(self):
        if self.temperature <= 0:
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
    reader: str
    """A reader trained by train_reader.py with shared normalization (--passages_per_question): its share of each
    question's answer probability over the retriever's top passages is the target the retriever learns."""
    distill_passages: int = 4
    """N: per training question, the retriever's current top N passages (refreshed with the negatives) are read by
    the reader and make up the distribution learned."""
    distillation_weight: float = 0.5
    """w: the retriever's loss is (1 - w) x the in-batch loss + w x KL(reader || retriever) over the N passages."""
    distillation_temperature: float = 1.0
    """T: the target is the softmax of the reader's passage log-probabilities / T; above 1 it is flatter."""

    def __post_init__(self):
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
    validation_file: str
    """DPR JSON: the questions, and their positives as the gold passages."""
    passages: Optional[str]
    """The corpus file to rank (JSON lines of passages); None: every context of validation_file, or index's."""
    index: Optional[str]
    """Instead of passages: an index directory (index_corpus.py) of the corpus, its vectors searched, not embedded."""
    max_eval_samples: Optional[int]
    """Evaluate on the first N questions only (None: all)."""
    per_device_eval_batch_size: int
    """Texts per forward pass per process when embedding without gradients (evaluation, the negatives refresh)."""
    per_device_train_batch_size: int
    """Questions per process of a training batch: the in-batch rank ranks each positive among the passages of its
    training-style global batch."""

    def __post_init__(self):
        if self.index is not None and not os.path.isdir(self.index):
            raise UserError(f"--index {self.index}: no such directory")

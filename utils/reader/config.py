"""What the reader's training and evaluation take, as small typed configs built at the edge (train_reader.py's
flags, ReaderArgs) with their checks beside them: `WindowConfig` (how a question and its context become windows),
`DecodingConfig` (how the windows' logits become an answer), `PassagesConfig` (what a training question reads
besides its own paragraph), `DataConfig` (the training and dev examples), `ReaderEvaluationConfig` (`--do_train
false`: a trained reader evaluated or predicting) and `DistillationConfig` (a teacher's part in the loss). Code
below the script reads its settings by name from these, never from the command line's namespace. A field's flag
has the field's name (`--doc_stride` is `WindowConfig.doc_stride`): the errors name the flag.
"""

import os
from dataclasses import dataclass
from typing import Optional

from utils.errors import UserError, check_at_least_one


@dataclass(frozen=True)
class WindowConfig:
    # The defaults are the ones a model without reader_settings.json is trained and read with (ReaderSettings takes
    # them from here): declared once, where windows are configured.
    max_seq_length: int = 384
    """Tokens per window: the question, the context and the special tokens."""
    doc_stride: int = 128
    """Tokens of overlap between consecutive windows of a context longer than one window."""
    max_query_length: int = 64
    """A question is cut to this many tokens."""
    pad_to_max_length: bool = False
    """Pad every window of a batch to max_seq_length (static shapes), not to the batch's longest."""
    cache_dir: Optional[str] = None
    """Where tokenised windows are cached (None: ~/.cache/qa-amp)."""
    preprocessing_num_workers: Optional[int] = None
    """Processes that tokenise (datasets.map); None: this one."""

    def __post_init__(self):
        if self.max_query_length < 1 or self.max_seq_length < self.max_query_length + 16:
            raise UserError("--max_seq_length must leave room for the context after --max_query_length")
        context = self.max_seq_length - self.max_query_length - 3  # [CLS] question [SEP] context [SEP]
        if not 0 <= self.doc_stride < context:
            raise UserError(f"--doc_stride ({self.doc_stride}) must be smaller than the context part of a window "
                            f"(max_seq_length - max_query_length - 3 = {context})")
        check_at_least_one(self, "preprocessing_num_workers")

    @property
    def pad_multiple(self) -> int:
        """A batch is padded to a multiple of this: 8 (tensor-core friendly shapes), or max_seq_length itself."""
        return self.max_seq_length if self.pad_to_max_length else 8


@dataclass(frozen=True)
class DecodingConfig:
    n_best_size: int = 20  # the defaults: as WindowConfig's
    """Start and end candidates per window in span decoding, and spans kept per question (nbest.json)."""
    max_answer_length: int = 30
    """The longest answer span, in tokens."""

    def __post_init__(self):
        if self.n_best_size < 1 or self.max_answer_length < 1:
            raise UserError("--n_best_size and --max_answer_length must be at least 1")


@dataclass(frozen=True)
class PassagesConfig:
    passages: Optional[str] = None
    """The corpus (JSON lines of passages) the negative or retrieved passages come from; None: neither is read."""
    negative_passages: int = 0
    """Per training question and epoch, this many passages of the corpus without its answer, read as unanswerable
    windows (utils.reader.negative_passages)."""
    passages_per_question: int = 1
    """Each training question read with this many passages (its own and retrieved ones) under one softmax: shared
    normalization (utils.reader.groups, utils.reader.shared_norm); 1: a paragraph at a time."""
    retriever: Optional[str] = None
    """A retriever trained by train_dpr.py that ranks the corpus for each training question, as the QA system
    ranks with it; None: BM25."""
    index: Optional[str] = None
    """Instead of passages, with retriever: an index of the corpus that retriever built (index_corpus.py), whose
    shards the processes search; None: passages is indexed into the output directory by every process, each its
    shard."""

    def __post_init__(self):
        if self.negative_passages < 0:
            raise UserError("--negative_passages must be >= 0")
        if self.passages_per_question < 1:
            raise UserError("--passages_per_question must be at least 1")
        if self.negative_passages and self.shared_norm:
            raise UserError("--negative_passages and --passages_per_question are two ways to read retrieved passages: "
                            "give one")
        if self.index is not None:
            if self.retriever is None:
                raise UserError("--index is the --retriever's index of the corpus: give --retriever too")
            if self.passages is not None:
                raise UserError("give the corpus as --passages or as the retriever's --index, not both")
            if not os.path.isdir(self.index):
                raise UserError(f"--index {self.index}: no such directory")
        if self.retrieving and self.passages is None and self.index is None:
            raise UserError(f"{'--negative_passages N' if self.negative_passages else '--passages_per_question M'} "
                            "needs --passages (the corpus its passages come from)")
        if not self.retrieving and (self.passages is not None or self.index is not None):
            raise UserError(f"--{'passages' if self.passages is not None else 'index'} is for --negative_passages N "
                            "or --passages_per_question M (more than 1)")
        if self.retriever is not None and not self.retrieving:
            raise UserError("--retriever ranks --passages for --negative_passages N or --passages_per_question M")
        if self.retriever is not None and not os.path.isfile(os.path.join(self.retriever, "retriever_settings.json")):
            raise UserError(f"--retriever {self.retriever}: not a retriever trained by train_dpr.py (no "
                            "retriever_settings.json)")

    @property
    def shared_norm(self) -> bool:
        """Trained with shared normalization: one softmax, and one no-answer, per question."""
        return self.passages_per_question > 1

    @property
    def retrieving(self) -> bool:
        """Some training questions read passages of the corpus."""
        return self.negative_passages > 0 or self.shared_norm


@dataclass(frozen=True)
class DataConfig:
    train_file: Optional[str]
    """SQuAD-format training data (utils.files.squad); None with dataset_name."""
    validation_file: Optional[str]
    """SQuAD-format dev data; None with dev_split or dataset_name."""
    dev_split: Optional[float]
    """Instead of validation_file: this fraction of train_file's articles (whole articles) is the dev set."""
    dataset_name: Optional[str]
    """A Hugging Face hub dataset with train and validation splits, instead of files."""
    dataset_config_name: Optional[str]
    """The config of dataset_name."""
    max_train_samples: Optional[int]
    """Train on the first N examples only (None: all)."""
    max_eval_samples: Optional[int]
    """Evaluate on the first N dev examples only (None: all)."""
    seed: int
    """Seed of the articles dev_split draws."""

    def __post_init__(self):
        if self.dev_split is not None:
            if not 0 < self.dev_split < 1:
                raise UserError(f"--dev_split must be a fraction in (0, 1) (got {self.dev_split})")
            if self.validation_file or self.dataset_name:
                raise UserError("--dev_split carves the dev set out of --train_file; drop --validation_file")
        elif self.train_file and not self.validation_file:
            raise UserError("give --validation_file, or --dev_split F to hold out a fraction of the train articles")

    @property
    def dev_name(self) -> str:
        """The dev set in words: recorded with the null threshold tuned on it (reader_settings.json)."""
        return self.validation_file or (f"{self.train_file} (--dev_split {self.dev_split})" if self.dev_split
                                        else f"{self.dataset_name} validation")


@dataclass(frozen=True)
class ReaderEvaluationConfig:
    model_name_or_path: str
    """The trained reader, used as it was trained (its reader_settings.json)."""
    output_dir: str
    """Where predictions.json and the results go (not the model's own directory)."""
    validation_file: Optional[str]
    """Labelled questions to evaluate on (SQuAD format); or"""
    predict_file: Optional[str]
    """questions to answer (SQuAD format or JSON lines of {id, question, context})."""
    max_eval_samples: Optional[int]
    """Evaluate on the first N questions of validation_file only (None: all)."""
    per_device_eval_batch_size: int
    """Windows per forward pass per process."""

    def __post_init__(self):
        if not (self.validation_file or self.predict_file):
            raise UserError("--do_train false needs --validation_file (evaluate) or --predict_file (predict)")
        if self.validation_file and self.predict_file:
            raise UserError("give --validation_file or --predict_file, not both: each writes predictions.json")
        if os.path.abspath(self.output_dir) == os.path.abspath(self.model_name_or_path):
            raise UserError("--output_dir is the model directory: give another one, the model's own "
                            "predictions.json and eval_results.json would be overwritten")


@dataclass(frozen=True)
class DistillationConfig:
    teacher: Optional[str] = None
    """A trained reader whose start and end distributions the student learns (None: no teacher)."""
    distillation_weight: Optional[float] = None
    """w: the share of the loss that is the teacher's (the rest is the labels'); None: 0.5 for the prediction layer,
    none for the intermediate stage (its loss is the layers' alone)."""
    distillation_temperature: Optional[float] = None
    """T: both distributions are softmaxes of the logits / T; above 1 the teacher's second choices weigh more; None:
    2 for the prediction layer, none for the intermediate stage."""
    distil_layers: Optional[str] = None
    """The intermediate stage (TinyBERT): "S:T,..." pairs of a student layer and the teacher layer it learns (0: the
    embeddings, i: the output of layer i); None: the prediction layer."""

    @property
    def layer_pairs(self) -> tuple:
        """distil_layers as ((student layer, teacher layer), ...)."""
        if self.distil_layers is None:
            return ()
        try:
            pairs = tuple(tuple(int(x) for x in pair.split(":")) for pair in self.distil_layers.split(","))
        except ValueError:
            pairs = ((),)
        if any(len(p) != 2 or min(p) < 0 for p in pairs):
            raise UserError(f"--distil_layers {self.distil_layers}: give student:teacher layer pairs, e.g. "
                            "0:0,1:2,2:4,3:6 (0: the embeddings)")
        if len({s for s, _ in pairs}) != len(pairs):
            raise UserError(f"--distil_layers {self.distil_layers}: a student layer learns one teacher layer")
        return pairs

    def __post_init__(self):
        if self.layer_pairs:  # checked as it is built
            if self.distillation_weight is not None or self.distillation_temperature is not None:
                raise UserError("--distil_layers matches layers, which --distillation_weight and "
                                "--distillation_temperature do not weigh: drop --distillation_weight and "
                                "--distillation_temperature (they are the prediction layer's)")
            return
        if self.distillation_weight is None:  # the prediction layer's defaults
            object.__setattr__(self, "distillation_weight", 0.5)
        if self.distillation_temperature is None:
            object.__setattr__(self, "distillation_temperature", 2.0)
        if not 0 < self.distillation_weight <= 1:
            raise UserError(f"--distillation_weight {self.distillation_weight}: give a share in (0, 1]")
        if not self.distillation_temperature > 0:
            raise UserError(f"--distillation_temperature {self.distillation_temperature}: must be above 0")

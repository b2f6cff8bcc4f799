"""What the reader's training and evaluation take, parsed from train_reader.py's command line: `WindowConfig` (how a
question and its context become windows), `DecodingConfig` (how the windows' logits become an answer),
`PassagesConfig` (what a training question reads besides its own paragraph), `DataConfig` (the training and dev
examples), `DistillationConfig` (a teacher's part in the loss), and the loop's settings whose defaults are the
reader's (`ReaderLoopConfig`, `ReaderOptimizerConfig`). Each field is the flag of its name, with its help
string and its checks beside it (the errors name the flag); code below the script reads its settings from these.
"""

from dataclasses import dataclass
from typing import Optional

from utils.errors import UserError, check_at_least_one
from utils.index.config import RankedCorpusConfig
from utils.loop.config import LoopConfig, OptimizerConfig, max_eval_samples_arg, max_train_samples_arg
from utils.reader.trained import ReaderSettings
from utils.runtime.flags import arg


@dataclass(frozen=True)
class WindowConfig:
    # None: the model's recorded setting, else the default a reader without one is trained and read with (declared
    # once, on ReaderSettings); train_reader.py's resolve fills them in before any window is made.
    max_seq_length: Optional[int] = arg(None, "Tokens per window (question + context + special tokens). Default: "
                                        "the model's recorded setting (reader_settings.json), else "
                                        f"{ReaderSettings.max_seq_length}.")
    pad_to_max_length: bool = arg(False, "Pad every window to --max_seq_length (static shapes) instead of to the "
                                  "longest in the batch. Slower; for hardware that recompiles on new shapes.")
    doc_stride: Optional[int] = arg(None, "Overlap in tokens between consecutive windows of a long context. "
                                    f"Default: the model's recorded setting, else {ReaderSettings.doc_stride}.")
    max_query_length: Optional[int] = arg(None, "Questions are cut to this many tokens. Default: the model's "
                                          f"recorded setting, else {ReaderSettings.max_query_length}.")
    preprocessing_num_workers: Optional[int] = arg(None, "Processes for datasets.map tokenisation.")
    cache_dir: Optional[str] = arg(None, "Cache for tokenised datasets (default: ~/.cache/qa-amp).")

    def __post_init__(self):
        check_at_least_one(self, "preprocessing_num_workers")
        if None in (self.max_seq_length, self.doc_stride, self.max_query_length):
            return  # checked once resolved
        if self.max_query_length < 1 or self.max_seq_length < self.max_query_length + 16:
            raise UserError("--max_seq_length must leave room for the context after --max_query_length")
        context = self.max_seq_length - self.max_query_length - 3  # [CLS] question [SEP] context [SEP]
        if not 0 <= self.doc_stride < context:
            raise UserError(f"--doc_stride ({self.doc_stride}) must be smaller than the context part of a window "
                            f"(max_seq_length - max_query_length - 3 = {context})")

    @property
    def pad_multiple(self) -> int:
        """A batch is padded to a multiple of this: 8 (tensor-core friendly shapes), or max_seq_length itself."""
        return self.max_seq_length if self.pad_to_max_length else 8


@dataclass(frozen=True)
class DecodingConfig:
    n_best_size: Optional[int] = arg(None, "Start and end candidates per window in span decoding (and spans in "
                                     "nbest.json). Default: the model's recorded setting, else "
                                     f"{ReaderSettings.n_best_size}.")
    max_answer_length: Optional[int] = arg(None, "Longest answer span, in tokens. Default: the model's recorded "
                                           f"setting, else {ReaderSettings.max_answer_length}.")

    def __post_init__(self):
        if any(v is not None and v < 1 for v in (self.n_best_size, self.max_answer_length)):
            raise UserError("--n_best_size and --max_answer_length must be at least 1")


@dataclass(frozen=True)
class PassagesConfig:
    """Passages of the corpus (RankedCorpusConfig: --passages, or a --retriever's --index) read with each training
    question besides its own paragraph."""
    negative_passages: int = arg(0, "Per training question and epoch, N passages of --passages that hold none of its "
                                 "answer strings, read as unanswerable windows (drawn anew each epoch from its "
                                 "best-ranked ones): teaches a reader that will read retrieved passages to abstain.")
    # > 1: shared normalization (utils.reader.groups, utils.reader.shared_norm)
    passages_per_question: Optional[int] = arg(None, "Read each training question with M - 1 passages of --passages "
                                                     "retrieved for it beside its own paragraph (drawn anew each "
                                                     "epoch from its best-ranked ones; one holding an answer string "
                                                     "is a positive), all their windows sharing one softmax for the "
                                                     "start and one for the end (shared normalization): a reader "
                                                     "whose scores compare across the passages the QA system gives "
                                                     "it, with one no-answer decision per question. 1: one "
                                                     "paragraph at a time. Default: a trained reader's own (it "
                                                     "continues with its answer rule), else 1.")

    def __post_init__(self):
        if self.negative_passages < 0:
            raise UserError("--negative_passages must be >= 0")
        if self.passages_per_question is not None and self.passages_per_question < 1:
            raise UserError("--passages_per_question must be at least 1")
        if self.negative_passages and self.shared_norm:
            raise UserError("--negative_passages and --passages_per_question are two ways to read retrieved passages: "
                            "give one")

    def check_corpus(self, corpus: RankedCorpusConfig) -> None:
        """The corpus these passages come from, and what ranks it for each training question: BM25 over --passages,
        or a trained --retriever (which indexes --passages into output_dir/retriever_index by every process, each
        its shard, kept for qa_system.py --index; or searches its --index)."""
        if corpus.index is not None:
            if corpus.trained_retriever is None:
                raise UserError("--index is the --retriever's index of the corpus: give --retriever too")
            if corpus.passages is not None:
                raise UserError("give the corpus as --passages or as the retriever's --index, not both")
        if self.retrieving and corpus.passages is None and corpus.index is None:
            raise UserError(f"{'--negative_passages N' if self.negative_passages else '--passages_per_question M'} "
                            "needs --passages (the corpus its passages come from)")
        if not self.retrieving and (corpus.passages is not None or corpus.index is not None):
            raise UserError(f"--{'passages' if corpus.passages is not None else 'index'} is for --negative_passages N "
                            "or --passages_per_question M (more than 1)")
        if corpus.retriever is not None and not self.retrieving:
            raise UserError("--retriever ranks --passages for --negative_passages N or --passages_per_question M")

    @property
    def shared_norm(self) -> bool:
        """Trained with shared normalization: one softmax, and one no-answer, per question."""
        return (self.passages_per_question or 1) > 1

    @property
    def retrieving(self) -> bool:
        """Some training questions read passages of the corpus."""
        return self.negative_passages > 0 or self.shared_norm


@dataclass(frozen=True)
class DataConfig:
    train_file: Optional[str] = arg(None, "SQuAD v1.1/v2.0 JSON or flattened HF json/jsonl. Default: the shipped "
                                    "sample (data/sample/train.json) when no --dataset_name is given either.")
    validation_file: Optional[str] = arg(None, "Dev data in the same formats. Default: the shipped sample's dev "
                                         "file when training on the sample.")
    dev_split: Optional[float] = arg(None, "Instead of --validation_file: hold out this fraction of the train "
                                     "file's articles (by title, so no paragraph leaks) as the dev set.")
    dataset_name: Optional[str] = arg(None, "Hugging Face hub dataset (e.g. squad_v2) instead of files; needs "
                                      "network access.")
    dataset_config_name: Optional[str] = arg(None, "Config of --dataset_name.")
    max_train_samples: Optional[int] = max_train_samples_arg()
    max_eval_samples: Optional[int] = max_eval_samples_arg()

    def __post_init__(self):
        check_at_least_one(self, "max_train_samples", "max_eval_samples")

    def check_training(self) -> None:
        """A training run's data: its dev set given, or carved out of the training file (evaluating a trained reader
        reads validation_file alone, so train_reader.py's resolve runs these once it knows the run trains)."""
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
class DistillationConfig:
    teacher: Optional[str] = arg(None, "Distil from this trained reader (same tokenizer and windows): the loss mixes "
                                       "in its start and end distributions over the same windows, as the student is "
                                       "trained (per question under --passages_per_question; "
                                       "utils/reader/distillation.py).")
    # None: 0.5 for the prediction layer, none for the intermediate stage (its loss is the layers' alone)
    distillation_weight: Optional[float] = arg(None, "With --teacher: w, the teacher's share of the loss, (1 - w) x "
                                               "labels + w x T^2 x KL(teacher || student). Default 0.5 (none with "
                                               "--distil_layers).")
    # above 1 the teacher's second choices weigh more
    distillation_temperature: Optional[float] = arg(None, "With --teacher: T, the softmax temperature of both "
                                                    "distributions. Default 2 (none with --distil_layers).")
    distil_layers: Optional[str] = arg(None, "With --teacher: the intermediate stage (TinyBERT) instead of the "
                                       "prediction layer: student:teacher layer pairs, e.g. 0:0,1:2,2:4,3:6 (0: the "
                                       "embeddings), hidden states and attention matched; then distil the prediction "
                                       "layer from this run's output.")

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
        if self.teacher is None:
            if any(v is not None
                   for v in (self.distillation_weight, self.distillation_temperature, self.distil_layers)):
                raise UserError("--distillation_weight, --distillation_temperature and --distil_layers need --teacher")
            return
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


@dataclass(frozen=True)
class ReaderLoopConfig(LoopConfig):
    """The loop's settings whose defaults and words are the reader's."""
    output_dir: str = arg("outputs/reader", "Where the final model, metrics, predictions and checkpoints go.")
    metric_for_best_model: str = arg(
        "f1", "Metric that picks the best model and drives early stopping, all higher-is-better: exact, f1, "
        "HasAns_exact, HasAns_f1, NoAns_exact, NoAns_f1 (at null threshold 0; HasAns/NoAns where the dev set has such "
        "questions) and, on SQuAD v2 data, the same at the dev-tuned threshold: tuned_exact, tuned_f1, ...")
    num_train_epochs: Optional[float] = arg(None, "Training epochs (fractions allowed; default 8 on the shipped "
                                            "sample, 2 otherwise). Ignored if --max_train_steps is set.")
    per_device_train_batch_size: int = arg(16, "Micro-batch size per process: windows, or with "
                                               "--passages_per_question questions (with all their passages' windows).")
    group_by_length: bool = arg(True, "Batch windows of similar length together (random order across buckets) to "
                                      "cut padding; with --passages_per_question, questions by the longest window "
                                      "each reads in the epoch (every window of a batch is padded to its longest).")


@dataclass(frozen=True)
class ReaderOptimizerConfig(OptimizerConfig):
    learning_rate: float = arg(1e-4, "Peak learning rate of AdamW.")

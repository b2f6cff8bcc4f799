"""What the QA system is built from, checked in one place for every front end (qa_system.py, serve.py): the
retriever, the reader, the corpus (passages, or an index of them), and how they run. `SystemArgs` are the flags the
two scripts share; at the edge they become a `SystemConfig` (`SystemArgs.system_config`), which `build_system` takes:
nothing below the scripts reads a flag."""

import os
from dataclasses import dataclass, field
from typing import Literal, Optional

from utils.errors import UserError
from utils.reader.trained import Reader, check_reader_dir
from utils.retriever.index_writer import index_for_run
from utils.retriever.retriever import Retriever
from utils.retriever.settings import RetrieverSettings
from utils.runtime.flags import Flags, arg
from utils.search.index import Index
from utils.system.answer import check_settings, check_share
from utils.system.pipeline import QASystem


@dataclass(frozen=True)
class SystemConfig:
    """What a QA system is built from and how it runs (`build_system`)."""

    retriever: str  # a retriever's directory (train_dpr.py), or "bm25"
    reader: str  # a reader's directory (train_reader.py), or another extractive QA model's
    passages: str | None = None  # the corpus as a JSON-lines file, embedded when neither passages nor index is given
    hybrid: bool | None = None  # fuse the dense ranking with BM25 at the recorded weight; None: when it has one
    retriever_weight: float = 0.0  # how much a passage's retrieval score weighs on its answers (utils.system.answer)
    calibration: tuple | None = None  # (a, b[, share fitted on]) of the no-answer probability, sigmoid(a x + b)
    unanswerable_share: float | None = None  # the share of unanswerable questions expected (answer.at_share)
    precision: str | None = None  # autocast of both models ("no", "bf16", "fp16"); None: each model's own, as trained
    batch_size: int = 64  # texts per forward pass (questions, passages, reader windows)

    def __post_init__(self):
        if not self.retriever or not self.reader:
            raise UserError("give a retriever (a trained retriever or bm25) and a reader")
        if self.batch_size < 1:
            raise UserError(f"batch_size must be at least 1 (got {self.batch_size})")
        check_settings(self.retriever_weight, self.calibration, self.unanswerable_share)


@dataclass
class SystemArgs(Flags):
    retriever: str = arg(None, "A retriever trained by train_dpr.py (its output directory), or bm25.")
    reader: str = arg(None, "A reader trained by train_reader.py (its output directory, or another local extractive "
                            "QA model directory).")
    passages: Optional[str] = arg(None, "The corpus: JSON lines of {title, text, passage_id}.")
    index: Optional[str] = arg(None, "Instead of --passages: an index of the corpus (index_corpus.py, the Retriever "
                                     "API, or the index/ of a qa_system.py run).")
    hybrid: Optional[bool] = arg(None, "Fuse the dense ranking with BM25 at the retriever's recorded weight. "
                                       "Default: when the retriever has one.")
    no_answer_threshold: Optional[float] = arg(None, "The system's no-answer threshold, tuned before. Default: the "
                                                     "reader's recorded threshold.")
    retriever_weight: Optional[float] = arg(
        None, "How much the retriever's score of a passage weighs on the answers read in it (0: the reader's scores "
              "alone; utils/system/answer.py). Its scale is the retriever's, so tune it with the threshold: "
              "qa_system.py --validation_file does (and reports both per k). Default: tuned there, else 0.")
    no_answer_calibration: Optional[list[float]] = field(default=None, metadata={
        "help": "A B [SHARE]: the calibration of the probability of no answer, sigmoid(A x + B) of the log ratio x "
                "the threshold compares, and the share of unanswerable questions it was fitted on, as qa_system.py "
                "--validation_file fits them (its row for your k). Without it, no_answer_probability is the shared "
                "rule's uncalibrated one (none for a reader trained a paragraph at a time).", "nargs": "+"})
    unanswerable_share: Optional[float] = arg(
        None, "The share of questions you expect to have no answer, when it is not that of the questions the "
              "threshold was tuned on: the threshold and the probability of no answer move to it by its odds "
              "(utils/system/answer.py). Needs the calibration's SHARE. Default: the tuning questions' share.")
    mixed_precision: Optional[Literal["no", "fp16", "bf16"]] = arg(
        None, "Autocast precision of the encoders and the reader. Default: each model's own, the precision it was "
              "trained at (as trained).")
    batch_size: int = arg(64, "Texts per forward pass (questions, passages, reader windows).")

    def validate_system(self, fits_calibration: bool = False) -> None:
        """The models and the corpus, checked before anything is loaded or created (one-line errors).
        `fits_calibration`: the front end fits the calibration itself (qa_system.py --validation_file), so
        --unanswerable_share needs none given."""
        if not self.retriever or not self.reader:
            raise UserError("give --retriever (a trained retriever or bm25) and --reader")
        self.check_input_files("passages")
        check_reader_dir(self.reader)
        if self.retriever != "bm25":
            if not os.path.isdir(self.retriever):
                raise UserError(f"{self.retriever}: no such directory (give a retriever trained by train_dpr.py, or "
                                "bm25)")
            RetrieverSettings.load(self.retriever)
        if (self.passages is None) == (self.index is None):
            raise UserError("give the corpus as --passages, or as a saved --index (one of them)")
        if self.retriever == "bm25" and self.index:
            raise UserError("--index holds dense vectors: the BM25 retriever needs --passages")
        if self.index is not None and not os.path.isdir(self.index):
            raise UserError(f"--index {self.index}: no such directory")
        # the settings' own checks (SystemConfig); a front end that fits the calibration itself checks the share's
        # range alone, since the calibration it moves by is not fitted yet
        fitted_later = fits_calibration and self.no_answer_calibration is None
        self.system_config(with_share=not fitted_later)
        if fitted_later and self.unanswerable_share is not None and not 0 < self.unanswerable_share < 1:
            check_share(self.unanswerable_share, None)  # its range, in the same words

    def system_config(self, with_share: bool = True) -> SystemConfig:
        """The QA system these flags describe (after `validate_system`); without the expected share of unanswerable
        questions for a front end that moves its own settings to it (qa_system.py)."""
        calibration = tuple(self.no_answer_calibration) if self.no_answer_calibration is not None else None
        return SystemConfig(self.retriever, self.reader, self.passages, self.hybrid, self.retriever_weight or 0.0,
                            calibration, self.unanswerable_share if with_share else None, self.mixed_precision,
                            self.batch_size)


def build_system(config: SystemConfig, accelerator=None, passages: list[dict] | None = None, index: Index | None = None,
                 index_dir: str | None = None, progress: bool = True) -> QASystem:
    """The QA system of `config`: the reader and the retriever, each loaded once, and the corpus: `index` (loaded
    from --index), the `passages` (BM25 ranks them), or the config's passages file embedded now: with `index_dir`, by
    every process of `accelerator` into that directory, each its shard (utils.retriever.index_writer), each then
    searching its own shards; without, in memory. Progress bars on the main process."""
    main = accelerator is None or accelerator.is_main_process
    # None: a GPU if any
    device = None if accelerator is None else "cuda" if accelerator.device.type == "cuda" else "cpu"
    progress = progress and main
    reader = Reader(config.reader, device=device, batch_size=config.batch_size, precision=config.precision,
                    sort_by_length=True)
    if config.retriever == "bm25":
        return QASystem("bm25", reader, passages=passages, progress=progress,
                        retriever_weight=config.retriever_weight, calibration=config.calibration,
                        unanswerable_share=config.unanswerable_share)
    retriever = Retriever(config.retriever, device=device, batch_size=config.batch_size, precision=config.precision)
    if index is None:
        hybrid = retriever.settings.hybrid_by_default if config.hybrid is None else config.hybrid
        if index_dir is None:
            index = retriever.index(passages if passages is not None else config.passages, bm25=hybrid,
                                    progress=progress)
        else:
            index = index_for_run(accelerator, retriever, config.passages, index_dir, hybrid)
    return QASystem(retriever, reader, index=index, hybrid=config.hybrid, progress=progress,
                    retriever_weight=config.retriever_weight, calibration=config.calibration,
                    unanswerable_share=config.unanswerable_share)

"""What the QA system is built from, parsed and checked in one place for every front end (qa_system.py, serve.py):
`SystemConfig`, the retriever, the reader, the corpus (passages, or an index of them) and how they run, each field
the flag of its name; `build_system` makes the system of it, with the answer rule's settings (AnswerSettings)."""

import os
from dataclasses import dataclass
from typing import Literal, Optional

from utils.errors import UserError
from utils.index.index import Index
from utils.index.writer import index_for_run
from utils.reader.trained import Reader, check_reader_dir
from utils.retriever.retriever import Retriever
from utils.retriever.settings import RetrieverSettings
from utils.runtime.flags import arg, check_input_files
from utils.system.answer import AnswerSettings
from utils.system.pipeline import QASystem


@dataclass(frozen=True)
class SystemConfig:
    """What a QA system is built from and how it runs (`build_system`), checked before anything is loaded."""
    retriever: str = arg(None, "A retriever trained by train_dpr.py (its output directory), or bm25.")
    reader: str = arg(None, "A reader trained by train_reader.py (its output directory, or another local extractive "
                            "QA model directory).")
    passages: Optional[str] = arg(None, "The corpus: JSON lines of {title, text, passage_id}.")
    index: Optional[str] = arg(None, "Instead of --passages: an index of the corpus (index_corpus.py, the Retriever "
                                     "API, or the index/ of a qa_system.py run).")
    hybrid: Optional[bool] = arg(None, "Fuse the dense ranking with BM25 at the retriever's recorded weight. "
                                       "Default: when the retriever has one.")
    mixed_precision: Optional[Literal["no", "fp16", "bf16"]] = arg(
        None, "Autocast precision of the encoders and the reader. Default: each model's own, the precision it was "
              "trained at (as trained).")
    batch_size: int = arg(64, "Texts per forward pass (questions, passages, reader windows).")

    def __post_init__(self):
        if not self.retriever or not self.reader:
            raise UserError("give --retriever (a trained retriever or bm25) and --reader")
        check_input_files(self, "passages")
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
        if self.batch_size < 1:
            raise UserError(f"batch_size must be at least 1 (got {self.batch_size})")


def build_system(config: SystemConfig, rule: AnswerSettings, accelerator=None, passages: list[dict] | None = None,
                 index: Index | None = None, index_dir: str | None = None, progress: bool = True) -> QASystem:
    """The QA system of `config`, answering by `rule`'s weight, calibration and share (its threshold is the front
    end's to apply): the reader and the retriever, each loaded once, and the corpus: `index` (loaded from --index),
    the `passages` (BM25 ranks them), or the config's passages file embedded now: with `index_dir`, by every process
    of `accelerator` into that directory, each its shard (utils.index.writer), each then searching its own
    shards; without, in memory. Progress bars on the main process."""
    weight, calibration, share = rule.retriever_weight or 0.0, rule.no_answer_calibration, rule.unanswerable_share
    main = accelerator is None or accelerator.is_main_process
    # None: a GPU if any
    device = None if accelerator is None else "cuda" if accelerator.device.type == "cuda" else "cpu"
    progress = progress and main
    reader = Reader(config.reader, device=device, batch_size=config.batch_size, precision=config.mixed_precision,
                    sort_by_length=True)
    if config.retriever == "bm25":
        return QASystem("bm25", reader, passages=passages, progress=progress,
                        retriever_weight=weight, calibration=calibration, unanswerable_share=share)
    retriever = Retriever(config.retriever, device=device, batch_size=config.batch_size,
                          precision=config.mixed_precision)
    if index is None:
        hybrid = retriever.settings.hybrid_by_default if config.hybrid is None else config.hybrid
        if index_dir is None:
            index = retriever.index(passages if passages is not None else config.passages, bm25=hybrid,
                                    progress=progress)
        else:
            index = index_for_run(accelerator, retriever, config.passages, index_dir, hybrid)
    return QASystem(retriever, reader, index=index, hybrid=config.hybrid, progress=progress,
                    retriever_weight=weight, calibration=calibration, unanswerable_share=share)

"""What the QA system is built from, parsed and checked in one place for every front end (qa_system.py, serve.py):
`SystemConfig`, the corpus and what ranks it (the shared corpus flags), how the models run (the shared inference
flags), the reader, each field the flag of its name; `build_system` makes the system of it, with the answer rule's
settings (AnswerSettings)."""

from dataclasses import dataclass
from typing import Optional

from utils.errors import UserError, check_at_least_one
from utils.index.config import RankedCorpusConfig
from utils.index.index import Index
from utils.index.writer import index_for_run
from utils.reader.trained import Reader, check_reader_dir
from utils.retriever.retriever import Retriever
from utils.retriever.settings import RetrieverSettings
from utils.runtime.flags import arg
from utils.runtime.inference import InferenceConfig
from utils.system.answer import AnswerSettings
from utils.system.pipeline import QASystem


@dataclass(frozen=True)
class SystemConfig(RankedCorpusConfig, InferenceConfig):
    """What a QA system is built from and how it runs (`build_system`), checked before anything is loaded: the corpus
    and what ranks it (RankedCorpusConfig), how the models run (InferenceConfig), the reader and the hybrid."""
    reader: str = arg(None, "A reader trained by train_reader.py (its output directory, or another local extractive "
                            "QA model directory).")
    hybrid: Optional[bool] = arg(None, "Fuse the dense ranking with BM25 at the retriever's recorded weight. "
                                       "Default: when the retriever has one.")
    k: int = arg(5, "Passages read per question: for predictions.json (qa_system.py; at most the corpus), or when a "
                    "request does not say (serve.py; a request may ask for up to --max_k).", aliases=["--top_k"])

    def __post_init__(self):
        if not self.retriever or not self.reader:
            raise UserError("give --retriever (a trained retriever or bm25) and --reader")
        RankedCorpusConfig.__post_init__(self)
        check_reader_dir(self.reader)
        if self.trained_retriever:
            RetrieverSettings.load(self.retriever)
        self.check_one()
        InferenceConfig.__post_init__(self)
        check_at_least_one(self, "k")


def load_reader(config: SystemConfig, directory: str, device: str | None = None) -> Reader:
    """The reader in `directory` as the system runs it (`config`'s batch size and precision): --reader at the start,
    a new reader published into it at serve.py's reload."""
    return Reader(directory, device=device, batch_size=config.batch_size, mixed_precision=config.mixed_precision,
                  sort_by_length=True)


def build_system(config: SystemConfig, answer_settings: AnswerSettings, accelerator=None,
                 passages: list[dict] | None = None, index: Index | None = None, index_dir: str | None = None,
                 progress: bool = True) -> QASystem:
    """The QA system of `config`, answering by `rule`'s weight, calibration and share (its threshold is the front
    end's to apply): the reader and the retriever, each loaded once, and the corpus: `index` (loaded from --index),
    the `passages` (BM25 ranks them), or the config's passages file embedded now: with `index_dir`, by every process
    of `accelerator` into that directory, each its shard (utils.index.writer), each then searching its own
    shards; without, in memory. Progress bars on the main process."""
    weight, calibration = answer_settings.retriever_weight or 0.0, answer_settings.no_answer_calibration
    share = answer_settings.unanswerable_share
    main = accelerator is None or accelerator.is_main_process
    # None: a GPU if any
    device = None if accelerator is None else "cuda" if accelerator.device.type == "cuda" else "cpu"
    progress = progress and main
    reader = load_reader(config, config.reader, device)
    if config.retriever == "bm25":  # the passages given, or an index with its BM25 (index_corpus.py --retriever bm25)
        return QASystem("bm25", reader, passages=passages, index=None if passages is not None else index,
                        progress=progress, retriever_weight=weight, calibration=calibration,
                        unanswerable_share=share)
    retriever = Retriever(config.retriever, device=device, batch_size=config.batch_size,
                          mixed_precision=config.mixed_precision)
    if index is None:
        hybrid = retriever.settings.hybrid_by_default if config.hybrid is None else config.hybrid
        if index_dir is None:
            index = retriever.index(passages if passages is not None else config.passages, bm25=hybrid,
                                    progress=progress)
        else:
            index = index_for_run(accelerator, retriever, config.passages, index_dir, hybrid)
    return QASystem(retriever, reader, index=index, hybrid=config.hybrid, progress=progress,
                    retriever_weight=weight, calibration=calibration, unanswerable_share=share)

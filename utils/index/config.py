"""The corpus flags, declared once for every script that takes a corpus (train_reader.py, train_dpr.py,
index_corpus.py, qa_system.py, serve.py): `CorpusConfig` (the corpus as JSON lines, or as an index of them) and
`RankedCorpusConfig` (and what ranks it: a trained retriever, or BM25). Each path is checked as it is parsed; which
of them a script needs, and with what, is the script's own check (its `resolve`)."""

import os
from dataclasses import dataclass
from typing import Optional

from utils.errors import UserError
from utils.runtime.flags import arg, check_input_files

# what a retriever trained by train_dpr.py holds (utils.retriever.settings.SETTINGS_FILE, read there)
RETRIEVER_SETTINGS = "retriever_settings.json"


@dataclass(frozen=True)
class CorpusConfig:
    passages: Optional[str] = arg(None, "The corpus: JSON lines of {title, text, passage_id} (ingest_documents.py "
                                        "writes them from a folder of documents), read as a stream.")
    index: Optional[str] = arg(None, "Instead of --passages: an index of the corpus (index_corpus.py, the Retriever "
                                     "API, or the index/ of a qa_system.py run), searched where it lies.")

    def __post_init__(self):
        check_input_files(self, "passages")
        if self.index is not None and not os.path.isdir(self.index):
            raise UserError(f"--index {self.index}: no such directory")

    def check_one(self) -> None:
        """The corpus given one way: as --passages or as an --index."""
        if (self.passages is None) == (self.index is None):
            raise UserError("give the corpus as --passages, or as a saved --index (one of them)")


@dataclass(frozen=True)
class RankedCorpusConfig(CorpusConfig):
    retriever: Optional[str] = arg(None, "What ranks the corpus: a retriever trained by train_dpr.py (its output "
                                         "directory), or bm25.")

    def __post_init__(self):
        super().__post_init__()
        if self.retriever is not None and self.retriever != "bm25":
            if not os.path.isdir(self.retriever):
                raise UserError(f"--retriever {self.retriever}: no such directory (give a retriever trained by "
                                "train_dpr.py, or bm25)")
            if not os.path.isfile(os.path.join(self.retriever, RETRIEVER_SETTINGS)):
                raise UserError(f"--retriever {self.retriever}: not a retriever written by train_dpr.py (no "
                                f"{RETRIEVER_SETTINGS})")

    @property
    def trained_retriever(self) -> Optional[str]:
        """The trained retriever's directory; None for BM25 (or none given)."""
        return None if self.retriever in (None, "bm25") else self.retriever

"""How a trained retriever ranks, written beside its encoders (`retriever_settings.json`) so that everything that uses
it ranks exactly as its training run's evaluation did: the eval-only mode, the Retriever API and its index.

Without it, loading the encoders elsewhere (SentenceTransformer(dir).encode on whole paragraphs, say) silently
ranks another way than the one trained and measured: a sentence-trained encoder must index sentence windows and
rank a passage by its best one, questions must be cut at the same length, and the hybrid needs its dense weight.
"""

import os
from dataclasses import dataclass, field
from typing import ClassVar

from utils.errors import UserError
from utils.runtime.settings_file import SettingsFile

SETTINGS_FILE = "retriever_settings.json"
QUERY_ENCODER, PASSAGE_ENCODER = "query_encoder", "passage_encoder"


@dataclass
class RetrieverSettings(SettingsFile):
    FILE: ClassVar[str] = SETTINGS_FILE
    pooling: str  # "cls" or "mean"
    similarity: str  # "dot" or "cosine" (embeddings normalised)
    temperature: float  # the training loss's; ranking does not depend on it
    shared_encoder: bool
    embed_title: bool  # passages encoded as the pair (title, text)
    window_sentences: int  # 0: one vector per passage; N: windows of N sentences, a passage ranks by its best
    max_query_length: int
    max_passage_length: int
    # The hybrid with BM25: dense weight of the convex combination of per-question min-max normalised scores over
    # `hybrid_candidates` candidates of each ranking, tuned on the dev questions of the run (None: never tuned).
    hybrid_dense_weight: float | None = None
    hybrid_candidates: int = 100
    hybrid_tuned_on: dict | None = None  # {"data", "questions"}
    bm25: dict = field(default_factory=lambda: {"text": "title text", "stopwords": "en", "stemmer": "english"})
    # The autocast the run's evaluation embedded with ("no", "bf16", "fp16"): the Retriever API embeds the same
    # way by default, so that it ranks exactly as the run's rankings.jsonl.
    precision: str = "no"

    @property
    def hybrid_by_default(self) -> bool:
        """The ranking it is used with unless asked otherwise: the hybrid where a dense weight was tuned."""
        return self.hybrid_dense_weight is not None

    @classmethod
    def load(cls, directory: str) -> "RetrieverSettings":
        """The settings of a retriever directory written by train_dpr.py; a one-line UserError otherwise."""
        path = os.path.join(directory, SETTINGS_FILE)
        if not os.path.isdir(directory):
            raise UserError(f"{directory}: no such directory")
        if not os.path.isfile(path):
            raise UserError(f"{directory}: not a retriever written by train_dpr.py (no {SETTINGS_FILE})")
        try:
            settings = cls(**cls.recorded(directory)[0])
        except (ValueError, TypeError) as err:
            raise UserError(f"{path}: malformed ({err})") from None
        if settings.pooling not in ("cls", "mean") or settings.similarity not in ("dot", "cosine"):
            raise UserError(f"{path}: malformed (pooling {settings.pooling!r}, similarity {settings.similarity!r})")
        for side in (QUERY_ENCODER, PASSAGE_ENCODER):
            if not os.path.isfile(os.path.join(directory, side, "config.json")):
                raise UserError(f"{directory}: {side}/ is missing or holds no model")
        return settings

"""How trained models run where they are used, not trained (index_corpus.py, qa_system.py, serve.py), declared once:
their autocast and how many texts a forward pass takes."""

from dataclasses import dataclass
from typing import Literal, Optional

from utils.errors import check_at_least_one
from utils.runtime.flags import arg


@dataclass(frozen=True)
class InferenceConfig:
    mixed_precision: Optional[Literal["no", "fp16", "bf16"]] = arg(
        None, "Autocast of the models (the encoders, the reader). Default: each model's own, the precision it was "
              "trained at (as trained).")
    batch_size: int = arg(64, "Texts per forward pass (questions, passages, reader windows).")

    def __post_init__(self):
        check_at_least_one(self, "batch_size")

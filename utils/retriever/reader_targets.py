"""What a trained reader teaches the retriever (train_dpr.py --reader; FiD-KD, Izacard & Grave 2021): at every
negatives refresh a shared-normalization reader reads each training question's current top N passages, and the
target is softmax(passage score / T) over them, which the retriever's loss matches by KL (utils.retriever.dpr_task).
Each (question, passage) pair is read once and kept (checkpointed with the negatives).
"""

import time

import numpy as np
import torch
from accelerate.utils import gather_object

from utils.reader.distillation import weights_hash
from utils.reader.trained import Reader
from utils.retriever.config import ReaderDistillationConfig


CHUNK = 64  # (question, passage) pairs read together: a constant, so a pair's batch does not depend on the processes


def passage_log_probability(reading: dict) -> float:
    """log P(the answer starts in the passage) + log P(it ends in it), up to the question's normalisers (`reading`: a
    shared-normalization reader's decoding of it)."""
    # Context tokens only, [CLS] left out: finite however much mass the no-answer holds, so a passage the reader rules
    # out gets a target near 0, not no target. Shared normalization makes the scores of separate passages compare.
    return reading["context_start"] + reading["context_end"]


def top_passages(ranked: np.ndarray, unit_keys: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
    """(units, valid): per question (a row of `ranked`, unit indices best first, -1: none) its first `count` distinct
    passages, each as its best-ranked unit (`unit_keys`: each unit's passage key hash). A row that runs out of
    passages is padded with its first unit, marked not valid."""
    units = np.empty((len(ranked), count), dtype=np.int64)
    valid = np.zeros((len(ranked), count), dtype=bool)
    for i, row in enumerate(ranked):
        seen, chosen = set(), []
        for j in row:
            j = int(j)
            if len(chosen) == count:
                break
            if j >= 0 and unit_keys[j] not in seen:
                seen.add(unit_keys[j])
                chosen.append(j)
        valid[i, :len(chosen)] = True
        units[i] = chosen + [chosen[0] if chosen else int(row[0])] * (count - len(chosen))
    return units, valid


def fixed_on_resume(config: ReaderDistillationConfig | None) -> dict:
    """What a resumed run must share with this one (utils.loop.run's `fixed`): the reader by its weights, the passages
    it reads per question, the weight and temperature; a None reader without one."""
    if config is None:
        return {"reader": None}
    return {"reader": {"model": config.reader, "weights_sha256": weights_hash(config.reader)},
            "distill_passages": config.distill_passages, "distillation_weight": config.distillation_weight,
            "distillation_temperature": config.distillation_temperature}


class ReaderTargets:
    """The reader of a run and its readings, by (question index, passage key hash): loaded once on the run's device,
    in eval mode, at the run's precision; its readings are checkpointed (state_dict) with the negatives."""

    def __init__(self, accelerator, config: ReaderDistillationConfig, questions: list[str],
                 passage_texts: dict[int, str], batch_size: int):
        """`questions`: the training questions' texts; `passage_texts`: each training passage's whole text by its
        key hash (the reader reads passages, whatever unit the retriever ranks)."""
        self.accelerator, self.config = accelerator, config
        self.questions, self.passage_texts = questions, passage_texts
        self.reader = Reader(config.reader, device=str(accelerator.device), batch_size=batch_size,
                             mixed_precision=accelerator.mixed_precision)
        self.read: dict[tuple[int, int], float] = {}
        self.weights_sha256 = weights_hash(config.reader)

    def record(self) -> dict:
        """What eval_results.json says of the reader that taught the run."""
        c = self.config
        return {"model": c.reader, "weights_sha256": self.weights_sha256, "passages": c.distill_passages,
                "weight": c.distillation_weight, "temperature": c.distillation_temperature}

    def scores(self, units: np.ndarray, valid: np.ndarray, unit_keys: np.ndarray) -> tuple[np.ndarray, dict]:
        """(scores, record): each (question, unit)'s passage log probability (-inf where not valid), reading the
        pairs not read before; the record says how many were read and in how long."""
        t0 = time.perf_counter()
        pairs = sorted({(i, int(unit_keys[j])) for i, row in enumerate(units) for j, ok in zip(row, valid[i])
                        if ok} - self.read.keys())
        self._read_pairs(pairs)
        out = np.full(units.shape, -np.inf)
        for i, row in enumerate(units):
            for k, j in enumerate(row):
                if valid[i, k]:
                    out[i, k] = self.read[(i, int(unit_keys[j]))]
        return out, {"read": len(pairs), "read_seconds": round(time.perf_counter() - t0, 1)}

    def _read_pairs(self, pairs: list[tuple[int, int]]) -> None:
        acc = self.accelerator
        # Fixed-size chunks in a fixed order, dealt to the processes, and every reading gathered to all: a pair is read
        # in the same batch whatever the number of processes, so 2 processes (and a resumed run) get 1's targets.
        chunks = [pairs[s:s + CHUNK] for s in range(0, len(pairs), CHUNK)]
        mine = []
        for chunk in chunks[acc.process_index::acc.num_processes]:
            examples = [{"id": str(n), "question": self.questions[i], "context": self.passage_texts[h]}
                        for n, (i, h) in enumerate(chunk)]
            decoded = self.reader.spans(examples)
            mine.extend((i, h, passage_log_probability(decoded[str(n)])) for n, (i, h) in enumerate(chunk))
        for i, h, score in (gather_object(mine) if acc.num_processes > 1 else mine):
            self.read[(i, h)] = score

    def state_dict(self) -> dict:
        pairs = sorted(self.read)
        return {"questions": torch.tensor([i for i, _ in pairs], dtype=torch.long),
                "passages": torch.tensor([h for _, h in pairs], dtype=torch.long),
                "scores": torch.tensor([self.read[p] for p in pairs], dtype=torch.float64)}

    def load_state_dict(self, state: dict) -> None:
        self.read = dict(zip(zip(state["questions"].tolist(), state["passages"].tolist()), state["scores"].tolist()))

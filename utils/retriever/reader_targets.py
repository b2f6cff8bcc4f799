"""What a trained reader teaches the retriever (train_dpr.py --reader): the passages it can answer from.

The retriever learns from its reader as FiD-KD does (Izacard & Grave 2021, "Distilling Knowledge from Reader to
Retriever"; RDR, Yang & Seo): at every negatives refresh each training question's current top N passages (the
retriever's own ranking, a passage by its best window under --window_sentences) are read by the reader, and the
target is the reader's distribution over them; the retriever's loss adds KL(target || softmax(its scores /
temperature)) over the same N passages (utils.retriever.dpr_task).

The reader is one trained with shared normalization (utils.reader.shared_norm): its logits are one softmax over
every passage read with a question, so what it reads in one passage compares with what it reads in another, and
reading each passage on its own gives the log-sum-exps that combine (utils.reader.decoding, as the QA system reads).
A passage's score is the log of the answer's probability of starting in it plus that of ending in it, the mass of
the start and end softmaxes on its context tokens (the no-answer's [CLS] left out): `passage_log_probability`. The
target is softmax(score / T) over the question's N passages: the passage's share of the question's answer
probability. It credits every passage the reader finds the answer in, the gold paragraph or another, and a passage
the question's words match but that does not answer it gets little, which is what the dense retriever alone gets
wrong and BM25's help hides.

Reading is the cost: each (question, passage) pair is read once and kept (`ReaderTargets.read`, checkpointed with
the negatives), so a refresh reads only the pairs that entered a top N since. The pairs to read are split into
chunks of a fixed size in a fixed order and the chunks dealt to the processes: a pair is read in the same batch
whatever the number of processes, and every process gets every reading (so 2 processes train on the targets of 1,
and a resumed run on the interrupted one's).
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
    """log P(the answer starts in the passage) + log P(it ends in it), up to the question's normalisers: the share
    of a shared-normalization reader's start and end softmaxes on the passage's context tokens (`reading`: its
    decoding's "context_start" and "context_end", the log-sum-exps over those tokens; finite however much of the
    mass the no-answer holds, so a passage the reader rules out gets a target near 0, not no target)."""
    return reading["context_start"] + reading["context_end"]


def top_passages(ranked: np.ndarray, unit_keys: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
    """(units, valid): per question (a row of `ranked`, unit indices best first) its first `count` distinct
    passages, each as the first of its units ranked (its best window; `unit_keys`: each unit's passage key hash).
    A row that runs out of passages repeats its first unit, not valid."""
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
    """What teaches a run, which a resumed run must share with it (run's `fixed`, utils.loop.run): the reader
    by its weights, the passages it reads per question, the weight and temperature; none without a reader."""
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
                             precision=accelerator.mixed_precision)
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

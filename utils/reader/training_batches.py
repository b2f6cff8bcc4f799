"""The reader's training batches, one of two ways: the training examples' windows (with negative passages drawn
anew each epoch, utils.reader.negative_passages, where asked), a batch being windows; or, for shared normalization,
question groups (utils.reader.groups), a batch being questions, read with all the windows of the passages each
reads in the epoch. Either way batches group inputs of similar length (utils.runtime.batching)."""

import logging
from dataclasses import dataclass

import torch
from torch.utils.data import DataLoader

from utils.errors import UserError
from utils.reader.config import PassagesConfig, WindowConfig
from utils.reader.decoding import MODEL_INPUTS
from utils.reader.groups import QuestionGroups
from utils.reader.negative_passages import with_negative_passages
from utils.reader.windows_cache import tokenize_windows
from utils.runtime.batching import LengthGroupedBatchSampler

logger = logging.getLogger("qa-amp")


@dataclass
class TrainingBatches:
    loader: DataLoader
    groups: QuestionGroups | None  # shared normalization: what a batch of question indices reads; else None
    windows: int  # the training windows tokenised


def training_batches(accelerator, tokenizer, examples: list[dict], window_config: WindowConfig,
                     passage_config: PassagesConfig, collate, *, batch_size: int, group_by_length: bool,
                     seed: int, passages=None, rank=None) -> TrainingBatches:
    """The loader of `examples` for the shared loop: `batch_size` windows (or questions, with shared normalization)
    per process, in an order that is a pure function of (seed, epoch). `passages`: the corpus's passages read
    besides a question's own, where passage_config reads any (a list, or an index's passages); `rank`: how they are
    ranked (utils.reader.passages.ranked_passages; None: BM25)."""
    # Own generator: creating an iterator must not draw from the global RNG, or a resumed run's dropout masks would
    # differ from an uninterrupted run's.
    generator = torch.Generator().manual_seed(seed)
    if passage_config.shared_norm:  # each question with M - 1 retrieved passages, one softmax over their windows
        groups = QuestionGroups(accelerator, tokenizer, window_config, examples, passages,
                                passage_config.passages_per_question, seed, rank)
        sampler = LengthGroupedBatchSampler(groups.lengths, batch_size, seed, group_by_length)
        loader = DataLoader(list(range(len(groups))), batch_sampler=sampler, collate_fn=torch.tensor,
                            generator=generator)
        windows = int(groups.row_lengths.size)
        logger.info("train: %d questions, each with its paragraph and %d of a pool of up to %d retrieved passages "
                    "(%d windows tokenised)", len(groups), groups.count, max(len(p) for p in groups.pools), windows)
        return TrainingBatches(loader, groups, windows)
    windows = tokenize_windows(accelerator, tokenizer, examples, window_config, labels="answer")
    if len(windows) == 0:
        raise UserError("no training windows after tokenisation")
    epoch_items = None  # every window, every epoch
    if passage_config.negative_passages:  # + unanswerable windows from retrieved passages, drawn anew each epoch
        windows, epoch_items, pool = with_negative_passages(
            accelerator, tokenizer, window_config, examples, windows, passages, passage_config.negative_passages, seed,
            rank)
        logger.info("train: + %d negative passages per question per epoch, from a pool of %d",
                    passage_config.negative_passages, pool)
    inputs = [c for c in MODEL_INPUTS if c in windows.column_names]
    sampler = LengthGroupedBatchSampler([len(x) for x in windows["input_ids"]], batch_size, seed, group_by_length,
                                        epoch_items=epoch_items)
    loader = DataLoader(windows.select_columns(inputs + ["start_positions", "end_positions", "context_start",
                                                         "context_end"]),
                        batch_sampler=sampler, collate_fn=collate, generator=generator)
    return TrainingBatches(loader, None, len(windows))

"""Negative passages for a reader that will read retrieved passages: per training question, passages of a corpus
that hold none of its answer strings, read as unanswerable windows.

A reader trained on gold paragraphs alone answers from whatever passage it is given; in a pipeline most passages it
reads hold no answer, and nothing taught it to abstain there (DPR's reader training pairs each question with
retrieved passages without an answer; Haystack 1.x did not). Each question gets a pool of its best-ranked such
passages (BM25's), and every epoch draws `count` of them anew: a pure function of the seed and the epoch, so a
resumed run draws what the interrupted one would have.
"""

import datasets
import numpy as np

from utils.files.answers import answer_patterns, holds_answer, normalized
from utils.reader.config import WindowConfig
from utils.reader.passages import ranked_passages
from utils.reader.windows_cache import tokenize_windows
from utils.runtime.process import main_process_result

POOL_PER_NEGATIVE = 4  # a question's pool: this many candidates per negative drawn each epoch


def negative_pools(examples: list[dict], passages, ranked: list[list[int]], count: int) -> list[list[int]]:
    """Per example, the indices of its `POOL_PER_NEGATIVE x count` best-ranked passages (`ranked`:
    utils.reader.passages.ranked_passages, `negative_depth(count)` deep) that are not its own paragraph and hold none
    of its answer strings (utils.files.answers: normalised, whole tokens). Only the ranked passages are read."""
    pool = POOL_PER_NEGATIVE * count
    out = []
    for ex, row in zip(examples, ranked):
        own, answers = normalized(ex["context"]), answer_patterns(ex["answers"]["text"])
        keep = []
        for j in row:
            text = normalized(passages[j]["text"])
            if text != own and not holds_answer(text, answers):
                keep.append(int(j))
            if len(keep) == pool:
                break
        out.append(keep)
    return out


def negative_depth(count: int) -> int:
    """How deep a ranking the pools of `count` negatives per epoch read."""
    return POOL_PER_NEGATIVE * count + 20


def negative_examples(examples: list[dict], passages: list[dict], pools: list[list[int]]) -> list[dict]:
    """Every pool passage as an unanswerable example of its question (id "<question id>#neg<k>")."""
    return [{"id": f"{ex['id']}#neg{k}", "title": passages[j]["title"], "question": ex["question"],
             "context": passages[j]["text"], "answers": {"text": [], "answer_start": []}}
            for ex, pool in zip(examples, pools) for k, j in enumerate(pool)]


def epoch_negatives(pools: list[list[int]], count: int, first: int, seed: int):
    """`epoch -> indices` of the training windows of an epoch's negatives: `count` of each question's pool, drawn
    with (seed, epoch); the negatives' windows are numbered from `first`, pool after pool."""
    starts = np.concatenate([[0], np.cumsum([len(p) for p in pools])]) + first

    def draw(epoch: int) -> np.ndarray:
        rng = np.random.default_rng([seed, epoch, 7])
        chosen = [starts[i] + rng.choice(len(p), size=min(count, len(p)), replace=False)
                  for i, p in enumerate(pools) if p]
        return np.concatenate(chosen) if chosen else np.zeros(0, dtype=np.int64)

    return draw


def with_negative_passages(accelerator, tokenizer, window_config: WindowConfig, examples: list[dict],
                           windows: datasets.Dataset, passages, count: int, seed: int, rank=None):
    """(training windows, epoch -> window indices, pool size): `windows` (those of `examples`) followed by one
    unanswerable window per pool passage of `passages` (the corpus), and each epoch's choice (every real window,
    `count` negatives drawn per question with `seed`); `rank`: ranked_passages'."""
    ranked = ranked_passages(accelerator, examples, passages, negative_depth(count), rank)
    # Pooled once, by the main process, and shared: as utils.reader.groups does, for the same reason.
    pools = main_process_result(accelerator, lambda: negative_pools(examples, passages, ranked, count))
    negatives = tokenize_windows(accelerator, tokenizer, negative_examples(examples, passages, pools), window_config,
                                 labels="answer", one_window=True)
    columns = [c for c in windows.column_names if c in negatives.column_names]
    together = datasets.concatenate_datasets([windows.select_columns(columns), negatives.select_columns(columns)])
    real, draw = np.arange(len(windows)), epoch_negatives(pools, count, len(windows), seed)
    return together, lambda epoch: np.concatenate([real, draw(epoch)]), sum(len(p) for p in pools)

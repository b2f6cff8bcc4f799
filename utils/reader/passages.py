"""Retrieved passages for a reader trained the way the QA system uses it: each training question read together with
passages a retriever ranks high for it, all of them normalised together (utils.reader.shared_norm).

Per question, a pool of its best-ranked passages of a corpus (BM25's, or a trained retriever's: `rank`), its own
paragraph left out (it is always read); every epoch draws `passages_per_question - 1` of the pool anew, a pure
function of (seed, epoch, question), so a resumed run draws what the interrupted one would have. A retrieved passage
that holds one of an answerable question's answer strings (utils.files.answers: normalised, whole tokens) is trained
as a positive, every occurrence of the answer in it that the same matcher counts a target
(utils.files.answers.answer_spans), as facebookresearch/DPR's reader does: the QA system is right to answer from any
passage that says the answer, and calling it unanswerable would teach the reader to doubt the very passages it should
answer from. One where the string only matches after normalisation (other case or punctuation), so that no span of it
can be labelled, is left out of the pool: it is neither a clean positive nor a negative. Passages read with an
unanswerable question are all negatives.
"""

import numpy as np

from utils.files.answers import answer_patterns, answer_spans, holds_answer, normalized
from utils.runtime.process import main_process_result
from utils.search.bm25 import BM25

POOL_PER_PASSAGE = 4  # a question's pool: this many candidates per passage drawn each epoch


def pool_depth(count: int) -> int:
    """How deep a ranking pools of `count` passages drawn per epoch read: room for the pool, and for the question's
    own paragraph and the passages left out of it."""
    return POOL_PER_PASSAGE * count + 20


def ranked_passages(accelerator, examples: list[dict], passages, depth: int, rank=None) -> list[list[int]]:
    """Per example, the indices of its `depth` best-ranked passages of `passages` (the corpus: a list, or an index's
    passages), the same on every process: BM25's, ranked by the main process alone and shared (BM25 over a large
    corpus is not work to repeat on every process), or `rank(questions, depth)`'s ((scores, ids) per question, -1:
    none; a collective every process calls: train_reader.py --retriever, a trained retriever's ranking as the QA
    system ranks, each process searching its shards of the corpus's index)."""
    questions = [ex["question"] for ex in examples]
    if rank is None:
        ranked = main_process_result(accelerator, lambda: BM25(passages).search(questions, depth)[1])
    else:
        ranked = rank(questions, depth)[1]
    return [[int(j) for j in row if j >= 0] for row in ranked]


def passage_pools(examples: list[dict], passages, ranked: list[list[int]], count: int) -> list[list[dict]]:
    """Per example, its pool: up to POOL_PER_PASSAGE x `count` of its best-ranked passages (`ranked`, at least
    `pool_depth(count)` deep) other than its own paragraph, each {"passage": index, "spans": [(start, end)
    characters]} (spans empty: a negative). Only the ranked passages are read."""
    size = POOL_PER_PASSAGE * count
    pools = []
    for ex, row in zip(examples, ranked):
        own, answers = normalized(ex["context"]), ex["answers"]["text"]
        patterns = answer_patterns(answers)
        pool = []
        for j in row:
            text = passages[j]["text"]
            if normalized(text) == own:
                continue
            spans = answer_spans(text, answers) if answers else []
            if patterns and holds_answer(normalized(text), patterns) and not spans:
                continue  # says the answer in another form: no span to label, and not a negative
            pool.append({"passage": j, "spans": spans})
            if len(pool) == size:
                break
        pools.append(pool)
    return pools


def drawn(pools: list[list[dict]], count: int, seed: int, epoch: int, question: int) -> list[int]:
    """The positions in `pools[question]` of the `count` passages read with the question in `epoch`: drawn without
    replacement under (seed, epoch, question), whatever else the run does."""
    pool = pools[question]
    rng = np.random.default_rng([seed, epoch, question, 11])
    return sorted(rng.choice(len(pool), size=min(count, len(pool)), replace=False).tolist()) if pool else []

"""Hard negatives mined by the model being trained (ANCE-style refresh): from a ranking of the training passages,
the best-ranked ones that are neither a positive of the question nor hold one of its answers."""

import numpy as np

from utils.files.answers import answer_patterns, holds_answer, normalized
from utils.files.corpus import passage_key


def select_negatives(ranked: np.ndarray, questions: list[dict], passages: list[dict], count: int,
                     current: np.ndarray, normalized_texts: list[str] | None = None) -> np.ndarray:
    """Hard negatives from a ranking: for each question, the `count` best-ranked passages (indices into
    `passages`, ranked[i] best first) that are not one of its positives (same passage key, so no window of its gold
    passage either, nor the same text) and hold none of its answer strings (utils.files.answers: a passage that does is
    probably a false negative, the filter Tevatron applies). Those ranked above the gold are the model's
    mistakes; when the model ranks the gold first they are the ones just below it. Never short, never a
    duplicate: a question whose ranking runs out (tiny corpus) is topped up from its earlier negatives
    (`current`), then from the other passages in order; only a pool with fewer than `count` non-positive
    passages repeats one. `normalized_texts`: utils.files.answers.normalized of every passage, if already computed."""
    texts = normalized_texts if normalized_texts is not None else [normalized(p["text"]) for p in passages]
    out = np.empty_like(current)
    for i, q in enumerate(questions):
        gold_keys = {passage_key(c) for c in q["positive_ctxs"]}
        gold_texts = {normalized(c["text"]) for c in q["positive_ctxs"]}
        answers = answer_patterns(q.get("answers"))
        is_gold = lambda j: passage_key(passages[j]) in gold_keys or texts[j] in gold_texts  # noqa: E731
        chosen = []
        for j in ranked[i]:
            if len(chosen) == count:
                break
            j = int(j)
            if j not in chosen and not is_gold(j) and not holds_answer(texts[j], answers):
                chosen.append(j)
        pool = (j for j in range(len(passages)) if not holds_answer(texts[j], answers))
        for j in (j for source in ((int(j) for j in current[i]), pool) for j in source):  # lazily: the pool only
            if len(chosen) == count:                                                       # when still short
                break
            if j not in chosen and not is_gold(j):
                chosen.append(j)
        repeat = list(chosen) or [int(j) for j in current[i]]
        while len(chosen) < count:  # fewer non-positive passages than negatives per question
            chosen.append(repeat[len(chosen) % len(repeat)])
        out[i] = chosen
    return out

"""Measuring the QA system as a whole, as Haystack 1.x's Pipeline.eval and facebookresearch/DPR did: end-to-end
EM/F1 (total, HasAns, NoAns) at each number k of passages read, the retriever's recall@k of an answer-bearing
passage, the same reader's F1 on the gold paragraphs (the ceiling), and the system threshold tuned on labelled
questions."""

import math

import numpy as np

from utils.files.answers import answer_patterns, holds_answer, normalized
from utils.reader.metrics import best_null_threshold, squad_metrics
from utils.system.answer import CLIP, answer, combine


def labelled(questions: list[dict]) -> bool:
    """Whether the questions carry answers (utils.files.squad.load_questions: all of them or none)."""
    return questions[0]["answers"] is not None


def references(questions: list[dict]) -> dict:
    """{id: its answer texts} of labelled questions ([] for an unanswerable one)."""
    return {q["id"]: q["answers"]["text"] for q in questions}


# the weights tried for the retriever's score as a prior over the passages read (utils.system.answer): 0, then
# doubling over the scales its scores come in
RETRIEVER_WEIGHTS = (0.0,) + tuple(2.0 ** i for i in range(-4, 8))


def weight_grid(retriever_weight: float | None = None) -> list[float]:
    """The retriever weights to tune over: the one given, or (None) its grid."""
    return list(RETRIEVER_WEIGHTS) if retriever_weight is None else [retriever_weight]


def combined_at(readings: list[list[dict]], k: int, shared: bool = False, retriever_weight: float = 0.0) -> list[dict]:
    """The system's view of each question from its first k passages (`shared`: the rule of a reader trained with
    shared normalization; `retriever_weight`: the retriever's score fused in at this weight; utils.system.answer)."""
    return [combine(passages[:k], shared, retriever_weight=retriever_weight) for passages in readings]


def _best_threshold(questions: list[dict], combined: list[dict]) -> tuple[float, float]:
    """(F1, threshold) at the threshold with the best F1 (the official SQuAD v2 procedure)."""
    return best_null_threshold(references(questions), {q["id"]: c["text"] for q, c in zip(questions, combined)},
                               {q["id"]: _finite(c["null_minus_best"]) for q, c in zip(questions, combined)})


def tune(questions: list[dict], combined_with, weights, folds: list[list[dict]] | None = None) -> tuple:
    """(weight, threshold) with the best F1 on these labelled questions: each entry of `weights` (weight_grid) with
    its own best threshold; on equal F1 the first in sorted order, the smaller weight.
    `combined_with(entry)`: the questions' combined views with it (combined_at). With `folds` (the questions in
    folds of whole articles, utils.files.folds) and more than one entry, the entry is the one with the best F1
    cross-fitted over the folds (`crossfit`: each fold answered at its threshold tuned on the other folds), a
    choice scored only on articles it was not tuned on; its threshold is then tuned on all the questions."""
    views = {entry: combined_with(entry) for entry in sorted(weights)}
    by_id = {entry: {q["id"]: c for q, c in zip(questions, v)} for entry, v in views.items()}
    cross = folds is not None and len(views) > 1
    best = None
    for entry in views:
        f1, threshold = _best_threshold(questions, views[entry])
        if cross:
            def at(qs, e=entry):  # the views of some of the questions at this entry
                return [by_id[e][q["id"]] for q in qs]
            f1 = crossfit(folds, lambda others, e=entry: (e, _best_threshold(others, at(others))[1]), at)[0]["f1"]
        if best is None or f1 > best[0]:
            best = (f1, entry, threshold)
    return best[1], best[2]


def crossfit(folds: list[list[dict]], settle, combined) -> tuple[dict, list[tuple]]:
    """(EM/F1, total, HasAns and NoAns, of all the folds' labelled questions, each fold answered at the settings
    tuned on the other folds' questions; those settings, per fold): what a choice scores on articles it never saw.
    `settle(questions)`: (weight, threshold) tuned on them; `combined(questions, weight)`: their combined views."""
    predictions, settings = {}, []
    for i, fold in enumerate(folds):
        weight, threshold = settle([q for j, other in enumerate(folds) if j != i for q in other])
        settings.append((weight, threshold))
        predictions.update({q["id"]: answer(c, threshold) for q, c in zip(fold, combined(fold, weight))})
    return squad_metrics(references([q for fold in folds for q in fold]), predictions), settings


def fit_calibration(questions: list[dict], combined: list[dict], l2: float = 1e-4) -> tuple[float, float, float]:
    """(a, b, share) of P(no answer) = sigmoid(a x + b), x each question's log ratio (null_minus_best), fitted by
    maximum likelihood on these labelled questions (Platt scaling; Newton's method, a touch of L2 so separable labels
    stay finite): utils.system.answer.calibrated; `share`: the share of them without an answer, the prior the
    probability holds (utils.system.answer.at_share moves it to another)."""
    x = np.clip(np.asarray([c["null_minus_best"] for c in combined], dtype=np.float64), -CLIP, CLIP)
    y = np.asarray([not q["answers"]["text"] for q in questions], dtype=np.float64)
    features = np.stack([x, np.ones_like(x)], axis=1)
    w = np.zeros(2)
    for _ in range(100):
        p = 1 / (1 + np.exp(-np.clip(features @ w, -500, 500)))
        gradient = features.T @ (p - y) + l2 * w
        hessian = (features * (p * (1 - p))[:, None]).T @ features + l2 * np.eye(2)
        step = np.linalg.solve(hessian, gradient)
        w -= step
        if np.abs(step).max() < 1e-10:
            break
    return float(w[0]), float(w[1]), float(y.mean())


def _finite(x: float) -> float:
    return x if math.isfinite(x) else 1e30  # no span anywhere: abstains at any threshold


def scores(questions: list[dict], combined: list[dict], threshold: float | None) -> dict:
    """EM/F1 (total, HasAns, NoAns) of the system's answers at `threshold`."""
    return squad_metrics(references(questions), {q["id"]: answer(c, threshold) for q, c in zip(questions, combined)})


def recall(questions: list[dict], retrieved: list[list[dict]], k: int) -> float | None:
    """Share (%) of the answerable questions with a passage among their first k that holds one of their answers."""
    hits = [any(holds_answer(normalized(p["text"]), answer_patterns(q["answers"]["text"])) for p in passages[:k])
            for q, passages in zip(questions, retrieved) if q["answers"]["text"]]
    return 100.0 * sum(hits) / len(hits) if hits else None


def _answer_seconds(times: list[dict], kk: int) -> float:
    """Wall seconds to answer with kk passages: retrieval and the reading bands up to kk, of the slowest process."""
    return max(t["retrieval"] + sum(v for key, v in t.items() if key.startswith("read_") and int(key[5:]) <= kk)
               for t in times)


def questions_per_second(times: list[dict], kk: int, n: int) -> float:
    """Questions answered per second with kk passages read (the slowest process's wall time)."""
    return round(n / max(_answer_seconds(times, kk), 1e-9), 2)


def reading_share(times: list[dict], kk: int) -> float:
    """The share of that time spent reading (the rest is retrieval)."""
    slowest = max(times, key=lambda t: _answer_seconds([t], kk))
    total = _answer_seconds([slowest], kk)
    return round(1 - slowest["retrieval"] / max(total, 1e-9), 3)

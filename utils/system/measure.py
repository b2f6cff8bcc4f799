"""Measuring the QA system as a whole, as Haystack 1.x's Pipeline.eval and facebookresearch/DPR did: end-to-end
EM/F1 (total, HasAns, NoAns) at each number k of passages read, the retriever's recall@k of an answer-bearing
passage, the same reader's F1 on the gold paragraphs (the ceiling), and the system threshold tuned on labelled
questions: the tuning policy (`system_setting`, `crossfitted`, from the `AnswerSettings` given) and the rows it is
reported in.

Every score reads a question's answer texts only, so a question labelled by answer strings without a paragraph
(DPR's NQ and TriviaQA files; utils.files.squad) is measured by the same functions as a SQuAD question with the
same answers, and scores the same: EM/F1 by the official SQuAD v2 normalisation, the best over its answers, an
unanswerable question's (no answers) only gold answer "" (utils.reader.metrics); recall by the one answer matcher.
Only the ceiling needs the paragraphs (`ceiling_left_out`)."""

import math
from dataclasses import dataclass

import numpy as np

from utils.errors import UserError
from utils.files.answers import answer_patterns, holds_answer, normalized
from utils.files.folds import cross_fit_folds, fold_unit
from utils.reader.metrics import best_null_threshold, squad_metrics
from utils.system.answer import CLIP, AnswerSettings, answer, at_share, combine


def labelled(questions: list[dict]) -> bool:
    """Whether the questions carry answers (utils.files.squad.load_questions: all of them or none)."""
    return questions[0]["answers"] is not None


def references(questions: list[dict]) -> dict:
    """{id: its answer texts} of labelled questions ([] for an unanswerable one), with or without a paragraph."""
    return {q["id"]: q["answers"]["text"] for q in questions}


# the weights tried for the retriever's score as a prior over the passages read (utils.system.answer): 0, then
# doubling over the scales its scores come in
RETRIEVER_WEIGHTS = (0.0,) + tuple(2.0 ** i for i in range(-4, 8))


def weight_grid(retriever_weight: float | None = None) -> list[float]:
    """The retriever weights to tune over: the one given, or (None) its grid."""
    return list(RETRIEVER_WEIGHTS) if retriever_weight is None else [retriever_weight]


def combined_at(readings: list[list[dict]], k: int, shared_norm: bool = False,
                retriever_weight: float = 0.0) -> list[dict]:
    """The system's view of each question from its first k passages (`shared_norm`: the rule of a reader trained with
    shared normalization; `retriever_weight`: the retriever's score fused in at this weight; utils.system.answer)."""
    return [combine(passages[:k], shared_norm, retriever_weight=retriever_weight) for passages in readings]


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
    """Share (%) of the answerable questions with a passage among their first k that holds one of their answers:
    DPR's top-k accuracy (its `has_answer`: an answer's tokens in the passage's, uncased) by the project's one answer
    matcher (utils.files.answers: SQuAD-normalised whole tokens), so the labels a reader and a retriever train on and
    the recall they are measured by agree, with a paragraph or without. Where the two rules part (punctuation inside
    a word: DPR splits "Galileo's" into galileo ' s and finds "Galileo", the SQuAD normalisation makes it "galileos"
    and does not; "U.S." holds "US" here only; articles are ignored here) is in docs/QA_SYSTEM.md. A question without
    answers is left out (DPR's files have none; its has_answer would count one as never found)."""
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


def timing(times: list[dict], kk: int, n: int) -> dict:
    """A row's speed at kk passages read: questions per second and the reading's share of the time."""
    return {"questions_per_second": questions_per_second(times, kk, n), "reading_share": reading_share(times, kk)}


# --- the tuning policy: what each k answers with ---------------------------------------------------------------


@dataclass(frozen=True)
class Setting:
    """One k's answer rule as tuned (weight, threshold, calibration) and as applied: moved to the expected share of
    unanswerable questions (`not_moved`: why it could not be, None when it was or there is no share)."""

    weight: float
    threshold: float | None
    calibration: tuple | None
    applied_threshold: float | None
    applied_calibration: tuple | None
    not_moved: str | None = None


def moved(answer_settings: AnswerSettings, weight: float, threshold: float | None,
          calibration: tuple | None) -> Setting:
    """The setting applied at the tuning's share: a calibration that cannot move it (a slope not above 0: the log
    ratio does not order the questions' no-answers) moves nothing, and the setting says why."""
    if answer_settings.unanswerable_share is None:
        return Setting(weight, threshold, calibration, threshold, calibration)
    try:
        return Setting(weight, threshold, calibration,
                       *at_share(threshold, calibration, answer_settings.unanswerable_share))
    except UserError as err:
        return Setting(weight, threshold, calibration, threshold, calibration, str(err))


def tuned_setting(answer_settings: AnswerSettings, questions: list[dict], view, folds: list[list[dict]] | None,
                  fuse: bool = True) -> Setting:
    """The policy on these labelled questions (`view(weight)`: their combined views): the weight and threshold with
    the best F1 (`tune`: the weight cross-fitted over `folds`), the calibration fitted unless given (not needed for
    an unfused reading nothing moves), moved to the share. `fuse` False: no retriever score (gold paragraphs)."""
    weight, threshold = tune(questions, view, weight_grid(answer_settings.retriever_weight) if fuse else [0.0], folds)
    calibration = answer_settings.no_answer_calibration
    if calibration is None and (fuse or answer_settings.unanswerable_share is not None):
        calibration = fit_calibration(questions, view(weight))
    return moved(answer_settings, weight, threshold, calibration)


def system_setting(answer_settings: AnswerSettings, null_threshold: float | None, validation: list[dict] | None,
                   readings: list[list[dict]] | None, k: int, shared_norm: bool, folds: list[list[dict]] | None,
                   fuse: bool = True) -> Setting:
    """What the system answers with when reading k passages: the threshold given, else tuned on the validation
    questions (`readings`: theirs; None: none to tune on) in folds of whole articles, else the reader's recorded one.
    `shared_norm`: the shared-normalization rule (utils.system.answer)."""
    if answer_settings.no_answer_threshold is not None or readings is None:
        weight = (answer_settings.retriever_weight or 0.0) if fuse else 0.0
        threshold = answer_settings.no_answer_threshold
        threshold = null_threshold if threshold is None else threshold
        return moved(answer_settings, weight, threshold, answer_settings.no_answer_calibration)
    return tuned_setting(answer_settings, validation, lambda w: combined_at(readings, k, shared_norm, w), folds, fuse)


def crossfitted(answer_settings: AnswerSettings, questions: list[dict], readings: list[list[dict]], k: int,
                shared_norm: bool, folds: list[list[dict]]) -> dict:
    """EM/F1 of these labelled questions, each fold of whole articles answered at the setting the policy gives on
    the other folds (moved to the share as the row's is): a setting's score on articles it was not tuned on."""
    of = {q["id"]: r for q, r in zip(questions, readings)}

    def combined(qs, weight):
        return combined_at([of[q["id"]] for q in qs], k, shared_norm, weight)

    def settle(others):
        setting = tuned_setting(answer_settings, others, lambda w: combined(others, w), cross_fit_folds(others))
        return setting.weight, setting.applied_threshold
    return crossfit(folds, settle, combined)[0]


def tuning_source(answer_settings: AnswerSettings, validation_file: str | None, same_file: bool, folds,
                  tuned: bool) -> str:
    """Where the rows' thresholds and weights come from, as eval_results.json and qa_system.py's last line say
    (`tuned`: tuned on validation readings; `same_file`: the validation questions are the questions scored; the
    folds named by what they keep whole: articles, or questions that name none, utils.files.folds)."""
    unit = fold_unit([q for fold in folds for q in fold]) if folds else "articles"
    source = ("given" if answer_settings.no_answer_threshold is not None else
              f"tuned on this very file: an upper bound (crossfit: each half of its {unit} answered as tuned on "
              "the other)" if same_file and folds else
              "tuned on this very file: an upper bound (one article: no folds to cross-fit over)" if same_file else
              f"tuned on {validation_file}" if validation_file is not None else
              "the reader's recorded threshold")
    if tuned and answer_settings.retriever_weight is None:
        source += (f"; the weight cross-fitted over two folds of its {unit}" if folds else
                   "; the weight tuned on it as a whole")
    return source


# --- the rows: each k's setting and what it scores -------------------------------------------------------------


def core_scores(metrics: dict) -> dict:
    """EM, F1 and HasAns/NoAns F1 of a squad_metrics result (what a second threshold's scores are shown with)."""
    return {k: metrics[k] for k in ("exact", "f1", "HasAns_f1", "NoAns_f1") if k in metrics}


def system_row(answer_settings: AnswerSettings, setting: Setting, k: int, timing: dict, questions: list[dict],
               retrieved: list[list[dict]], readings: list[list[dict]], shared_norm: bool,
               folds: list[list[dict]] | None = None) -> dict:
    """k's row: its setting, its `timing` (questions_per_second, reading_share), and with labelled questions the
    retriever's recall and the system's EM/F1 at the setting (at the share, and at the threshold as tuned);
    `folds`: these questions are the validation questions, so the row is an upper bound and also comes
    cross-fitted."""
    share = answer_settings.unanswerable_share
    row = {"k": k, "threshold": setting.threshold, "retriever_weight": setting.weight,
           "no_answer_calibration": setting.calibration}
    if share is not None:
        row.update(unanswerable_share=share, threshold_at_share=setting.applied_threshold,
                   **({"not_moved": setting.not_moved} if setting.not_moved else {}))
    row.update(timing)
    if labelled(questions):
        row["recall"] = recall(questions, retrieved, k)
        combined = combined_at(readings, k, shared_norm, setting.weight)
        row.update(scores(questions, combined, setting.applied_threshold))
        if share is not None:  # what the share changed: the same answers, as tuned
            row["at_threshold"] = core_scores(scores(questions, combined, setting.threshold))
        if folds:
            row["crossfit"] = core_scores(crossfitted(answer_settings, questions, readings, k, shared_norm, folds))
    return row


def gold_row(answer_settings: AnswerSettings, setting: Setting, questions: list[dict], gold: list[list[dict]],
             shared_norm: bool) -> dict:
    """The ceiling: each labelled question's own paragraph read alone (`gold`), scored at the unfused `setting`."""
    combined = combined_at(gold, 1, shared_norm)
    row = {"threshold": setting.threshold, **scores(questions, combined, setting.applied_threshold)}
    if answer_settings.unanswerable_share is not None:
        row.update(threshold_at_share=setting.applied_threshold,
                   at_threshold=core_scores(scores(questions, combined, setting.threshold)),
                   **({"not_moved": setting.not_moved} if setting.not_moved else {}))
    return row


def ceiling_left_out(questions: list[dict], validation: list[dict] | None, tuned: bool) -> str | None:
    """Why the gold-paragraph row (the reader's ceiling) cannot be measured, or None where it can (or there is
    nothing to score): it reads each labelled question's own paragraph, and where the threshold is tuned on the
    validation questions (`tuned`), reads theirs to tune its own threshold the same way."""
    if not labelled(questions):
        return None
    if not all(q["context"] for q in questions):
        return "left out: the questions do not all come with their paragraph (a 'context')"
    if tuned and not all(q["context"] for q in validation):
        return ("left out: its threshold is tuned on --validation_file's paragraphs, and those questions do not all "
                "come with theirs")
    return None


def measured_ks(eval_k: list[int], k: int, passages: int) -> tuple[list[int], int, str | None]:
    """(the k's measured: the eval k's and k, k, a note): k's beyond the corpus read every passage, so they
    are measured once, at its size, and said so."""
    beyond = [x for x in eval_k + [k] if x > passages]
    note = (f"k = {', '.join(map(str, sorted(set(beyond))))} beyond the {passages} passages of the corpus: read at "
            f"{passages}" if beyond else None)
    k = min(k, passages)
    return sorted({min(x, passages) for x in eval_k} | {k}), k, note

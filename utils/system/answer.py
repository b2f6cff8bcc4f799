"""The rule for answering a question from several retrieved passages, one per way a reader was trained, and the
probability of no answer: `combine` (a question's view from its passages' readings), `answer` (its text, or ""),
`calibrated` and `at_share` (a calibration, and a move to another expected share of unanswerable questions), and
`AnswerSettings`, the rule's settings as the front ends' flags give them. docs/QA_SYSTEM.md explains the rule; its
thresholds and weights are tuned in utils.system.measure.
"""

import math
from dataclasses import dataclass, field
from typing import Optional

from utils.errors import UserError
from utils.numeric import logsumexp
from utils.reader.decoding import abstains
from utils.runtime.flags import arg

# what a passage's reading carries for the shared rule beside its best span: the log-sum-exps of its windows' logits
READING_STATS = ("null_start", "null_end", "lse_start", "lse_end")
CLIP = 50.0  # a log ratio beyond +-CLIP says nothing more to the calibration (and no span anywhere is +inf)
NO_SPAN = {"text": "", "score": -math.inf, "null_score": math.inf, "null_minus_best": math.inf}


def with_prior(reading: dict, prior: float) -> dict:
    """A passage's reading with every logit, start and end, raised by `prior` / 2: its spans' and its no-answer's
    scores by `prior` (the per-passage comparison, null - span, is unchanged)."""
    if not prior:
        return reading
    out = {**reading, "score": reading["score"] + prior, "null_score": reading["null_score"] + prior}
    for key in READING_STATS:
        if reading.get(key) is not None:
            out[key] = reading[key] + prior / 2
    return out


def combine(passages: list[dict], shared_norm: bool = False, retriever_weight: float = 0.0,
            calibration: tuple[float, float] | None = None) -> dict:
    """The system's view of one question from its passages' readings (each {"passage_id", "text", "score",
    "null_score", "null_minus_best"}, for `shared_norm` "null_start", "null_end", "lse_start", "lse_end", for
    `retriever_weight` "retrieval_score"; in retrieval order): the best span
    over the passages (the earlier passage on equal scores), what the threshold compares and the probability of no
    answer: calibrated with `calibration` (either rule), else the shared rule's share of the softmaxes."""
    out = _combined(passages, shared_norm, retriever_weight)
    if calibration is not None:
        out["no_answer_probability"] = calibrated(out["null_minus_best"], calibration)
    return out


def _combined(passages, shared_norm, retriever_weight) -> dict:
    if retriever_weight:
        # the retriever's score as a prior over the passages read (as pygaggle fuses DPR's reader): a span of a
        # passage ranked low must read better to win; the same shift on every passage changes nothing
        passages = [with_prior(p, retriever_weight * p["retrieval_score"]) for p in passages]
    # either rule: the best span is the best span score of any passage (the earlier one on a tie)
    best = max(passages, key=lambda p: p["score"], default=None)
    if best is None or best["score"] == -math.inf:
        return {"text": "", "passage_id": None, "score": None, "null_minus_best": math.inf,
                "no_answer_probability": 1.0 if shared_norm else None}
    out = {"text": best["text"], "passage_id": best["passage_id"], "score": best["score"]}
    if not shared_norm:
        # a paragraph at a time: abstain only when every passage's null beats its best span by more than the
        # threshold, so the smallest margin decides (one passage: the reader's own SQuAD v2 rule)
        return {**out, "null_minus_best": min(p["null_minus_best"] for p in passages), "no_answer_probability": None}
    # shared normalization: one softmax over every window of every passage read, so one no-answer per question,
    # its score the log-sum-exp of the [CLS] start logits plus that of the end logits, over all of them; its margin
    # over the best span is the log ratio of their probabilities
    null_start, null_end = logsumexp(p["null_start"] for p in passages), logsumexp(p["null_end"] for p in passages)
    lse_start, lse_end = logsumexp(p["lse_start"] for p in passages), logsumexp(p["lse_end"] for p in passages)
    # the no-answer's share of the start and of the end softmax, averaged: a probability per question
    probability = (math.exp(null_start - lse_start) + math.exp(null_end - lse_end)) / 2
    return {**out, "null_minus_best": null_start + null_end - best["score"], "no_answer_probability": probability}


def calibrated(null_minus_best: float, calibration: tuple) -> float:
    """The probability that the question has no answer, from its log ratio (`null_minus_best`) through a calibration
    (a, b[, share]) fitted on labelled questions (utils.system.measure.fit_calibration): sigmoid(a x + b). It means
    what it says on questions like those it was fitted on (of those given 0.3, about 3 in 10 have no answer)."""
    z = calibration_logit(null_minus_best, calibration)
    return 1 / (1 + math.exp(-z)) if z >= 0 else math.exp(z) / (1 + math.exp(z))


def calibration_logit(null_minus_best: float, calibration: tuple) -> float:
    """a x + b: the log odds of no answer that `calibrated` turns into a probability (x clipped to +-CLIP)."""
    a, b = calibration[:2]
    return a * min(max(null_minus_best, -CLIP), CLIP) + b


def log_odds(p: float) -> float:
    return math.log(p / (1 - p))


@dataclass(frozen=True)
class AnswerSettings:
    """The answer rule's settings a front end is given (qa_system.py, serve.py); None: tuned on labelled validation
    questions where the front end tunes (utils.system.measure), else the reader's recorded threshold, no fusion and
    no calibration."""
    no_answer_threshold: Optional[float] = arg(None, "The system's no-answer threshold, tuned before. Default: the "
                                                     "reader's recorded threshold.")
    retriever_weight: Optional[float] = arg(
        None, "How much the retriever's score of a passage weighs on the answers read in it (0: the reader's scores "
              "alone; utils/system/answer.py). Its scale is the retriever's, so tune it with the threshold: "
              "qa_system.py --validation_file does (and reports both per k). Default: tuned there, else 0.")
    # (a, b[, share]) of sigmoid(a x + b), fit_calibration's; a tuple once built
    no_answer_calibration: Optional[list[float]] = field(default=None, metadata={
        "help": "A B [SHARE]: the calibration of the probability of no answer, sigmoid(A x + B) of the log ratio x "
                "the threshold compares, and the share of unanswerable questions it was fitted on, as qa_system.py "
                "--validation_file fits them (its row for your k). Without it, no_answer_probability is the shared "
                "rule's uncalibrated one (none for a reader trained a paragraph at a time).", "nargs": "+"})
    unanswerable_share: Optional[float] = arg(
        None, "The share of questions you expect to have no answer, when it is not that of the questions the "
              "threshold was tuned on: the threshold and the probability of no answer move to it by its odds "
              "(utils/system/answer.py). Needs the calibration's SHARE. Default: the tuning questions' share.")

    def __post_init__(self):
        if self.no_answer_calibration is not None:
            object.__setattr__(self, "no_answer_calibration", tuple(self.no_answer_calibration))

    def check(self, fits_calibration: bool = False) -> None:
        """The settings' own checks (check_settings). `fits_calibration`: the front end fits the calibration itself
        (qa_system.py --validation_file), so a share needs none given: its range alone is checked."""
        fitted_later = fits_calibration and self.no_answer_calibration is None
        check_settings(self.retriever_weight or 0.0, self.no_answer_calibration,
                       None if fitted_later else self.unanswerable_share)
        if fitted_later and self.unanswerable_share is not None and not 0 < self.unanswerable_share < 1:
            check_share(self.unanswerable_share, None)  # its range, in the same words


def check_settings(retriever_weight: float, calibration: tuple | None, share: float | None) -> None:
    """The answer rule's settings, checked in one place for the Python API and the front ends (one-line errors): a
    retriever weight of 0 or more, a calibration of A B or A B SHARE, a share it can move to (`check_share`)."""
    if not retriever_weight >= 0:
        raise UserError(f"retriever_weight {retriever_weight}: give 0 or more")
    if calibration is not None and len(calibration) not in (2, 3):
        raise UserError(f"calibration {tuple(calibration)}: give A B or A B SHARE (the share of unanswerable "
                        "questions it was fitted on)")
    check_share(share, calibration)


def check_share(share: float | None, calibration: tuple | None) -> None:
    """A share of unanswerable questions that `at_share` can move to: strictly between 0 and 1, with a calibration
    that says the share it was fitted on and whose probability of no answer rises with the log ratio (a > 0)."""
    if share is None:
        return
    if not 0 < share < 1:
        raise UserError(f"unanswerable_share {share}: give the expected share of unanswerable questions, strictly "
                        "between 0 and 1")
    if calibration is None or len(calibration) != 3:
        raise UserError("unanswerable_share moves a calibrated cut: give the calibration with the share of "
                        "unanswerable questions it was fitted on, A B SHARE (qa_system.py --validation_file fits it)")
    if not calibration[0] > 0 or not 0 < calibration[2] < 1:
        raise UserError(f"calibration {tuple(calibration)}: unanswerable_share needs a slope A above 0 and a fitted "
                        "share strictly between 0 and 1")


def at_share(threshold: float | None, calibration: tuple | None, share: float | None) -> tuple:
    """(threshold, calibration) for questions of which `share` have no answer, from the threshold tuned and the
    calibration (a, b, fitted share) fitted on questions with another share: the log odds move
    by d = log_odds(share) - log_odds(fitted share), so b by d and the threshold by -d / a; the calibration returned
    says `share`. No share: both as given."""
    if share is None:
        return threshold, calibration
    check_share(share, calibration)
    a, b, fitted = calibration
    # Bayes' rule: only the prior differs, so every question's log odds of no answer move by the same amount, and
    # the threshold (on x, where the log odds are a x + b) by that over the slope: it still stands for the
    # probability it stood for where it was tuned
    moved = log_odds(share) - log_odds(fitted)
    return (None if threshold is None else threshold - moved / a), (a, b + moved, share)


def answer(combined: dict, threshold: float | None) -> str:
    """The answer text, "" when the system abstains (no span anywhere, or the reader's rule says so:
    utils.reader.decoding.abstains); `threshold` None (a SQuAD v1.1 reader) always answers."""
    if not combined["text"] or abstains(combined["null_minus_best"], threshold):
        return ""
    return combined["text"]

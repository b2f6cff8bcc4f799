"""The QA system's scores with a no-answer threshold it was not tuned on: two-fold cross-fitting by article.

qa_system.py tunes its threshold on --validation_file; when that is the file being scored (the shared dev set is
the only labelled file beside the training data) its rows are an upper bound (qa_system.py then also gives each row
cross-fitted). This re-scores a finished run from its details.jsonl (each passage's best span and null score),
without reading again, and goes further: the articles are split into two halves of whole articles
(utils.files.folds: what is tuned on one half is scored on articles it never saw, as a user's questions are), the
threshold is tuned on one half and applied to the other, and the answers of both halves are scored together
(utils.system.measure.crossfit).

    python benchmarks/qa_crossfit.py --run outputs/qa --questions ../shared/data/squad/dev.json

Prints, per k: F1 at the upper-bound threshold (tuned on all of the file) and cross-fitted, EM, HasAns/NoAns F1;
and whether the no-answer decision transfers to a set with another share of unanswerable questions: the threshold
tuned on one half as it is, the other half scored reweighted to half unanswerable (F1 = the mean of its HasAns and
NoAns F1; abstaining on every question scores 50 there), both ways round. With --abstain_on probability (a reader
trained with shared normalization) the threshold is on the question's probability of no answer instead of the log
ratio of the no-answer to the best span. Then, per k, the calibrated probability of no answer (utils.system.answer:
the log ratio through a sigmoid fitted on one half, as qa_system.py fits it on --validation_file) on the other half:
its expected calibration error and Brier score; and the shift again with the share known, as a calibrated
probability allows: the probability at the threshold tuned on one half kept as the cut, the other half's odds moved
by the ratio of its share's odds to the tuning half's. With --retriever_weight tune the weight of the retriever's
score in the answer (utils.system.answer) is tuned with the threshold wherever a threshold is, as qa_system.py
does; a number fixes it.

A half (or the file) without an unanswerable question, SQuAD v1.1 data, has nothing to tune a threshold on: what is
scored at its settings answers every question, as a SQuAD v1.1 reader does, and no calibration is fitted on it; the
output says so. Each --k is scored with the run's first k passages of each question, so a k beyond those the run
read is refused.
"""

import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from utils.errors import UserError, exit_on_user_error  # noqa: E402
from utils.files.folds import article_folds, articles_of, cross_fit_folds  # noqa: E402
from utils.files.squad import load_questions  # noqa: E402
from utils.system.answer import READING_STATS, at_share, calibrated  # noqa: E402
from utils.system.measure import combined_at, crossfit, fit_calibration, scores, tune, weight_grid  # noqa: E402


def readings_of(path: str) -> tuple[dict, bool]:
    """(question id -> its passages' readings, in retrieval order, as utils.system.answer.combine takes them;
    whether the reader's rule is the shared one). A passage without a span has span_score -inf, written as null in
    the strict JSON of details.jsonl (its null score likewise, +inf)."""
    out, shared_norm = {}, False
    with open(path, encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            readings = []
            for p in row["passages"]:
                span = -math.inf if p["span_score"] is None else p["span_score"]
                null = math.inf if p["null_score"] is None else p["null_score"]
                readings.append({"passage_id": p["passage_id"], "retrieval_score": p["score"], "text": p["span"],
                                 "score": span, "null_score": null,
                                 "null_minus_best": null - span if p["span"] else math.inf,
                                 **{k: p.get(k) for k in READING_STATS}})
            out[row["id"]], shared_norm = readings, row.get("rule") == "question"
    return out, shared_norm


def run_ks(run: str, readings: dict) -> tuple[int, str]:
    """(the most passages the run read for a question, the k's it has: its table's, from eval_results.json when
    there is one, else every k up to that)."""
    largest = max((len(passages) for passages in readings.values()), default=0)
    try:
        with open(os.path.join(run, "eval_results.json"), encoding="utf-8") as f:
            return largest, ", ".join(str(r["k"]) for r in json.load(f)["rows"])
    except (OSError, ValueError, KeyError, TypeError):
        return largest, f"1..{largest}"


def unanswerable_share(questions: list[dict]) -> float:
    """The share of these labelled questions that have no answer."""
    return sum(not q["answers"]["text"] for q in questions) / max(len(questions), 1)


@exit_on_user_error
def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", required=True, help="a qa_system.py output directory (its details.jsonl)")
    parser.add_argument("--questions", required=True, help="the labelled SQuAD JSON the run answered")
    parser.add_argument("--k", type=int, nargs="+", default=[1, 3, 5, 10],
                        help="the numbers of passages read to score (at most the run read per question)")
    parser.add_argument("--abstain_on", choices=["ratio", "probability"], default="ratio",
                        help="what the threshold compares: the log ratio of the no-answer to the best span (the "
                             "system's rule), or the probability of no answer (shared-normalization readers)")
    parser.add_argument("--retriever_weight", default="0",
                        help="the weight of the retriever's score in the answer (utils.system.answer): a number, or "
                             "tune (tuned with the threshold, as qa_system.py does; 0: the reader's scores alone)")
    args = parser.parse_args()

    questions = load_questions(args.questions, need_context=False)
    try:  # one half would be empty: nothing to tune on, or nothing to score
        halves = article_folds(questions, 2)
    except UserError as err:
        raise UserError(f"--questions {args.questions}: {err}") from None
    articles = len(articles_of(questions))
    readings, shared_norm = readings_of(os.path.join(args.run, "details.jsonl"))
    largest, ks = run_ks(args.run, readings)
    beyond = [k for k in args.k if not 1 <= k <= largest]
    if beyond:  # scored with the passages there are, a row would be labelled with a k the run never read
        raise UserError(f"--k {', '.join(map(str, beyond))}: {args.run} read {largest} passages per question (its "
                        f"k's: {ks}); give k from 1 to {largest}")
    weights = weight_grid(None if args.retriever_weight == "tune" else float(args.retriever_weight))
    print(f"{args.run}: {len(questions)} questions, halves of {len(halves[0])} / {len(halves[1])} questions "
          f"({articles} articles, each whole in one half)")
    for name, half in (("the file", questions), ("half A", halves[0]), ("half B", halves[1])):
        if not unanswerable_share(half):
            print(f"{name} has no unanswerable question (SQuAD v1.1 data): no threshold is tuned on it (the "
                  "questions scored at its settings are all answered) and no calibration is fitted on it")
    print("| k | F1 (threshold tuned on the file: upper bound) | F1 cross-fitted | EM | HasAns F1 | NoAns F1 | "
          "F1 at 50% unanswerable, threshold tuned on the other half (A->B, B->A, mean; abstaining: 50) | "
          "retriever weight (on the file; the halves) |")
    print("|---|---|---|---|---|---|---|---|")
    calibration, calibrated_lines = [], []
    for k in args.k:
        def combined(qs, weight):
            views = combined_at([readings[q["id"]] for q in qs], k, shared_norm, weight)
            if args.abstain_on == "probability":
                views = [dict(c, null_minus_best=c["no_answer_probability"]) for c in views]
            return views

        def tuned(qs):  # (retriever weight, threshold) tuned on these questions
            if unanswerable_share(qs):
                return tune(qs, lambda w: combined(qs, w), weights, cross_fit_folds(qs))
            # nothing to abstain on: threshold None, as for a SQuAD v1.1 reader; the weight (the smaller on equal
            # F1, as tune picks it) by the F1 of answering every question
            return max(sorted(weights), key=lambda w: scores(qs, combined(qs, w), None)["f1"]), None

        weight, threshold = tuned(questions)
        upper = scores(questions, combined(questions, weight), threshold)
        # each half answered at the settings tuned on the other half; both scored together
        crossed, half_settings = crossfit(halves, tuned, combined)
        shifted = []
        for h, (w, threshold) in enumerate(half_settings):
            # tuned on one half as it is, scored on the other reweighted to half unanswerable
            other = scores(halves[h], combined(halves[h], w), threshold)
            shifted.append((other.get("HasAns_f1", float("nan")) + other.get("NoAns_f1", float("nan"))) / 2)
        if args.abstain_on == "ratio":
            calibrated_lines.append((k, _calibrated_across(halves, combined, half_settings)))
        print(f"| {k} | {upper['f1']:.2f} | {crossed['f1']:.2f} | {crossed['exact']:.2f} | "
              f"{crossed.get('HasAns_f1', float('nan')):.2f} | {crossed.get('NoAns_f1', float('nan')):.2f} | "
              f"{shifted[1]:.2f}, {shifted[0]:.2f}, {sum(shifted) / 2:.2f} | "
              f"{weight:g}; {half_settings[1][0]:g}, {half_settings[0][0]:g} |")
        if args.abstain_on == "probability":
            calibration.append((k, *_calibration(questions, combined(questions, weight))))
    for k, fitted in calibrated_lines:
        if isinstance(fitted, str):
            print(f"k={k}: calibrated P(no answer) not fitted: {fitted}")
            continue
        ece, brier, mean_p, share, moved = fitted
        print(f"k={k}: calibrated P(no answer), fitted on the other half: expected calibration error {ece:.3f}, Brier "
              f"{brier:.3f} (mean P {mean_p:.3f}, share {share:.3f}); at 50% unanswerable with the cut moved by the "
              f"known share: {moved[1]:.2f}, {moved[0]:.2f}, mean {sum(moved) / 2:.2f}")
    for k, ece, brier, mean_p, share in calibration:
        print(f"k={k}: P(no answer) against the question being unanswerable: expected calibration error {ece:.3f} "
              f"(10 bins), Brier {brier:.3f}; mean P {mean_p:.3f} for a share of {share:.3f} unanswerable")


def _calibrated_across(halves, combined, settings):
    """The calibration fitted on each half and applied to the other: (ECE, Brier, mean P, share unanswerable) over
    both halves' questions, and per half the F1 reweighted to 50% unanswerable when its share is known: abstain
    where the calibrated probability, its odds moved from the tuning half's share to 1:1, passes the probability
    that the tuning half's threshold stood for. `settings[h]`: (retriever weight, threshold) tuned on the other
    half. A half without an unanswerable question, or without an answerable one, fits no calibration: then why,
    instead."""
    for name, half in (("half A", halves[0]), ("half B", halves[1])):
        if unanswerable_share(half) in (0.0, 1.0):
            return f"{name} has no {'unanswerable' if unanswerable_share(half) == 0 else 'answerable'} question"
    questions, probabilities, moved = [], [], []
    for h in (0, 1):
        tuning, scored = halves[1 - h], halves[h]
        weight, threshold = settings[h]
        calibration = fit_calibration(tuning, combined(tuning, weight))
        views = combined(scored, weight)
        questions += scored
        probabilities += [calibrated(c["null_minus_best"], calibration) for c in views]
        try:  # to odds 1:1, as qa_system.py moves
            other = scores(scored, views, at_share(threshold, calibration, 0.5)[0])
        except UserError:  # a slope not above 0: the log ratio does not order the tuning half's no-answers
            moved.append(float("nan"))
            continue
        moved.append((other.get("HasAns_f1", float("nan")) + other.get("NoAns_f1", float("nan"))) / 2)
    return (*_calibration(questions, [{"null_minus_best": p} for p in probabilities]), moved)


def _calibration(questions, views) -> tuple[float, float, float, float]:
    """How well the no-answer probability matches the labels (1: unanswerable): (expected calibration error over 10
    equal-width bins, Brier score, mean probability, share unanswerable)."""
    pairs = [(c["null_minus_best"], float(not q["answers"]["text"])) for q, c in zip(questions, views)]
    ece = 0.0
    for b in range(10):
        inside = [(p, y) for p, y in pairs if b / 10 <= p < (b + 1) / 10 or (b == 9 and p == 1.0)]
        if inside:
            ece += len(inside) / len(pairs) * abs(sum(p for p, _ in inside) - sum(y for _, y in inside)) / len(inside)
    brier = sum((p - y) ** 2 for p, y in pairs) / len(pairs)
    return ece, brier, sum(p for p, _ in pairs) / len(pairs), sum(y for _, y in pairs) / len(pairs)


if __name__ == "__main__":
    main()

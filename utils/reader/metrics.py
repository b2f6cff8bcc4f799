"""Official SQuAD v1.1 / v2.0 exact match and F1, re-implemented (the `evaluate` package needs the hub).

Follows the official v2.0 evaluation script: answers are normalised (lower case, punctuation and
the articles a/an/the removed, whitespace collapsed); a question's score is the max over its gold
answers; an unanswerable question's only gold answer is "" so it scores 1 exactly when the
prediction is "". Scores are reported in percent for all questions, HasAns and NoAns.
`best_null_threshold` is the official `find_best_thresh`: the no-answer threshold that maximises
F1 (or EM) on this data.
"""

from collections import Counter

from utils.files.answers import normalize_answer


def exact_match(gold: str, pred: str) -> int:
    return int(normalize_answer(gold) == normalize_answer(pred))


def f1_score(gold: str, pred: str) -> float:
    gold_toks, pred_toks = normalize_answer(gold).split(), normalize_answer(pred).split()
    if not gold_toks or not pred_toks:  # no-answer: 1 if both empty, else 0
        return float(gold_toks == pred_toks)
    same = sum((Counter(gold_toks) & Counter(pred_toks)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred_toks), same / len(gold_toks)
    return 2 * precision * recall / (precision + recall)


def _golds(answers: list[str]) -> list[str]:
    golds = [a for a in answers if normalize_answer(a)]
    return golds or [""]


def raw_scores(references: dict, predictions: dict) -> tuple[dict, dict]:
    """Per-question (exact, f1) of `predictions` (id -> text) against `references` (id -> gold texts)."""
    exact, f1 = {}, {}
    for qid, answers in references.items():
        pred = predictions[qid]
        exact[qid] = max(exact_match(g, pred) for g in _golds(answers))
        f1[qid] = max(f1_score(g, pred) for g in _golds(answers))
    return exact, f1


def squad_metrics(references: dict, predictions: dict) -> dict:
    """exact/f1 in percent over all questions, plus HasAns_* and NoAns_* where those subsets exist."""
    exact, f1 = raw_scores(references, predictions)
    out = {}
    subsets = {"": list(references),
               "HasAns_": [q for q, a in references.items() if any(normalize_answer(x) for x in a)],
               "NoAns_": [q for q, a in references.items() if not any(normalize_answer(x) for x in a)]}
    for prefix, qids in subsets.items():
        if qids or prefix == "":
            n = max(len(qids), 1)
            out[f"{prefix}exact"] = 100.0 * sum(exact[q] for q in qids) / n
            out[f"{prefix}f1"] = 100.0 * sum(f1[q] for q in qids) / n
            out[f"{prefix}total"] = len(qids)
    return out


def best_null_threshold(references: dict, span_predictions: dict, na_scores: dict, metric="f1") -> tuple[float, float]:
    """Official find_best_thresh: returns (best score in percent, threshold) for predicting "" when
    na_scores[qid] > threshold (utils.reader.decoding.abstains: the threshold returned is a question's score, which
    is then answered). span_predictions are the best non-null answers."""
    exact, f1 = raw_scores(references, span_predictions)
    scores = f1 if metric == "f1" else exact
    has_ans = {q: any(normalize_answer(x) for x in a) for q, a in references.items()}
    cur = best = sum(1 for q in references if not has_ans[q])  # threshold -inf: everything predicted null
    best_thresh = min(na_scores[q] for q in references) - 1.0 if references else 0.0
    for qid in sorted(references, key=lambda q: na_scores[q]):
        if has_ans[qid]:
            cur += scores[qid]
        elif span_predictions[qid]:
            cur -= 1
        if cur > best:
            best, best_thresh = cur, na_scores[qid]
    return 100.0 * best / max(len(references), 1), float(best_thresh)

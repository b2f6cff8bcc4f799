"""The rule for answering a question from several retrieved passages: one per way a reader was trained.

The reader reads each passage on its own and gives its best span (and that span's score: start + end logit), its
null score and, for the shared rule, the log-sum-exps of its windows' logits (utils.reader.decoding).

* A reader trained a paragraph at a time (`normalization` "window"): spans of different passages are compared on
  the span score, the system's answer is the best-scoring span of any passage, and the system abstains when every
  passage's null score beats its best span by more than a threshold: `null_minus_best` = min over passages of
  (null score - best span score) > threshold. With one passage this is exactly the reader's own SQuAD v2 rule.
* A reader trained with shared normalization (`normalization` "question", utils.reader.shared_norm): its scores are
  one softmax over all the windows of all the passages read, so the best span is again the best score of any
  passage, and the no-answer is one decision per question: its score is the log-sum-exp over every window of every
  passage of the [CLS] start logits plus that of the end logits, and `null_minus_best` (null - best span score) is
  the log of the ratio of the no-answer's probability to the best span's. `no_answer_probability` is the share of
  the start and end softmaxes (averaged) on the no-answer: a probability per question.

With `aggregate` (shared rule only, as castorini/pygaggle does for DPR's reader) the answer is the answer text, not
the span: the probabilities of every span (the n best of each passage) whose text normalises to the same string
are summed over the passages, the most probable string wins (shown as its best span), and the no-answer is
compared with it.

Either way the threshold is tuned like the reader's (utils.reader.metrics.best_null_threshold) on labelled
questions, and None (a SQuAD v1.1 reader) always answers.
"""

import math

NO_SPAN = {"text": "", "score": -math.inf, "null_score": math.inf, "null_minus_best": math.inf}


def _lse(values) -> float:
    values = [v for v in values if v != -math.inf]
    if not values:
        return -math.inf
    top = max(values)
    return top + math.log(sum(math.exp(v - top) for v in values))


def combine(passages: list[dict], shared: bool = False, aggregate: bool = False) -> dict:
    """The system's view of one question from its passages' readings (each {"passage_id", "text", "score",
    "null_score", "null_minus_best"}, and for `shared` "null_start", "null_end", "lse_start", "lse_end"; in
    retrieval order): the best span over the passages (the earlier passage on equal scores) and what the threshold
    compares (see the module docstring)."""
    best = max(passages, key=lambda p: p["score"], default=None)
    if best is None or best["score"] == -math.inf:
        return {"text": "", "passage_id": None, "score": None, "null_minus_best": math.inf,
                "no_answer_probability": 1.0 if shared else None}
    out = {"text": best["text"], "passage_id": best["passage_id"], "score": best["score"]}
    if not shared:
        return {**out, "null_minus_best": min(p["null_minus_best"] for p in passages), "no_answer_probability": None}
    null_start, null_end = _lse(p["null_start"] for p in passages), _lse(p["null_end"] for p in passages)
    lse_start, lse_end = _lse(p["lse_start"] for p in passages), _lse(p["lse_end"] for p in passages)
    probability = (math.exp(null_start - lse_start) + math.exp(null_end - lse_end)) / 2
    best_score = best["score"]
    if aggregate:  # log of the summed probability of each normalised answer string (the shared normalisers cancel)
        from utils.squad.answers import normalize_answer

        strings, shown = {}, {}
        for p in passages:
            for span in p.get("nbest") or []:
                key = normalize_answer(span["text"])
                strings.setdefault(key, []).append(span["score"])
                if key not in shown or span["score"] > shown[key]["score"]:
                    shown[key] = {**span, "passage_id": p["passage_id"]}
        key = max(strings, key=lambda k: (_lse(strings[k]), -len(k)))
        best_score, span = _lse(strings[key]), shown[key]
        out = {"text": span["text"], "passage_id": span["passage_id"], "score": best_score, "start": span.get("start"),
               "end": span.get("end")}
    return {**out, "null_minus_best": null_start + null_end - best_score, "no_answer_probability": probability}


def answer(combined: dict, threshold: float | None) -> str:
    """The answer text, "" when the system abstains (no span anywhere, or the no-answer beats the best span by more
    than `threshold`)."""
    if not combined["text"]:
        return ""
    if threshold is not None and combined["null_minus_best"] > threshold:
        return ""
    return combined["text"]

"""The one rule for answering a question from several retrieved passages.

The reader reads each passage on its own and gives its best span (and that span's score: start + end logit) and
its null score (the [CLS] start + end logit). Spans of different passages are compared on the span score: the
system's answer is the best-scoring span of any passage. The system abstains when every passage's null score
beats its best span by more than a threshold: `null_minus_best` = min over passages of (null score - best span
score) > threshold. With one passage this is exactly the reader's own SQuAD v2 rule (utils.reader.decoding), so a
reader's gold-paragraph score and the system's are measured the same way; the threshold is tuned like the reader's
(utils.reader.metrics.best_null_threshold) on labelled questions, and None (a SQuAD v1.1 reader) always answers.
"""

import math

NO_SPAN = {"text": "", "score": -math.inf, "null_score": math.inf, "null_minus_best": math.inf}


def combine(passages: list[dict]) -> dict:
    """The system's view of one question from its passages' readings (each {"passage_id", "text", "score",
    "null_score", "null_minus_best"}, in retrieval order): the best span over the passages (the earlier passage on
    equal scores) and the smallest null-minus-best."""
    best = max(passages, key=lambda p: p["score"], default=None)
    if best is None or best["score"] == -math.inf:
        return {"text": "", "passage_id": None, "score": None, "null_minus_best": math.inf}
    return {"text": best["text"], "passage_id": best["passage_id"], "score": best["score"],
            "null_minus_best": min(p["null_minus_best"] for p in passages)}


def answer(combined: dict, threshold: float | None) -> str:
    """The answer text, "" when the system abstains (no span anywhere, or every passage's null score beats its best
    span by more than `threshold`)."""
    if not combined["text"]:
        return ""
    if threshold is not None and combined["null_minus_best"] > threshold:
        return ""
    return combined["text"]

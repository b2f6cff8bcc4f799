"""Does a text hold one of a question's answers? The one matcher for every place that asks: the SQuAD -> DPR
converter (hard negatives must hold no answer), sentence windows (the positive is the window that holds one) and
refreshed negatives (an answer-bearing passage is probably a false negative).

Texts and answers are compared after the SQuAD normalisation (utils.reader.metrics.normalize_answer: lower case,
punctuation and articles removed, whitespace collapsed) and on token boundaries: the answer "V" is in "Henry V
died" but not in "Vienna". A raw substring test would let a one- or two-character answer ("V", "11", "3%")
match almost any text. An answer that normalises to nothing (".", "the") matches nothing.
"""

from utils.reader.metrics import normalize_answer


def normalized(text: str) -> str:
    """`text` in the form `holds_answer` searches: normalised, with a space at each end (token boundaries)."""
    return f" {normalize_answer(text)} "


def answer_patterns(answers) -> list[str]:
    """A question's answer strings in the form `holds_answer` looks for; non-strings and empty answers dropped."""
    out = []
    for answer in answers or []:
        if isinstance(answer, str) and (n := normalize_answer(answer)):
            out.append(f" {n} ")
    return out


def holds_answer(normalized_text: str, patterns: list[str]) -> bool:
    """Whether a text (from `normalized`) holds one of the answers (from `answer_patterns`) as whole tokens."""
    return any(p in normalized_text for p in patterns)

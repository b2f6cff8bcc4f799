"""Answer text: the SQuAD normalisation (what EM/F1 compare) and whether a text holds one of a question's answers,
the one matcher for every place that asks: the SQuAD -> DPR converter (hard negatives must hold no answer), sentence
windows (the positive is the window that holds one), refreshed negatives (an answer-bearing passage is probably a
false negative), the reader's negative passages and the QA system's recall.

Texts and answers are compared after the SQuAD normalisation (lower case, punctuation and articles removed,
whitespace collapsed) and on token boundaries: the answer "V" is in "Henry V died" but not in "Vienna". A raw
substring test would let a one- or two-character answer ("V", "11", "3%") match almost any text. An answer that
normalises to nothing (".", "the") matches nothing.
"""

import re
import string

_DROP_PUNCT = str.maketrans("", "", string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)


def normalize_answer(s: str) -> str:
    """Lower case, ASCII punctuation removed, the articles a/an/the removed, whitespace collapsed (the official
    SQuAD evaluation's normalisation)."""
    return " ".join(_ARTICLES.sub(" ", s.lower().translate(_DROP_PUNCT)).split())


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

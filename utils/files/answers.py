"""Answer text: the SQuAD normalisation (what EM/F1 compare) and whether a text holds one of a question's answers,
the one matcher for every place that asks: the SQuAD -> DPR converter (hard negatives must hold no answer), sentence
windows (the positive is the window that holds one), refreshed negatives (an answer-bearing passage is probably a
false negative), the reader's extra passages (negatives, and the spans that label positives) and the QA system's
recall.

Texts and answers are compared after the SQuAD normalisation (lower case, punctuation and articles removed,
whitespace collapsed) and on token boundaries: the answer "V" is in "Henry V died" but not in "Vienna". A raw
substring test would let a one- or two-character answer ("V", "11", "3%") match almost any text. An answer that
normalises to nothing (".", "the") matches nothing. A span is labelled by the same rule (`answer_spans`): an
occurrence of an answer's exact text counts where the normalised text holds it there as whole tokens, so "Ada" is
labelled in "Ada built" but neither in "Adams" nor in "Ada's" ("adas"), where the matcher does not find it either.
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


def answer_spans(text: str, answers) -> list[tuple[int, int]]:
    """Character spans (start, end) of every occurrence of an answer's exact text in `text` that `holds_answer`
    counts: normalised in place, the occurrence is whole tokens of the normalised text (the text normalised in three
    pieces, before, the occurrence and after, joins to the text normalised whole). Sorted, each once; answers that
    normalise to nothing, and non-strings, label nothing."""
    whole = normalize_answer(text)
    spans = set()
    for answer in answers or []:
        if not (isinstance(answer, str) and normalize_answer(answer)):
            continue
        at = text.find(answer)
        while at != -1:
            end = at + len(answer)
            pieces = (normalize_answer(text[:at]), normalize_answer(answer), normalize_answer(text[end:]))
            if " ".join(p for p in pieces if p) == whole:  # no token of the text runs across either cut
                spans.add((at, end))
            at = text.find(answer, at + 1)
    return sorted(spans)

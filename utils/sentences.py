"""The sentences of a text and its windows of N consecutive sentences: the split a --window_sentences retriever is
trained and ranks with (utils.retriever.sentence_windows) and the one to split documents with when serving it
elsewhere (docs/COMPATIBILITY.md, Haystack 3.x). Standard library only, so that it imports in any environment."""

import re

# A sentence ends at . ! or ? followed by space and a capital, digit, quote or bracket: good enough for Wikipedia-style
# prose (an abbreviation such as "U.S. Army" may split a sentence in two, which costs a window, not a passage).
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(\[])")


def split_sentences(text: str) -> list[str]:
    """The sentences of `text` (stripped), at least one."""
    return _SENTENCE_END.split(text.strip())


def window_texts(text: str, sentences: int) -> list[str]:
    """The windows of `sentences` consecutive sentences of `text`, stride 1 (one, all of it, when it has fewer
    sentences); with sentences=0 the text itself, unsplit."""
    if not sentences:
        return [text]
    parts = split_sentences(text)
    return [" ".join(parts[s:s + sentences]) for s in range(max(1, len(parts) - sentences + 1))]

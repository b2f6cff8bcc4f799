"""A document's text cut into passages, as DPR's passages of 100 words and Haystack's PreProcessor (split_by="word",
split_respect_sentence_boundary) cut it: consecutive whole sentences (utils.sentences.split_sentences) up to a word
budget, each passage starting with the last sentences of the one before (the overlap), so that an answer near a cut
is whole in one of the two.

The rules: a document is a list of blocks (paragraphs, headings, list items; a PDF's blocks carry their page); a
sentence never spans two blocks. A passage is at most `max_words` words (whitespace-separated), never cut inside a
sentence, except a sentence longer than the budget, which is cut into pieces of `max_words` words (the last one
shorter), each piece then taken as a sentence. Sentences of one block are joined by a space, of two blocks by a
newline. The next passage starts with the previous one's last whole sentences of at most `overlap_words` words in all
(as many as leave room for the first new sentence), so it always brings at least one sentence the previous one did
not have; the document's last passage is the one that reaches its last sentence (none of overlap alone follows).
"""

from dataclasses import dataclass
from typing import Iterable, Iterator, NamedTuple, Optional

from utils.errors import UserError, check_at_least_one
from utils.runtime.flags import arg
from utils.sentences import split_sentences

Block = tuple[str, Optional[int]]  # a block's text and its page (a PDF's; else None)


@dataclass(frozen=True)
class SplitConfig:
    max_words: int = arg(100, "Most words in a passage (as DPR's passages of 100 words): passages end at sentence "
                              "ends, and a longer sentence is cut into pieces of this many words.")
    overlap_words: int = arg(20, "Most words of whole sentences a passage repeats from the end of the one before, so "
                                 "that an answer near a cut is whole in one of them (0: no overlap); less than "
                                 "--max_words.")

    def __post_init__(self):
        check_at_least_one(self, "max_words")
        if not 0 <= self.overlap_words < self.max_words:
            raise UserError(f"--overlap_words must be at least 0 and less than --max_words ({self.max_words}), got "
                            f"{self.overlap_words}")


class Sentence(NamedTuple):
    text: str
    words: int
    block: int  # the block it is in (its position in the document)
    page: Optional[int]  # the block's page (a PDF's), else None


def sentences(blocks: Iterable[Block], max_words: int) -> list[Sentence]:
    """The sentences of a document's blocks ((text, page) pairs), each of at most `max_words` words (a longer one
    cut into pieces of that many words)."""
    out = []
    for number, (text, page) in enumerate(blocks):
        for sentence in split_sentences(text):
            words = sentence.split()
            for start in range(0, len(words), max_words):
                piece = words[start:start + max_words]
                out.append(Sentence(" ".join(piece), len(piece), number, page))
    return out


def passage_text(parts: list[Sentence]) -> str:
    """Sentences joined: by a space within a block, by a newline between blocks."""
    return "".join(("" if i == 0 else " " if s.block == parts[i - 1].block else "\n") + s.text
                   for i, s in enumerate(parts))


def split_passages(blocks: Iterable[Block], config: SplitConfig) -> Iterator[tuple[str, Optional[int]]]:
    """The passages of a document, in order, by the rules above: (text, page of its first sentence) pairs."""
    parts = sentences(blocks, config.max_words)
    start = 0
    while start < len(parts):
        end, words = start, 0
        while end < len(parts) and words + parts[end].words <= config.max_words:
            words += parts[end].words
            end += 1
        yield passage_text(parts[start:end]), parts[start].page
        if end == len(parts):
            return
        # the overlap: whole sentences back from the cut, within the overlap budget and leaving room for the first
        # new sentence. It never reaches `start`: the passage and that sentence are more than max_words together.
        room = min(config.overlap_words, config.max_words - parts[end].words)
        overlap, words = end, 0
        while words + parts[overlap - 1].words <= room:
            overlap -= 1
            words += parts[overlap].words
        start = overlap

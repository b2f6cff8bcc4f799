"""A document's text cut into passages, as DPR's passages of 100 words and Haystack's PreProcessor (split_by="word",
split_respect_sentence_boundary) cut it: consecutive whole sentences (utils.sentences.split_sentences) up to a word
budget, each passage starting with the last sentences of the one before (the overlap), so that an answer near a cut
is whole in one of the two.

The rules: a document is a list of blocks (paragraphs, headings, list items; a PDF's blocks carry their page); a
sentence never spans two blocks. A passage is at most `max_words` words (whitespace-separated) and `max_chars`
characters (the bound of text whose words are not separated by spaces, as Chinese, or are very long), never cut
inside a sentence, except a sentence over that budget, which is cut into pieces, each then taken as a sentence:
each piece as long as the budget allows, ending at a space where it has one after the piece before (else inside a
run of characters), and starting with the last words of the piece before, up to `overlap_words` words and the same
share of `max_chars` in characters (after a cut inside a run, its last characters up to that share), so that an
answer near the cut is whole in one of the two. Sentences of one block are joined by a space, of two blocks by a
newline. The next passage starts with the previous one's last whole sentences of at most `overlap_words` words in
all (as many as leave room in the budget for the first new sentence), so it always brings at least one sentence the
previous one did not have; the document's last passage is the one that reaches its last sentence (none of overlap
alone follows).
"""

import re
from dataclasses import dataclass
from itertools import islice
from typing import Iterable, Iterator, NamedTuple, Optional

from utils.errors import UserError, check_at_least_one
from utils.runtime.flags import arg
from utils.sentences import split_sentences

Block = tuple[str, Optional[int]]  # a block's text and its page (a PDF's; else None)


@dataclass(frozen=True)
class SplitConfig:
    max_words: int = arg(100, "Most words in a passage (as DPR's passages of 100 words): passages end at sentence "
                              "ends, and a longer sentence is cut into overlapping pieces of at most this many "
                              "words.")
    overlap_words: int = arg(20, "Most words of whole sentences a passage repeats from the end of the one before, so "
                                 "that an answer near a cut is whole in one of them (0: no overlap); less than "
                                 "--max_words. The pieces of a sentence cut for the budget overlap by as much.")
    max_chars: int = arg(1000, "Most characters in a passage, the budget of text whose words are not separated by "
                               "spaces (Chinese, Japanese) or are very long (a URL, a line of data): cut as "
                               "--max_words cuts, at a space where there is one. Prose of --max_words words stays "
                               "within it: raise it with --max_words.")

    def __post_init__(self):
        check_at_least_one(self, "max_words", "max_chars")
        if not 0 <= self.overlap_words < self.max_words:
            raise UserError(f"--overlap_words must be at least 0 and less than --max_words ({self.max_words}), got "
                            f"{self.overlap_words}")


class Sentence(NamedTuple):
    text: str
    words: int
    chars: int
    block: int  # the block it is in (its position in the document)
    page: Optional[int]  # the block's page (a PDF's), else None


WORD = re.compile(r"\S+")


def sentences(blocks: Iterable[Block], config: SplitConfig) -> list[Sentence]:
    """The sentences of a document's blocks ((text, page) pairs), each within the budget (a longer one cut into
    pieces), its words one space apart."""
    out = []
    for number, (text, page) in enumerate(blocks):
        for sentence in split_sentences(text):
            out += [Sentence(piece, len(piece.split()), len(piece), number, page)
                    for piece in pieces(" ".join(sentence.split()), config)]
    return out


def pieces(text: str, config: SplitConfig) -> list[str]:
    """A sentence (its words one space apart) within the budget as itself; a longer one in overlapping pieces."""
    out, start, end = [], 0, 0
    while end < len(text):
        end = piece_end(text, start, end, config)
        out.append(text[start:end])
        if end < len(text):
            start = overlap_start(text, start, end, config)
    return out


def piece_end(text: str, start: int, done: int, config: SplitConfig) -> int:
    """Where the piece of `text` from `start` ends: as far as the budget allows, at a space after `done` (the end of
    the piece before) where there is one, else inside a run of characters. Always after `done`: the piece overlaps
    the one before by less than the budget."""
    end = min(len(text), start + config.max_chars)
    words = list(islice(WORD.finditer(text, start, end), config.max_words + 1))
    if len(words) > config.max_words:
        return words[config.max_words - 1].end()
    if end < len(text) and text[end] != " " and (space := text.rfind(" ", done + 1, end)) > done:
        return space
    return end


def overlap_chars(config: SplitConfig) -> int:
    """The characters a piece repeats at most: the share of max_chars that overlap_words is of max_words."""
    return config.max_chars * config.overlap_words // config.max_words


def overlap_start(text: str, start: int, end: int, config: SplitConfig) -> int:
    """Where the piece after text[start:end] starts: at its last words, up to overlap_words words within
    `overlap_chars` (after a cut inside a run of characters with no space in that reach, the run's last characters
    within it); at the next word where none fit."""
    least = max(end - overlap_chars(config), start + 1)
    at = end
    for _ in range(config.overlap_words):
        space = text.rfind(" ", least - 1, at - 1)  # the space before the word that ends before `at`
        if space < 0:
            if at == end and text[end] != " ":  # cut inside a run: its last characters
                at = least
            break
        at = space + 1
    return at + 1 if at == end and text[end] == " " else at


def passage_text(parts: list[Sentence]) -> str:
    """Sentences joined: by a space within a block, by a newline between blocks."""
    return "".join(("" if i == 0 else " " if s.block == parts[i - 1].block else "\n") + s.text
                   for i, s in enumerate(parts))


def split_passages(blocks: Iterable[Block], config: SplitConfig) -> Iterator[tuple[str, Optional[int]]]:
    """The passages of a document, in order, by the rules above: (text, page of its first sentence) pairs."""
    parts = sentences(blocks, config)
    start = 0
    while start < len(parts):
        # chars: a passage's characters, each sentence after the first with the space or newline before it
        end, words, chars = start, 0, -1
        while (end < len(parts) and words + parts[end].words <= config.max_words
               and chars + 1 + parts[end].chars <= config.max_chars):
            words += parts[end].words
            chars += 1 + parts[end].chars
            end += 1
        yield passage_text(parts[start:end]), parts[start].page
        if end == len(parts):
            return
        # the overlap: whole sentences back from the cut, within the overlap budget and leaving room for the first
        # new sentence. It never reaches `start`: the passage and that sentence are over the budget together.
        room = min(config.overlap_words, config.max_words - parts[end].words)
        overlap, words, chars = end, 0, parts[end].chars
        while words + parts[overlap - 1].words <= room and chars + 1 + parts[overlap - 1].chars <= config.max_chars:
            overlap -= 1
            words += parts[overlap].words
            chars += 1 + parts[overlap].chars
        start = overlap

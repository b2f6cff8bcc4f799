"""The splitting's character budget and its cut sentences (issue 58, item 11): passages bounded in characters as
well as words (text without spaces, as Chinese, or a line of data), a sentence cut for the budget in pieces that
overlap as sentences do, and ordinary prose cut as before."""

import json
import os
from types import SimpleNamespace

from conftest import SAMPLE, assert_user_error
from test_documents import ingest, rows

from utils.splitting import SplitConfig, split_passages

# --- the splitting: characters, and sentences cut for the budget --------------------------------------------------

def passages_of(text, **config):
    return [t for t, _ in split_passages([(text, None)], SplitConfig(**config))]


def test_text_without_sentence_punctuation_overlaps_at_its_cuts():
    words = [f"word{i}" for i in range(250)]
    passages = [p.split() for p in passages_of(" ".join(words))]  # the defaults: 100 words, 20 of overlap
    assert [(p[0], p[-1]) for p in passages] == [("word0", "word99"), ("word80", "word179"), ("word160", "word249")]
    for start in range(len(words) - 20):  # any span of up to 21 words is whole in one passage
        span = " ".join(words[start:start + 21])
        assert any(span in " ".join(p) for p in passages), start


def test_passages_are_bounded_in_characters_too(tmp_path, capsys):
    chinese = "灯塔建于托勒密二世统治时期它是古代世界七大奇迹之一" * 2000  # 50,000 characters, no space, no "."
    passages = passages_of(chinese)
    assert len(passages) > 1 and all(len(p) <= 1000 for p in passages)
    # each piece starts with the last characters of the one before: the same share of 1000 as 20 words is of 100
    assert passages[0] + "".join(p[200:] for p in passages[1:]) == chinese
    assert all(before.endswith(after[:200]) for before, after in zip(passages, passages[1:]))

    # preferably at a space: words longer than usual are never cut where a space is in reach
    long_words = " ".join(f"{i:03d}" + "x" * 46 for i in range(60))  # 60 words of 49 characters
    passages = passages_of(long_words)
    assert all(len(p) <= 1000 for p in passages)
    assert all(word.startswith(tuple("0123456789")) and len(word) == 49 for p in passages for word in p.split())

    # a 3 MB line without a space (a line of data), ingested: passages within the bound, none lost
    (line := tmp_path / "line.txt").write_text("ab" * 1_500_000)
    output = tmp_path / "corpus.jsonl"
    code, _, err = ingest(capsys, "--documents", line, "--output", output, "--overlap_words", 0)
    assert code == 0, err
    texts = [r["text"] for r in rows(output)]
    assert all(len(t) <= 1000 for t in texts) and "".join(texts) == "ab" * 1_500_000

    code, _, err = ingest(capsys, "--documents", line, "--output", output, "--max_chars", 0)
    assert_user_error(SimpleNamespace(returncode=code, stderr=err), "--max_chars must be at least 1 (got 0)")


def test_the_character_budget_changes_no_passage_of_prose():
    """The shipped sample's paragraphs (Wikipedia prose), split at the defaults, as without a character budget."""
    texts = [json.loads(line)["text"] for line in open(os.path.join(SAMPLE, "dpr_passages.jsonl"), encoding="utf-8")]
    for name in ("train.json", "dev.json"):
        with open(os.path.join(SAMPLE, name), encoding="utf-8") as f:
            texts += [p["context"] for article in json.load(f)["data"] for p in article["paragraphs"]]
    assert len(texts) > 50
    for text in texts:
        blocks = [(text, None)]
        assert list(split_passages(blocks, SplitConfig())) == list(split_passages(blocks,
                                                                                   SplitConfig(max_chars=10 ** 9)))


def test_a_sentence_cut_for_the_budget_comes_in_order_between_whole_sentences():
    short = [f"Short sentence number {i} ends here." for i in range(3)]
    long_sentence = " ".join(f"W{i}" for i in range(150)) + "."  # no sentence end in it
    passages = passages_of(" ".join(short + [long_sentence] + short))
    words = long_sentence.split()
    assert passages == [" ".join(short), " ".join(words[:100]), " ".join(words[80:] + short)]

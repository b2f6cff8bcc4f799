"""One answer matcher (utils.files.answers) for the converter, sentence windows, refreshed negatives and the spans the
reader's extra passages are labelled with: SQuAD-normalised text, whole tokens only, so that one- and two-character
answers do not match inside words."""

import json

import numpy as np

from make_dpr_data import build
from utils.files.squad import load_squad
from utils.files.answers import answer_patterns, answer_spans, holds_answer, normalized
from utils.reader.passages import passage_pools
from utils.retriever.mined_negatives import select_negatives
from utils.retriever.sentence_windows import training_windows


def holds(text, *answers):
    return holds_answer(normalized(text), answer_patterns(answers))


def test_answers_match_whole_tokens_of_the_normalised_text():
    assert holds("Henry V died in 1422.", "V") and not holds("Vienna is far away.", "V")
    assert holds("Prices rose 11 times.", "11") and not holds("In 1911 prices rose.", "11")
    assert holds("It rose by 3% that year.", "3%") and not holds("It rose 30% that year.", "3%")
    assert holds("The Beatles played.", "the Beatles") and holds("A tour of THE  U.S. Army", "U.S. army")
    assert holds("Matilda Reyes's plans", "Matilda Reyes") is False  # "reyess": the SQuAD normalisation's own cut
    assert answer_patterns([".", "the", "", None, 7, "  "]) == [] and not holds("the end.", ".", "the")


def test_the_spans_labelled_are_the_occurrences_the_matcher_finds():
    """An occurrence of an answer's exact text is labelled as a span exactly when the matcher finds the answer there:
    "Ada" is not in "Ada's" ("adas" once normalised) nor "loom" in "loom-makers" ("loommakers"), so a passage that
    holds them only so is neither labelled nor said to hold the answer; it is a negative."""
    cases = [("Adams and Ada's loom-makers", "Ada", []), ("Adams and Ada's loom-makers", "loom", []),
             ("Ada's loom, built by Ada.", "Ada", [(21, 24)]), ("the U.S.A. army", "U.S", []),
             ("the U.S.A. and the U.S. army", "U.S", [(19, 22)]), ("Henry V died in 1422.", "V", [(6, 7)]),
             ("Vienna", "V", []), ("It rose by 3% that year.", "3%", [(11, 13)]), ("it's late", "it", [])]
    for text, answer, spans in cases:
        assert answer_spans(text, [answer]) == spans, (text, answer)
        assert bool(spans) == holds(text, answer), (text, answer)
    # the pools of the reader's extra passages: "Ada's" alone neither labels a span nor hides a positive
    passages = [{"passage_id": "0", "title": "Mill", "text": "Ada's loom stood in the mill."},
                {"passage_id": "1", "title": "Ada", "text": "It was Ada who built the loom."}]
    example = {"question": "Who built the loom?", "context": "Ada built a loom.", "answers": {"text": ["Ada"]}}
    (pool,) = passage_pools([example], passages, [[0, 1]], 2)
    assert sorted(pool, key=lambda x: x["passage"]) == [{"passage": 0, "spans": []}, {"passage": 1, "spans": [(7, 10)]}]


def ctx(pid, text):
    return {"title": "T", "text": text, "passage_id": pid}


def test_a_short_answer_picks_its_own_sentence_and_keeps_words_that_contain_it_as_negatives():
    gold = ctx("g", "Vienna hosted the talks. Henry V signed the treaty. Everyone left.")
    hard = ctx("h", "Victory was declared. The vote was close.")
    q = {"id": "q", "question": "Who signed the treaty?", "answers": ["V"], "positive_ctxs": [gold],
         "hard_negative_ctxs": [hard], "negative_ctxs": []}
    (w,), _ = training_windows([q], 1)
    assert w["positive_ctxs"][0]["text"] == "Henry V signed the treaty."  # not the first sentence with a "v"
    assert [c["text"] for c in w["hard_negative_ctxs"]] == ["Victory was declared.", "The vote was close."]

    passages = [gold, ctx("a", "Henry V was king."), ctx("b", "Vienna is large."), ctx("c", "A quiet town.")]
    chosen = select_negatives(np.array([[1, 2, 3, 0]]), [q], passages, 2, np.array([[3, 3]]))
    assert chosen.tolist() == [[2, 3]]


def test_the_converter_uses_the_same_matcher(tmp_path):
    paragraphs = ["Henry V signed the treaty in Calais.", "Vienna hosted the treaty talks in Calais.",
                  "The treaty of Henry V was signed in Calais."]
    squad = {"version": "v2.0", "data": [{"title": "T", "paragraphs": [
        {"context": paragraphs[0], "qas": [{"id": "q1", "question": "Who signed the treaty in Calais?",
                                            "answers": [{"text": "V", "answer_start": 6}], "is_impossible": False}]},
        *({"context": c, "qas": [{"id": f"u{i}", "question": "Why?", "answers": [], "is_impossible": True}]}
          for i, c in enumerate(paragraphs[1:]))]}]}
    path = tmp_path / "squad.json"
    path.write_text(json.dumps(squad))
    data, passages = build(load_squad(str(path))[0], num_hard_negatives=2, num_negatives=0, seed=0)
    # "Vienna" holds a "v" but not the answer "V": a hard negative; the paragraph that does hold "V" is not
    assert [c["text"] for c in data[0]["hard_negative_ctxs"]] == [paragraphs[1]]

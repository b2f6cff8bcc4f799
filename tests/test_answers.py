"""One answer matcher (utils.squad.answers) for the converter, sentence windows and refreshed negatives: SQuAD-normalised
text, whole tokens only, so that one- and two-character answers do not match inside words."""

import json

import numpy as np

from utils.squad.files import load_squad
from utils.squad.answers import answer_patterns, holds_answer, normalized
from utils.retriever.make_dpr_data import build
from utils.retriever.negatives import select_negatives
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

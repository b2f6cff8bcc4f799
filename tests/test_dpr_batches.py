"""DPR batches: tokenised once and padded on demand, passages encoded in length buckets, refreshed negatives."""

import numpy as np
import torch

from utils.retriever.bi_encoder import BiEncoder
from utils.retriever.encoding import Tokenized
from utils.retriever.mined_negatives import select_negatives


def test_tokenized_once_pads_like_the_tokenizer(tokenizer):
    titles = ["Harrowgate Lighthouse", "Orrin Valley", "Corran"]
    texts = ["It was designed by Matilda Reyes in 1871 and stands on the cliff.", "A railway.", "A tower " * 40]
    tok = Tokenized(lambda idx: tokenizer([titles[i] for i in idx], [texts[i] for i in idx],
                                          truncation="only_second", max_length=64), list(range(3)), chunk=2)
    for rows in ([0, 1, 2], [2, 0], [1]):
        got = tok.batch(rows, tokenizer.pad_token_id)
        want = tokenizer([titles[i] for i in rows], [texts[i] for i in rows], truncation="only_second", max_length=64,
                         padding=True, pad_to_multiple_of=8, return_tensors="pt")
        assert got.keys() == {"input_ids", "token_type_ids", "attention_mask"}
        for key in got:
            assert torch.equal(got[key], want[key]), key


def test_length_buckets_give_the_padded_batch_embeddings(tiny_bert_no_dropout_dir, tokenizer):
    texts = ["short", "a somewhat longer passage about a lighthouse", "x " * 90, "mid length text of words here",
             "one", "the longest passage " * 12, "two words"]
    inputs = dict(tokenizer(texts, padding=True, return_tensors="pt"))
    model = BiEncoder.from_pretrained(tiny_bert_no_dropout_dir, tiny_bert_no_dropout_dir, True, "mean", True).eval()
    with torch.no_grad():
        one = model(passage=inputs)[1]
        for buckets in (2, 3, 7, 20):
            model.length_buckets = buckets
            torch.testing.assert_close(model(passage=inputs)[1], one, atol=1e-5, rtol=1e-5)
    model.length_buckets = 3  # and the gradient flows back through the re-ordering
    model.train()
    model(passage=inputs)[1].sum().backward()
    assert model.query_encoder.embeddings.word_embeddings.weight.grad.abs().sum() > 0


def ctx(pid, text):
    return {"title": "T", "text": text, "passage_id": pid}


def test_refresh_never_selects_a_positive_or_an_answer_bearing_passage():
    passages = [ctx("gold", "The tower was designed by Matilda Reyes."),
                ctx("copy-of-gold", "The tower was  designed by Matilda Reyes."),  # same text, other id
                ctx("answer", "Reyes's plans: MATILDA  REYES signed them."),  # contains the answer (case, spaces)
                ctx("n1", "The tower is 40 metres tall."), ctx("n2", "A railway reached the town."),
                ctx("n3", "The lamp was electrified."), ctx("gold-2", "Second positive of the question.")]
    questions = [{"id": "q", "question": "Who designed the tower?", "answers": ["Matilda Reyes"],
                  "positive_ctxs": [passages[0], passages[6]]}]
    ranked = np.array([[1, 2, 6, 0, 4, 3, 5]])  # the model's ranking, best first
    assert select_negatives(ranked, questions, passages, 2, np.array([[3, 5]])).tolist() == [[4, 3]]
    # a corpus too small to fill up: the earlier negatives fill the rest
    assert select_negatives(np.array([[0, 1, 4]]), questions, passages, 2, np.array([[3, 5]])).tolist() == [[4, 3]]
    assert select_negatives(np.array([[0, 1, 2]]), questions, passages, 2, np.array([[3, 5]])).tolist() == [[3, 5]]


def test_sentence_windows_keep_the_title_and_their_passage():
    from utils.retriever.sentence_windows import sentence_windows

    passages = [{"title": "Corran",
                 "text": "The lighthouse is old. It was built in 1871! Who built it? Matilda Reyes."},
                {"title": "Orrin", "text": "A railway crosses the valley (built by the U.S. Army)."}]
    windows, owner = sentence_windows(passages, 1)
    assert [w["text"] for w in windows] == ["The lighthouse is old.", "It was built in 1871!", "Who built it?",
                                            "Matilda Reyes.", "A railway crosses the valley (built by the U.S.",
                                            "Army)."]  # an abbreviation before a capital splits: a cost, not a loss
    assert [w["title"] for w in windows] == ["Corran"] * 4 + ["Orrin"] * 2 and owner.tolist() == [0, 0, 0, 0, 1, 1]
    windows, owner = sentence_windows(passages, 3)
    assert [w["text"] for w in windows][:2] == ["The lighthouse is old. It was built in 1871! Who built it?",
                                                "It was built in 1871! Who built it? Matilda Reyes."]
    assert owner.tolist() == [0, 0, 1]  # fewer sentences than a window: the passage is one window
    windows, owner = sentence_windows(passages, 0)
    assert windows == passages and owner.tolist() == [0, 1]


def test_training_windows_train_on_the_answer_sentence_against_sentences():
    from utils.files.corpus import passage_key, text_key
    from utils.retriever.sentence_windows import training_windows

    gold = {"title": "Corran", "text": "The lighthouse is old. It was built in 1871! Who built it? Matilda Reyes.",
            "passage_id": "p1"}
    hard = {"title": "Orrin", "text": "Birds nest. The Orrin bridge was built in 1871. Lighthouse keepers lived here.",
            "passage_id": "h1"}
    other = {"title": "Far", "text": "Far away. Quiet place."}  # no passage_id: its windows are keyed by its text
    q = {"id": "q1", "question": "When was the lighthouse built?", "answers": ["1871"], "positive_ctxs": [gold],
         "hard_negative_ctxs": [hard], "negative_ctxs": [other]}
    split = {**q, "id": "q2", "answers": ["old. It was"]}  # the answer crosses a sentence break
    (a, b), whole = training_windows([q, split], 1)
    assert a["positive_ctxs"] == [{"title": "Corran", "text": "It was built in 1871!", "passage_id": "p1",
                                   "passage_key": "p1", "window": 1}]
    # hard negatives: no answer-bearing window (the bridge sentence holds "1871"); the one sharing the question's
    # term "lighthouse" first, then passage order
    assert [(w["text"], text_key(w)) for w in a["hard_negative_ctxs"]] == [
        ("Lighthouse keepers lived here.", "h1#2"), ("Birds nest.", "h1#0")]
    # the other sentences of the gold paragraph are that paragraph, not negatives: only the negative passage's
    assert [(w["text"], passage_key(w), w["window"]) for w in a["negative_ctxs"]] == [
        ("Far away.", "text:Far away. Quiet place.", 0), ("Quiet place.", "text:Far away. Quiet place.", 1)]
    assert all(w["title"] == "Far" for w in a["negative_ctxs"])
    assert whole == 1 and b["positive_ctxs"] == [gold]  # no window holds the answer: the whole passage
    assert [w["text"] for w in b["negative_ctxs"]] == ["Far away.", "Quiet place."]
    assert len({text_key(w) for w in a["positive_ctxs"] + a["hard_negative_ctxs"] + a["negative_ctxs"]}) == 5
    assert q["positive_ctxs"] == [gold]  # the caller's questions are left as they were


def test_batch_ranks_from_scores_rank_among_the_losss_unmasked_logits():
    from utils.retriever.loss import batch_ranks, contrastive_scores

    generator = torch.Generator().manual_seed(0)
    q, p = torch.randn(4, 8, generator=generator), torch.randn(8, 8, generator=generator)
    keys = torch.tensor([1, 2, 3, 4, 1, 5, 6, 7])  # question 2's positive duplicates question 0's
    logits = contrastive_scores(q, p, torch.arange(4) * 2, keys, 1.0)  # what the loss sees (duplicates at -inf)
    want = [int((logits[i] >= logits[i, 2 * i]).sum()) for i in range(4)]  # ties against, as everywhere
    assert batch_ranks(q @ p.T, keys).tolist() == want
    assert logits[0, 4] == float("-inf") and logits[2, 0] == float("-inf")


def test_every_window_carries_its_passage_so_masking_and_mining_treat_it_as_that_passage(tokenizer):
    """Two questions about one paragraph, answered by different sentences, are each other's duplicates (masked), a
    question kept on the whole paragraph masks that paragraph's sentences, and a refresh never picks a sentence of
    the question's own gold paragraph."""
    from utils.files.dpr import training_passages
    from utils.retriever.config import EncoderConfig
    from utils.retriever.loss import contrastive_scores
    from utils.retriever.sentence_windows import training_windows
    from utils.retriever.training_batches import TrainingData

    gold = ctx("g", "The lighthouse is old. It was built in 1871. Matilda Reyes designed it.")
    neg = ctx("n", "A railway crosses the valley. Trains run at noon.")
    qs = [{"id": "when", "question": "When was it built?", "answers": ["1871"], "positive_ctxs": [gold],
           "hard_negative_ctxs": [neg], "negative_ctxs": []},
          {"id": "who", "question": "Who designed it?", "answers": ["Matilda Reyes"], "positive_ctxs": [gold],
           "hard_negative_ctxs": [neg], "negative_ctxs": []},
          {"id": "whole", "question": "How old is it?", "answers": ["old. It"], "positive_ctxs": [gold],
           "hard_negative_ctxs": [neg], "negative_ctxs": []}]
    train, whole = training_windows(qs, 1)
    assert whole == 1 and [q["positive_ctxs"][0]["text"] for q in train] == [
        "It was built in 1871.", "Matilda Reyes designed it.", gold["text"]]
    encoders = EncoderConfig("unused", "unused", shared_encoder=True, pooling="cls", similarity="dot", embed_title=True,
                             window_sentences=1, max_query_length=32, max_passage_length=64, length_buckets=1,
                             export_dpr=False)
    data = TrainingData(train, training_passages(train, 1, seed=0), tokenizer, tokenizer, encoders, refresh=True)
    batch = data.batch(np.arange(3))
    keys = batch["passage_keys"]  # [pos_0, neg_0, pos_1, neg_1, pos_2, neg_2]
    assert keys[0] == keys[2] == keys[4] and len(set(keys[[0, 1, 3]].tolist())) == 2
    logits = contrastive_scores(torch.eye(3, 4), torch.ones(6, 4), torch.tensor([0, 2, 4]), keys, 1.0)
    for i, own in enumerate((0, 2, 4)):
        assert [j for j in range(6) if logits[i, j] == float("-inf")] == [j for j in (0, 2, 4) if j != own]

    ranked = np.argsort([0 if c["passage_id"] == "g" else 1 for c in data.passages], kind="stable")[None]
    refreshed = select_negatives(ranked.repeat(3, 0), train, data.passages, 1, data.question_passages[:, 1:])
    assert all(data.passages[j]["passage_id"] == "n" for j in refreshed.ravel())  # gold sentences ranked first


def test_refreshed_negatives_are_never_short_nor_duplicated():
    passages = [ctx("gold", "The gold passage."), ctx("a", "Answer: Matilda Reyes."), ctx("x", "Other."),
                ctx("y", "Another.")]
    questions = [{"id": "q", "question": "Who?", "answers": ["Matilda Reyes"], "positive_ctxs": [passages[0]]}]
    # The ranking holds only the gold and an answer-bearing passage; the earlier negatives repeat one passage.
    chosen = select_negatives(np.array([[0, 1]]), questions, passages, 2, np.array([[2, 2]]))
    assert chosen.tolist() == [[2, 3]]
    chosen = select_negatives(np.array([[0, 1]]), questions, passages[:3], 2, np.array([[2, 2]]))
    assert chosen.tolist() == [[2, 2]]  # only one passage is neither gold nor answer-bearing: it repeats

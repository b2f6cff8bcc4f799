"""DPR batches: tokenised once and padded on demand, passages encoded in length buckets, refreshed negatives."""

import numpy as np
import torch

from utils.bi_encoder import BiEncoder
from utils.dpr_data import Tokenized, select_negatives


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

"""Sentence windows: the unit of retrieval with --window_sentences N, N consecutive sentences of a passage, each
encoded with its passage's title and carrying its passage's key. One vector per paragraph blurs the sentence a
SQuAD-style question is about; a passage then ranks by its best window (MaxP), and training pairs each question
with the window of its passage that holds its answer."""

import numpy as np

from utils.files.answers import answer_patterns, holds_answer, normalized
from utils.files.corpus import passage_key, text_key
from utils.search.bm25 import terms
from utils.sentences import window_texts


def sentence_windows(passages: list[dict], sentences: int) -> tuple[list[dict], np.ndarray]:
    """(windows, owner): every passage cut into windows of `sentences` consecutive sentences (stride 1; a passage
    with fewer sentences is one window), each with its passage's title, passage_id and key (passage_key) and its
    place k in the passage ("window"), and owner[j] = the index of window j's passage. With sentences=0 the windows
    are the passages themselves."""
    if not sentences:
        return passages, np.arange(len(passages))
    windows, owner = [], []
    for i, p in enumerate(passages):
        key = passage_key(p)
        for s, text in enumerate(window_texts(p["text"], sentences)):  # the split, utils.sentences
            windows.append({"title": p["title"], "text": text, "passage_id": p.get("passage_id"), "passage_key": key,
                            "window": s})
            owner.append(i)
    return windows, np.asarray(owner, dtype=np.int64)


def training_windows(questions: list[dict], sentences: int) -> tuple[list[dict], int]:
    """(questions, kept whole): the training questions at the level the retriever ranks with --window_sentences,
    so training and ranking embed the same kind of text. A question's positive becomes the first window of its
    positive passage that holds one of its answer strings (the whole passage when none does: an answer across a
    sentence break, or no answers given; counted); its hard negatives become the windows of its hard-negative
    passages that hold no answer, those sharing most of the question's BM25 terms first (passage order breaks ties),
    and its other negatives the windows of its negative passages. The other windows of its positive passage are no
    negatives: a passage ranks by its best window, so they stand for the gold passage (and every window carries its
    passage's key, so masking treats them as the positive's duplicates)."""
    split, words, norm = {}, {}, {}  # passages recur across questions (shared negatives): split, count, normalise once

    def windows(ctx):
        key = text_key(ctx)
        if key not in split:
            split[key] = sentence_windows([ctx], sentences)[0]
        return split[key]

    def normalized_text(window):
        if window["text"] not in norm:
            norm[window["text"]] = normalized(window["text"])
        return norm[window["text"]]

    def shared_terms(question_terms, window):
        if window["text"] not in words:
            words[window["text"]] = terms(window["text"])
        return len(question_terms & words[window["text"]])

    out, whole = [], 0
    for q in questions:
        answers = answer_patterns(q.get("answers"))
        has_answer = lambda w: holds_answer(normalized_text(w), answers)  # noqa: E731
        positive = next((w for w in windows(q["positive_ctxs"][0]) if has_answer(w)), None)
        if positive is None:
            whole += 1
            positive = q["positive_ctxs"][0]
        question_terms = terms(q["question"])
        hard = [w for c in q["hard_negative_ctxs"] for w in windows(c) if not has_answer(w)]
        hard.sort(key=lambda w: -shared_terms(question_terms, w))  # stable: ties keep the passages' order
        other = [w for c in q["negative_ctxs"] for w in windows(c)]
        out.append({**q, "positive_ctxs": [positive], "hard_negative_ctxs": hard, "negative_ctxs": other})
    return out, whole

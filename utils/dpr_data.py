"""DPR training data (facebookresearch/DPR and Haystack 1.x layout) and passage corpora.

A DPR file is a JSON list of {"question", "answers", "positive_ctxs", "negative_ctxs",
"hard_negative_ctxs"}, each ctx {"title", "text", "passage_id"}. A corpus is JSON lines of ctxs.
Validation names the file and the question (its "id", else its index) in a one-line UserError.
"""

import hashlib
import re

import numpy as np

from utils.answers import answer_patterns, holds_answer, normalized
from utils.batching import pad_batch
from utils.bm25 import terms
from utils.errors import UserError
from utils.squad_data import read_json


def _check_ctx(ctx, path, where):
    if not isinstance(ctx, dict) or not isinstance(ctx.get("text"), str) or not ctx["text"].strip():
        raise UserError(f"{path}: {where}: every passage needs a non-empty 'text'")
    return {"title": str(ctx.get("title") or ""), "text": ctx["text"],
            "passage_id": str(ctx["passage_id"]) if ctx.get("passage_id") is not None else None}


def load_dpr(path: str) -> list[dict]:
    rows = read_json(path)
    if isinstance(rows, dict) and "data" in rows:
        rows = rows["data"]
    if not isinstance(rows, list):
        raise UserError(f"{path}: expected a JSON list of DPR questions")
    if not rows:
        raise UserError(f"{path}: the dataset is empty")
    if isinstance(rows[0], dict) and ("paragraphs" in rows[0] or "context" in rows[0]):
        raise UserError(f"{path}: this is SQuAD-format data, not DPR; convert it with "
                        "`python -m utils.make_dpr_data FILE --out dpr.json --passages passages.jsonl`")
    out = []
    for i, row in enumerate(rows):
        where = f"question {row.get('id', f'#{i}') if isinstance(row, dict) else f'#{i}'}"
        if not isinstance(row, dict) or not isinstance(row.get("question"), str) or not row["question"].strip():
            raise UserError(f"{path}: {where}: missing or empty 'question'")
        positives = row.get("positive_ctxs")
        if not isinstance(positives, list) or not positives:
            raise UserError(f"{path}: {where}: needs at least one entry in 'positive_ctxs'")
        lists = {}
        for key in ("positive_ctxs", "hard_negative_ctxs", "negative_ctxs"):
            value = row.get(key) or []
            if not isinstance(value, list):
                raise UserError(f"{path}: {where}: '{key}' should be a list")
            lists[key] = [_check_ctx(c, path, where) for c in value]
        out.append({"id": str(row.get("id", i)), "question": row["question"], "answers": row.get("answers", []),
                    **lists})
    return out


def load_passages(path: str) -> list[dict]:
    rows = read_json(path)
    if not isinstance(rows, list) or not rows:
        raise UserError(f"{path}: expected a non-empty list (JSON lines) of passages")
    passages = [_check_ctx(r, path, f"passage #{i}") for i, r in enumerate(rows)]
    for i, p in enumerate(passages):
        if p["passage_id"] is None:
            raise UserError(f"{path}: passage #{i}: missing 'passage_id'")
    return passages


def passage_key(ctx: dict) -> str:
    """The passage a text belongs to: its passage_id, else its text; a sentence window carries its passage's key.
    What duplicate masking and the negatives' positive filter compare: the other windows of a question's gold
    paragraph are that paragraph, not negatives of it."""
    if "passage_key" in ctx:
        return ctx["passage_key"]
    return ctx["passage_id"] if ctx.get("passage_id") is not None else "text:" + ctx["text"]


def text_key(ctx: dict) -> str:
    """Identity of one text: a passage's key, for a window its passage's key and its place ("key#k")."""
    return passage_key(ctx) + (f"#{ctx['window']}" if "window" in ctx else "")


def key_hash(key: str) -> int:
    """Stable signed 64-bit hash of a passage key, so keys can travel in tensors across processes."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little", signed=True)


def training_passages(questions: list[dict], num_hard_negatives: int, seed: int) -> list[list[dict]]:
    """For each question: its first positive, then `num_hard_negatives` negatives: the top hard negatives,
    topped up from `negative_ctxs`, then (if still short) from other questions' positives. Fixed per question
    (a pure function of the data and seed), so every batch has the same shape on every process and a resumed
    run sees the same passages."""
    rng = np.random.default_rng(seed)
    pool = [q["positive_ctxs"][0] for q in questions]
    out = []
    for q in questions:
        gold = {passage_key(c) for c in q["positive_ctxs"]}
        negatives = [c for c in q["hard_negative_ctxs"] + q["negative_ctxs"] if passage_key(c) not in gold]
        negatives = negatives[:num_hard_negatives]
        tries = 0
        while len(negatives) < num_hard_negatives and tries < 100:
            tries += 1
            c = pool[int(rng.integers(len(pool)))]
            if passage_key(c) not in gold and c not in negatives:
                negatives.append(c)
        if len(negatives) < num_hard_negatives:
            raise UserError(f"question {q['id']}: cannot find {num_hard_negatives} negatives; lower --num_hard_negatives")
        out.append([q["positive_ctxs"][0]] + negatives)
    return out


def unique_passages(ctxs) -> list[dict]:
    """The texts in order of first appearance, one per text_key (a passage, or one window of it)."""
    first = {}
    for c in ctxs:
        first.setdefault(text_key(c), c)
    return list(first.values())


def evaluation_corpus(dev: list[dict], passages: list[dict] | None) -> tuple[list[dict], int]:
    """The passages to rank: the --passages corpus plus any gold passage missing from it (counted), or,
    without a corpus, every distinct context in the dev file."""
    corpus, added = unique_passages(passages or []), 0
    seen = {passage_key(c) for c in corpus}
    for q in dev:
        for c in q["positive_ctxs"] + ([] if passages else q["hard_negative_ctxs"] + q["negative_ctxs"]):
            if passage_key(c) not in seen:
                seen.add(passage_key(c))
                corpus.append(c)
                added += passages is not None
    return corpus, added


# A sentence ends at . ! or ? followed by space and a capital, digit, quote or bracket: good enough for Wikipedia-style
# prose (an abbreviation such as "U.S. Army" may split a sentence in two, which costs a window, not a passage).
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(\[])")


def sentence_windows(passages: list[dict], sentences: int) -> tuple[list[dict], np.ndarray]:
    """(windows, owner): every passage cut into windows of `sentences` consecutive sentences (stride 1; a passage
    with fewer sentences is one window), each with its passage's title, passage_id and key (passage_key) and its
    place k in the passage ("window"), and owner[j] = the index of window j's passage. With sentences=0 the windows
    are the passages themselves."""
    if not sentences:
        return passages, np.arange(len(passages))
    windows, owner = [], []
    for i, p in enumerate(passages):
        parts = _SENTENCE_END.split(p["text"].strip())
        key = passage_key(p)
        for s in range(max(1, len(parts) - sentences + 1)):
            windows.append({"title": p["title"], "text": " ".join(parts[s:s + sentences]),
                            "passage_id": p.get("passage_id"), "passage_key": key, "window": s})
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


class Tokenized:
    """Texts tokenised once (not in every collate call), stored flat as int32 arrays: a batch of any of them is
    padded to its longest (a multiple of 8, right padding) on demand."""

    def __init__(self, encode, texts: list, chunk: int = 8192):
        arrays, lengths = {}, []
        for s in range(0, len(texts), chunk):  # chunks: a corpus of millions never becomes one Python list
            enc = encode(texts[s:s + chunk])
            lengths += [len(x) for x in enc["input_ids"]]
            for key in ("input_ids", "token_type_ids", "attention_mask"):
                if key in enc:
                    arrays.setdefault(key, []).append(np.fromiter((t for x in enc[key] for t in x), dtype=np.int32))
        self.lengths = np.asarray(lengths, dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.lengths)])
        self.arrays = {k: np.concatenate(v) for k, v in arrays.items()}

    def __len__(self):
        return len(self.lengths)

    def batch(self, indices, pad_token_id: int) -> dict:
        return pad_batch([{key: flat[self.offsets[i]:self.offsets[i + 1]].tolist() for key, flat in self.arrays.items()}
                          for i in indices], pad_token_id)


def select_negatives(ranked: np.ndarray, questions: list[dict], passages: list[dict], count: int,
                     current: np.ndarray, normalized_texts: list[str] | None = None) -> np.ndarray:
    """Hard negatives from a ranking: for each question, the `count` best-ranked passages (indices into
    `passages`, ranked[i] best first) that are not one of its positives (same passage key, so no window of its gold
    passage either, nor the same text) and hold none of its answer strings (utils.answers: a passage that does is
    probably a false negative, the filter Tevatron applies). Those ranked above the gold are the model's
    mistakes; when the model ranks the gold first they are the ones just below it. Never short, never a
    duplicate: a question whose ranking runs out (tiny corpus) is topped up from its earlier negatives
    (`current`), then from the other passages in order; only a pool with fewer than `count` non-positive
    passages repeats one. `normalized_texts`: utils.answers.normalized of every passage, if already computed."""
    texts = normalized_texts if normalized_texts is not None else [normalized(p["text"]) for p in passages]
    out = np.empty_like(current)
    for i, q in enumerate(questions):
        gold_keys = {passage_key(c) for c in q["positive_ctxs"]}
        gold_texts = {normalized(c["text"]) for c in q["positive_ctxs"]}
        answers = answer_patterns(q.get("answers"))
        is_gold = lambda j: passage_key(passages[j]) in gold_keys or texts[j] in gold_texts  # noqa: E731
        chosen = []
        for j in ranked[i]:
            if len(chosen) == count:
                break
            j = int(j)
            if j not in chosen and not is_gold(j) and not holds_answer(texts[j], answers):
                chosen.append(j)
        pool = (j for j in range(len(passages)) if not holds_answer(texts[j], answers))
        for j in (j for source in ((int(j) for j in current[i]), pool) for j in source):  # lazily: the pool only
            if len(chosen) == count:                                                       # when still short
                break
            if j not in chosen and not is_gold(j):
                chosen.append(j)
        repeat = list(chosen) or [int(j) for j in current[i]]
        while len(chosen) < count:  # fewer non-positive passages than negatives per question
            chosen.append(repeat[len(chosen) % len(repeat)])
        out[i] = chosen
    return out

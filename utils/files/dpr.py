"""DPR training data (facebookresearch/DPR and Haystack 1.x layout) and passage corpora.

A DPR file is a JSON list of {"question", "answers", "positive_ctxs", "negative_ctxs", "hard_negative_ctxs"}, each
ctx {"title", "text", "passage_id"}. A corpus is JSON lines of ctxs. Validation names the file and the question
(its "id", else its index) in a one-line UserError. A passage is identified by its key (passage_key); a text of
it (the passage itself, or one of its sentence windows) by its text key.
"""

import hashlib
import os

import numpy as np

from utils.errors import UserError
from utils.files.jsonfiles import json_lines, parse_json_line, read_json


def _check_ctx(ctx, path, where):
    if not isinstance(ctx, dict) or not isinstance(ctx.get("text"), str) or not ctx["text"].strip():
        raise UserError(f"{path}: {where}: every passage needs a 'text' that is a non-empty string")
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
                        "`python -m utils.retriever.make_dpr_data FILE --out dpr.json --passages passages.jsonl`")
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


def load_passages(passages) -> list[dict]:
    """The one corpus loader, for every consumer (evaluation, the Retriever API and its index, the QA system, BM25,
    the reader's negatives): JSON lines (or a JSON list) of {"title", "text", "passage_id"} from a file, or such a
    list given in Python. Each passage needs a `text` that is a non-empty string and a `passage_id` that is
    non-empty and unique in the corpus (what rankings, indexes and answers name it by); a violation is a one-line
    UserError naming the file, the line (or the list position) and the id."""
    if isinstance(passages, str):
        source, (rows, lines) = passages, read_json(passages, line_numbers=True)
    else:
        source, rows, lines = "the passages given", passages, None
        if isinstance(rows, dict) or not hasattr(rows, "__iter__"):
            raise UserError(f"{source}: expected a list of {{title, text, passage_id}} passages")
        rows = list(rows)
    if not isinstance(rows, list) or not rows:
        raise UserError(f"{source}: expected a non-empty list (JSON lines) of passages")
    out, seen = [], {}
    for i, row in enumerate(rows):
        where = f"line {lines[i]}" if lines else f"passage #{i}"
        p = check_passage(row, source, where)
        if p["passage_id"] in seen:
            raise UserError(f"{source}: {where}: duplicate passage_id {p['passage_id']!r} (first at {seen[p['passage_id']]})")
        seen[p["passage_id"]] = where
        out.append(p)
    return out


def check_passage(row, source: str, where: str) -> dict:
    """One passage of a corpus as every consumer sees it, or a one-line UserError naming the source, the place and
    the id (the rule of `load_passages`; `stream_passages` applies it line by line)."""
    if not isinstance(row, dict):
        raise UserError(f"{source}: {where}: expected a {{title, text, passage_id}} object, got {type(row).__name__}")
    ident = row.get("passage_id")
    if ident is None or not str(ident).strip():
        raise UserError(f"{source}: {where}: " + ("missing 'passage_id'" if ident is None else
                                                  f"empty 'passage_id' {ident!r}"))
    return _check_ctx(row, source, f"{where} (passage_id {ident!r})")


def byte_ranges(path: str, parts: int) -> list[tuple[int, int]]:
    """`parts` contiguous byte ranges of a file, each starting at a line: a process's share of a JSON-lines corpus,
    found without reading the file (a range may be empty in a tiny file)."""
    size = os.path.getsize(path)
    cuts = [0]
    with open(path, "rb") as f:
        for i in range(1, parts):
            f.seek(max(cuts[-1], size * i // parts))
            if f.tell() > 0:
                f.seek(f.tell() - 1)
                f.readline()  # to the start of the next line
            cuts.append(max(cuts[-1], f.tell()))
    cuts.append(size)
    return list(zip(cuts[:-1], cuts[1:]))


def stream_passages(path: str, start: int, stop: int, first_line: int = 1):
    """(passage, raw line, line number) of the JSON-lines corpus between two byte offsets (`byte_ranges`), its lines
    read by the one JSON-lines reader (utils.files.jsonfiles.json_lines, as `load_passages` reads a whole file), checked
    one by one as `load_passages` checks them (uniqueness of the ids is the caller's: it spans the whole corpus).
    `first_line`: the number of the range's first line, where known, for the errors."""
    if path.endswith(".json") and start == 0:
        with open(path, "rb") as f:
            head = f.read(1).strip() or f.read(64).strip()[:1]
        if head == b"[":
            raise UserError(f"{path}: a JSON list: give the corpus as JSON lines (one passage per line) to index it "
                            "in shards")
    for number, _, raw in json_lines(path, start, stop, first_line):
        yield check_passage(parse_json_line(path, number, raw), path, f"line {number}"), raw, number


def count_lines(path: str, start: int, stop: int) -> int:
    """Newlines between two byte offsets: how many lines precede a range (for its line numbers)."""
    count, position = 0, start
    with open(path, "rb") as f:
        f.seek(start)
        while position < stop:
            block = f.read(min(1 << 24, stop - position))
            if not block:
                break
            count += block.count(b"\n")
            position += len(block)
    return count


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


def evaluation_data(args) -> tuple[list[dict], list[dict], list[list[dict]]]:
    """(dev questions, the corpus to rank, each dev question's training-style passages for the in-batch rank)."""
    import logging

    dev = load_dpr(args.validation_file)
    if args.max_eval_samples:
        dev = dev[: args.max_eval_samples]
    if getattr(args, "index", None):  # the passages of a built index (checked when it was built), in its order
        from utils.search.index import Index

        passages = list(Index.load(args.index).passages)
    else:
        passages = load_passages(args.passages) if args.passages else None
    corpus, added = evaluation_corpus(dev, passages)
    if added:
        logging.getLogger("qa-amp").warning("%d gold passages of the dev file are not in %s; added them to the ranked "
                                            "corpus", added, args.index or args.passages)
    return dev, corpus, training_passages(dev, args.num_hard_negatives, args.seed)

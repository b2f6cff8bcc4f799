"""Passage corpora: JSON lines of {"title", "text", "passage_id"}, loaded whole (`load_passages`, the one corpus
loader) or streamed by byte range (`stream_passages`, a process's share), each passage checked by one rule; and the
keys that name a passage (or a sentence window of it) wherever passages are compared, masked or sent across processes.
"""

import hashlib
import os

from utils.errors import UserError
from utils.files.jsonfiles import json_lines, parse_json_line, read_json


# Where a passage came from, kept with it where given (ingest_documents.py writes them): its document (the name it
# was ingested under), its place among the document's passages (0-based) and, for a PDF, the page it starts on
# (1-based). An answer's details name them; nothing ranks or reads by them.
SOURCE_FIELDS = {"document": str, "passage": int, "page": int}


def check_ctx(ctx, path, where):
    if not isinstance(ctx, dict) or not isinstance(ctx.get("text"), str) or not ctx["text"].strip():
        raise UserError(f"{path}: {where}: every passage needs a 'text' that is a non-empty string")
    checked = {"title": str(ctx.get("title") or ""), "text": ctx["text"],
               "passage_id": str(ctx["passage_id"]) if ctx.get("passage_id") is not None else None}
    for name, kind in SOURCE_FIELDS.items():
        value = ctx.get(name)
        if value is None:
            continue
        if not isinstance(value, kind) or isinstance(value, bool):
            raise UserError(f"{path}: {where}: '{name}' must be a{'n integer' if kind is int else ' string'}, "
                            f"got {value!r}")
        checked[name] = value
    return checked


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
            raise UserError(f"{source}: {where}: duplicate passage_id {p['passage_id']!r} "
                            f"(first at {seen[p['passage_id']]})")
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
    return check_ctx(row, source, f"{where} (passage_id {ident!r})")


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


def unique_passages(ctxs) -> list[dict]:
    """The texts in order of first appearance, one per text_key (a passage, or one window of it)."""
    first = {}
    for c in ctxs:
        first.setdefault(text_key(c), c)
    return list(first.values())

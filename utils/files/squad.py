"""SQuAD-format files read into one flat, validated layout: the reader's training and evaluation data, the questions
the reader and the QA system answer, and what the DPR converter turns into DPR data.

Accepted inputs (auto-detected):
  * SQuAD v1.1 / v2.0 JSON: {"data": [{"title", "paragraphs": [{"context", "qas": [...]}]}]}
  * the flattened Hugging Face `squad` layout, as a JSON list, {"data": [rows]} or JSON lines:
    {"id", "title", "context", "question", "answers": {"text": [...], "answer_start": [...]}}
  * questions to answer only, labelled by answer strings without a paragraph (the open-domain layout of DPR's NQ and
    TriviaQA files): JSON lines (or a JSON list) of {"id", "question", "answers": ["...", ...]} (optionally
    "title"), `[]` for an unanswerable question; and DPR's retriever validation files (nq-test.csv, trivia-test.csv:
    tab-separated whatever the name, any *.csv or *.tsv): `question<TAB>["answer", ...]` per line, the answers a
    JSON or Python list literal, read as DPR's CsvQASrc reads them (csv.reader, tab-delimited), each row's id its
    line number. Such a question's answers carry no offsets (`answer_start` None): it is measured on the answer
    strings (utils.system.measure), and a reader cannot train on it.
Every example comes out as the flattened layout; an unanswerable (SQuAD v2) question has no answers. Training and
evaluation data go through `load_squad`; questions to answer (train_reader.py --predict_file, qa_system.py
--questions and --validation_file) through `load_questions`, the same parser with answers and contexts optional.

Validation is strict and names the file and the example id (or, for a row of answer strings, its line): malformed
JSON, a missing key (a question's id included: predictions are keyed by it), an empty dataset, duplicate ids, an
answer whose text is nowhere in its context, answers that are not a list of non-empty strings, is a UserError.
An answer whose `answer_start` is off but whose text occurs in the context is moved to the
nearest occurrence and counted (real data has these; see ../shared/data/README.md).
"""

import ast
import csv
import io
import json
import os
import warnings

from utils.errors import UserError
from utils.files.jsonfiles import read_json


def load_squad(path: str, labelled: bool = True) -> tuple[list[dict], int]:
    """Return (examples, number of repaired answer offsets) from a SQuAD-format file of training or evaluation data:
    every question has answers (SQuAD v2: none for an unanswerable one) and a context. With labelled=False answers
    are optional (a question without them gets none)."""
    flat, repaired = _load(path, labelled=labelled, need_context=True)
    for ex in flat:
        if ex["answers"] is None:
            ex["answers"] = {"text": [], "answer_start": []}
    return flat, repaired


def load_questions(path: str, need_context: bool = True) -> list[dict]:
    """Questions to answer, in any layout `load_squad` reads, as JSON lines of {"id", "question"} (plus "context" and
    "answers" where known) and labelled by answer strings without a paragraph (JSON lines, DPR's CSV/TSV). One rule
    for every layout: each question needs an id; the file is labelled when every question carries answers (SQuAD v2
    unanswerable ones: `answers: []` or `is_impossible`), unlabelled when none does (then "answers" is None), and a
    file where only some do is refused; "context" (the question's own paragraph) is required with `need_context` (a
    reader answers from it), else None where absent."""
    flat, _ = _load(path, labelled=None, need_context=need_context)
    labelled = [ex["answers"] is not None for ex in flat]
    if any(labelled) and not all(labelled):
        first = flat[labelled.index(not labelled[0])]["id"]
        raise UserError(f"{path}: example {first}: some questions carry answers and some do not: label every "
                        "question or none")
    return flat


def squad_document(questions: list[dict]) -> dict:
    """Labelled questions in the flat layout (`load_squad`) as a SQuAD v2.0 document: an article per run of one
    title, a paragraph per run of one context, in the questions' order; an unanswerable question with
    `is_impossible` true. Read back by `load_squad`, it gives the same questions."""
    data = []
    for q in questions:
        if not data or data[-1]["title"] != q["title"]:
            data.append({"title": q["title"], "paragraphs": []})
        paragraphs = data[-1]["paragraphs"]
        if not paragraphs or paragraphs[-1]["context"] != q["context"]:
            paragraphs.append({"context": q["context"], "qas": []})
        answers = [{"text": t, "answer_start": s} for t, s in zip(q["answers"]["text"], q["answers"]["answer_start"])]
        paragraphs[-1]["qas"].append({"id": q["id"], "question": q["question"], "answers": answers,
                                      "is_impossible": not answers})
    return {"version": "v2.0", "data": data}


def _load(path: str, labelled: bool | None, need_context: bool) -> tuple[list[dict], int]:
    """`labelled`: True: answers required; False: ignored where absent; None: kept as None where absent."""
    if path.lower().endswith((".csv", ".tsv")):
        if need_context:
            raise UserError(f"{path}: questions with answer strings and no paragraph (DPR's question<TAB>answers "
                            "layout): here each question needs its paragraph (SQuAD JSON, or JSON lines with "
                            "'context')")
        flat = _answer_strings_table(path)
    else:
        flat = _flat_rows(path, labelled, need_context)
    if not flat:
        raise UserError(f"{path}: the dataset has no questions")

    seen, repaired = set(), 0
    for ex in flat:
        if ex["id"] in seen:
            raise UserError(f"{path}: example {ex['id']}: duplicate id")
        seen.add(ex["id"])
        repaired += _check_answers(ex, path)
    return flat, repaired


def _flat_rows(path: str, labelled: bool | None, need_context: bool) -> list[dict]:
    """A JSON or JSON-lines file's questions in the flat layout, each row read by its layout."""
    raw, lines = read_json(path, line_numbers=True)
    rows = raw["data"] if isinstance(raw, dict) and "data" in raw else raw
    if not isinstance(rows, list):
        raise UserError(f"{path}: expected a list of examples or {{'data': [...]}} at the top level")
    if not rows:
        raise UserError(f"{path}: the dataset is empty")
    nested = isinstance(rows[0], dict) and "question" not in rows[0] and "context" not in rows[0]
    return (_flatten_nested(rows, path, labelled) if nested
            else [_check_flat_row(r, f"line {lines[i]}" if lines else f"#{i}", path, labelled, need_context)
                  for i, r in enumerate(rows)])


def _require(obj, key, kind, path, where):
    if not isinstance(obj, dict) or key not in obj:
        raise UserError(f"{path}: {where}: missing key '{key}'")
    value = obj[key]
    if not isinstance(value, kind):
        raise UserError(f"{path}: {where}: '{key}' should be {kind.__name__ if isinstance(kind, type) else kind}")
    return value


def _optional(obj, key, default, kind, path, where):
    return _require(obj, key, kind, path, where) if isinstance(obj, dict) and key in obj else default


def _flatten_nested(articles, path, labelled):
    flat = []
    for a, article in enumerate(articles):
        title = article.get("title", f"article-{a}") if isinstance(article, dict) else None
        for p, para in enumerate(_require(article, "paragraphs", list, path, f"article {a}")):
            context = _require(para, "context", str, path, f"article '{title}' paragraph {p}")
            for q, qa in enumerate(_require(para, "qas", list, path, f"article '{title}' paragraph {p}")):
                qid = str(_require(qa, "id", (str, int), path, f"article '{title}' paragraph {p} question {q}"))
                where = f"example {qid}"
                question = _require(qa, "question", str, path, where)
                impossible = _optional(qa, "is_impossible", None, bool, path, where)
                carries = "answers" in qa or impossible is not None
                answers = (_require(qa, "answers", list, path, where) if labelled and not impossible
                           else _optional(qa, "answers", [], list, path, where))
                if carries and impossible is not None and impossible == bool(answers):
                    raise UserError(f"{path}: {where}: " + (
                        f"'is_impossible' is true but it lists {len(answers)} answer(s); drop one or the other"
                        if impossible else "'is_impossible' is false but it lists no answers"))
                texts, starts = [], []
                for ans in answers:
                    texts.append(_require(ans, "text", str, path, where))
                    starts.append(_require(ans, "answer_start", int, path, where))
                flat.append({"id": qid, "title": str(title), "context": context, "question": question,
                             "answers": {"text": texts, "answer_start": starts}
                             if carries or labelled is not None else None})
    return flat


def _check_flat_row(row, place, path, labelled, need_context):
    """`place`: where the row is ("line N" of JSON lines, "#i" of a list), named until its id is known."""
    where = f"example {row['id']}" if isinstance(row, dict) and "id" in row else \
        (place if place.startswith("line") else f"example {place}")
    qid = _require(row, "id", (str, int), path, where)
    if isinstance(row.get("answers"), list):  # answer strings without a paragraph
        if need_context:
            _require(row, "context", str, path, where)  # where a paragraph is needed, its absence said as before
        return _answer_strings_row(row, place if place.startswith("line") else where, path)
    out = {"id": str(qid), "title": str(row.get("title", "")),
           "context": _require(row, "context", str, path, where) if need_context
           else _optional(row, "context", None, str, path, where),
           "question": _require(row, "question", str, path, where), "answers": None}
    if labelled or "answers" in row:
        if not isinstance(row.get("answers"), dict):
            raise UserError(f"{path}: {where}: 'answers' should be {{text, answer_start}} with a 'context', or a "
                            "list of answer strings without one")
        answers = row["answers"]
        texts = _require(answers, "text", list, path, where)
        starts = _require(answers, "answer_start", list, path, where)
        if len(texts) != len(starts) or not all(isinstance(t, str) for t in texts) \
                or not all(isinstance(s, int) for s in starts):
            raise UserError(f"{path}: {where}: 'answers' needs equally long lists of text strings and int answer_start")
        out["answers"] = {"text": list(texts), "answer_start": list(starts)}
    elif labelled is not None:
        out["answers"] = {"text": [], "answer_start": []}
    return out


def _answer_strings_row(row, where, path) -> dict:
    """A question labelled by answer strings without a paragraph (the open-domain layout): {"id", "question",
    "answers": ["...", ...]} and optionally "title" (its article, which the tuning's folds keep whole)."""
    if row.get("context") is not None:
        raise UserError(f"{path}: {where}: 'answers' as a list of strings is for a question without a paragraph: "
                        "with a 'context', give them as {text, answer_start}")
    question = _require(row, "question", str, path, where)
    if not question.strip():
        raise UserError(f"{path}: {where}: empty question")
    return {"id": str(row["id"]), "title": str(_optional(row, "title", "", str, path, where)), "context": None,
            "question": question, "answers": {"text": _answer_strings(row["answers"], path, where),
                                              "answer_start": None}}


def _answer_strings(answers, path, where) -> list[str]:
    """A question's answer strings, checked: a list of non-empty strings, [] for an unanswerable question."""
    if not isinstance(answers, list):
        raise UserError(f"{path}: {where}: the answers should be a list of strings ([] for an unanswerable "
                        f"question), got {type(answers).__name__}")
    for i, answer in enumerate(answers):
        if not isinstance(answer, str):
            raise UserError(f"{path}: {where}: answer #{i} should be a string, got {type(answer).__name__}")
        if not answer.strip():
            raise UserError(f"{path}: {where}: answer #{i} is empty (an unanswerable question's answers are [])")
    return list(answers)


_NO_LITERAL = object()


def _list_literal(text: str):
    """A JSON or Python literal (DPR's files hold both: nq-test.csv Python's ['...'], others JSON), or _NO_LITERAL.
    DPR evaluates the field with eval; ast.literal_eval reads the same literals and runs nothing."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        pass
    try:
        with warnings.catch_warnings():  # an invalid escape such as "\d" is a SyntaxWarning, not our user's problem
            warnings.simplefilter("ignore")
            return ast.literal_eval(text.strip())
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return _NO_LITERAL


def _answer_strings_table(path: str) -> list[dict]:
    """DPR's retriever validation file: question<TAB>answers per line (csv.reader, tab-delimited, as DPR's CsvQASrc
    reads it, so a field in double quotes is unquoted), as rows of the open-domain layout, each id its line number
    (of the row's first line); blank lines skipped. A bad row is a UserError naming the line."""
    reader = csv.reader(io.StringIO(_read_text(path), newline=""), delimiter="\t")
    rows, first = [], 1  # the line the next row starts at
    while True:
        try:
            fields = next(reader)
        except StopIteration:
            break
        except csv.Error as err:
            raise UserError(f"{path}: line {first}: not a line of question<TAB>answers ({err})") from None
        number, first = first, reader.line_num + 1
        where = f"line {number}"
        if not fields or (len(fields) == 1 and not fields[0].strip()):
            continue
        if len(fields) != 2:
            raise UserError(f"{path}: {where}: expected 2 tab-separated fields (question, answers), got "
                            f"{len(fields)} (DPR's layout: question<TAB>[\"answer\", ...])")
        question, answers = fields
        if not question.strip():
            raise UserError(f"{path}: {where}: empty question")
        parsed = _list_literal(answers)
        if parsed is _NO_LITERAL:
            raise UserError(f"{path}: {where}: the answers {answers[:60]!r} are not a list literal (DPR's layout: "
                            "question<TAB>[\"answer\", ...])")
        rows.append({"id": str(number), "title": "", "context": None, "question": question,
                     "answers": {"text": _answer_strings(parsed, path, where), "answer_start": None}})
    return rows


def _read_text(path: str) -> str:
    """A UTF-8 text file (a byte-order mark dropped); missing, unreadable or not UTF-8 is a one-line UserError."""
    if os.path.isdir(path):
        raise UserError(f"{path}: is a directory, not a file")
    if not os.path.isfile(path):
        raise UserError(f"{path}: no such file")
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as err:
        raise UserError(f"{path}: cannot read it ({err.strerror or err})") from None
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = raw[:err.start].count(b"\n") + 1
        raise UserError(f"{path}: line {line}: not UTF-8 text ({err.reason} at byte {err.start})") from None


def _check_answers(ex, path) -> int:
    """Validate one example in place; return how many answer offsets were repaired."""
    where = f"{path}: example {ex['id']}"
    if not ex["question"].strip():
        raise UserError(f"{where}: empty question")
    if ex["context"] is not None and not ex["context"].strip():
        raise UserError(f"{where}: empty context")
    if ex["answers"] is None or ex["answers"]["answer_start"] is None:  # unlabelled, or answer strings (checked)
        return 0
    if ex["context"] is None:
        raise UserError(f"{where}: answers with offsets (answer_start) but no context: give the question its "
                        "paragraph, or its answers as a list of strings")
    context, repaired = ex["context"], 0
    starts = ex["answers"]["answer_start"]
    for k, text in enumerate(ex["answers"]["text"]):
        if not text.strip():
            raise UserError(f"{where}: empty answer text")
        if context[starts[k]:starts[k] + len(text)] == text:
            continue
        found = [i for i in _occurrences(context, text)]
        if not found:
            raise UserError(f"{where}: answer {text!r} does not occur in its context")
        starts[k] = min(found, key=lambda i: abs(i - starts[k]))
        repaired += 1
    return repaired


def _occurrences(haystack, needle):
    i = haystack.find(needle)
    while i != -1:
        yield i
        i = haystack.find(needle, i + 1)


def is_impossible(ex) -> bool:
    return len(ex["answers"]["text"]) == 0

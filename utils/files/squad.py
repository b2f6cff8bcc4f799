"""SQuAD-format files read into one flat, validated layout: the reader's training and evaluation data, the questions
the reader and the QA system answer, and what the DPR converter turns into DPR data.

Accepted inputs (auto-detected):
  * SQuAD v1.1 / v2.0 JSON: {"data": [{"title", "paragraphs": [{"context", "qas": [...]}]}]}
  * the flattened Hugging Face `squad` layout, as a JSON list, {"data": [rows]} or JSON lines:
    {"id", "title", "context", "question", "answers": {"text": [...], "answer_start": [...]}}
Every example comes out as the flattened layout; an unanswerable (SQuAD v2) question has no answers. Training and
evaluation data go through `load_squad`; questions to answer (train_reader.py --predict_file, qa_system.py
--questions and --validation_file) through `load_questions`, the same parser with answers and contexts optional.

Validation is strict and names the file and the example id: malformed JSON, a missing key (a question's id
included: predictions are keyed by it), an empty dataset, duplicate ids, or an answer whose text is nowhere in its
context is a UserError.
An answer whose `answer_start` is off but whose text occurs in the context is moved to the
nearest occurrence and counted (real data has these; see ../shared/data/README.md).
"""

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
    """Questions to answer, in any layout `load_squad` reads and as JSON lines of {"id", "question"} (plus
    "context" and "answers" where known). One rule for every layout: each question needs an id; the file is
    labelled when every question carries answers (SQuAD v2 unanswerable ones: `answers: []` or `is_impossible`),
    unlabelled when none does (then "answers" is None), and a file where only some do is refused; "context" (the
    question's own paragraph) is required with `need_context` (a reader answers from it), else None where absent."""
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
    raw, lines = read_json(path, line_numbers=True)
    rows = raw["data"] if isinstance(raw, dict) and "data" in raw else raw
    if not isinstance(rows, list):
        raise UserError(f"{path}: expected a list of examples or {{'data': [...]}} at the top level")
    if not rows:
        raise UserError(f"{path}: the dataset is empty")
    nested = isinstance(rows[0], dict) and "question" not in rows[0] and "context" not in rows[0]
    flat = (_flatten_nested(rows, path, labelled) if nested
            else [_check_flat_row(r, f"line {lines[i]}" if lines else f"#{i}", path, labelled, need_context)
                  for i, r in enumerate(rows)])
    if not flat:
        raise UserError(f"{path}: the dataset has no questions")

    seen, repaired = set(), 0
    for ex in flat:
        if ex["id"] in seen:
            raise UserError(f"{path}: example {ex['id']}: duplicate id")
        seen.add(ex["id"])
        repaired += _check_answers(ex, path)
    return flat, repaired


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
    out = {"id": str(qid), "title": str(row.get("title", "")),
           "context": _require(row, "context", str, path, where) if need_context
           else _optional(row, "context", None, str, path, where),
           "question": _require(row, "question", str, path, where), "answers": None}
    if labelled or "answers" in row:
        answers = _require(row, "answers", dict, path, where)
        texts = _require(answers, "text", list, path, where)
        starts = _require(answers, "answer_start", list, path, where)
        if len(texts) != len(starts) or not all(isinstance(t, str) for t in texts) \
                or not all(isinstance(s, int) for s in starts):
            raise UserError(f"{path}: {where}: 'answers' needs equally long lists of text strings and int answer_start")
        out["answers"] = {"text": list(texts), "answer_start": list(starts)}
    elif labelled is not None:
        out["answers"] = {"text": [], "answer_start": []}
    return out


def _check_answers(ex, path) -> int:
    """Validate one example in place; return how many answer offsets were repaired."""
    where = f"{path}: example {ex['id']}"
    if not ex["question"].strip():
        raise UserError(f"{where}: empty question")
    if ex["context"] is not None and not ex["context"].strip():
        raise UserError(f"{where}: empty context")
    if ex["answers"] is None:
        return 0
    if ex["context"] is None:
        raise UserError(f"{where}: answers without a context: give each labelled question its paragraph")
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

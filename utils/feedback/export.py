"""The feedback store's labels (utils.feedback.store) out as training data: a reader's SQuAD v2.0 file, labelled
questions and a retriever's DPR file (export_feedback.py writes them). Pure functions over the labels as the store
yields them (`for label in store`: every row, in id order), so that any iterable of such dicts can be exported and
tested without a database.

What a row becomes, by its verdict (`kind_of`):
  span       an answerable question: the span the user selected, in its passage as the reader read it.
  right      with an answer: an answerable question, the answer given at its span (a span without an answer given
             too). On an abstention (nothing given, no span): an unanswerable question: "no passage shown answers
             it" was the right answer.
  no_answer  an unanswerable question: no passage shown answers it.
  wrong      not a label: it says what the answer is not, not where it is (the page's correction is a "span"
             label of its own). Counted only.
A row that cannot be a label as stored is counted as malformed (its id listed) and left out: a verdict none of
these, an empty question, a span whose offsets are not a span of its passage's text or do not give its answer, a
"right" that gave an answer without its span, an unanswerable label without a passage shown, a passage shown
without text. The server writes none of them; a row written otherwise must not stop the export of the rest.

A question labelled more than once (`latest_labels`): the label written last (the highest id) wins, and each one it
replaces is counted as superseded: a user who labels a question again corrects the earlier label, whichever the
verdicts. Two questions are the same when they are equal after Unicode NFC, whitespace collapsed and case folded
(`question_key`): not after the answers' SQuAD normalisation, which drops punctuation and articles, words that can
change what a question asks. Only labels compete: a "wrong" (or a malformed row) written after a label leaves that
label as it is, since it is no label of where the answer is.

The three layouts, each question under the id "feedback-<its label's id>":
  SQuAD v2.0 (`squad_data`): {"version": "v2.0", "data": [{"title", "paragraphs": [{"context", "qas": [{"id",
    "question", "answers": [{"text", "answer_start"}], "is_impossible"}]}]}]}, written by the project's own
    squad_document: an article per document (a passage without one: its title), a paragraph per distinct passage
    text (the passage as read), the articles and paragraphs in the order of their first question, the questions in
    label order. A label is one question, whatever its verdict, so that a label weighs as one in training: an
    answerable label in its passage, an unanswerable one is_impossible in the passage the answer it was given came
    from, else (an abstention) in the first passage shown, the one retrieval ranked first (`unanswered_passage`).
    (An example in every passage shown made each "no passage answers it" count as many questions as passages shown:
    a reader fine-tuned on such an export learned to abstain; RESULTS, issue 60.)
  Labelled questions (`question_rows`): JSON lines {"id", "question", "answers": [the answer] ([] unanswerable),
    "title"}: the questions qa_system.py --questions and --validation_file read by their answer strings; "title" is
    the document of an answerable question's passage, so that folds keep a document's questions together, and ""
    for an unanswerable one, which names no document (a fold unit of its own).
  DPR (`dpr_rows`): [{"dataset", "id", "question", "answers", "positive_ctxs", "negative_ctxs",
    "hard_negative_ctxs"}], each ctx {"title", "text", "passage_id"}: the labelled passage the positive, the other
    passages shown that hold no answer (the one answer matcher, utils.files.answers) the hard negatives, no random
    negatives (train_dpr.py tops a question's negatives up). A passage shown that holds the answer is left out and
    counted: another place the answer is, a false negative. An unanswerable label has no positive: skipped, counted.
"""

import unicodedata
from collections import Counter

from utils.feedback.store import VERDICTS
from utils.files.answers import answer_patterns, holds_answer, normalized
from utils.files.corpus import passage_key
from utils.files.squad import squad_document

RULE = ("a question's latest label (highest id) wins; questions are the same after Unicode NFC, whitespace "
        "collapsed and case folded; 'wrong' is no label: it counts and replaces nothing")
SPAN_FIELDS = ("passage_id", "text", "answer_start", "answer_end", "answer")


def question_key(question: str) -> str:
    """What two labels' questions are compared by: Unicode NFC, whitespace collapsed, case folded."""
    return " ".join(unicodedata.normalize("NFC", question).split()).casefold()


def kind_of(label: dict) -> tuple[str, str | None]:
    """(kind, why malformed) of a stored row: kind "answerable", "unanswerable", "wrong" (not a label) or
    "malformed" (then why)."""
    verdict = label.get("verdict")
    if verdict not in VERDICTS:
        return "malformed", f"verdict {verdict!r} is none of {', '.join(VERDICTS)}"
    if verdict == "wrong":
        return "wrong", None
    if not isinstance(label.get("question"), str) or not label["question"].strip():
        return "malformed", "no question"
    shown = label.get("shown")
    if not isinstance(shown, list) or not all(isinstance(p, dict) and isinstance(p.get("text"), str)
                                              and p["text"].strip() for p in shown):
        return "malformed", "a passage shown without text"
    spanned = any(label.get(name) is not None for name in SPAN_FIELDS)
    if verdict == "span" or (verdict == "right" and (spanned or label.get("given"))):
        return ("answerable", None) if (why := span_problem(label)) is None else ("malformed", why)
    if spanned:  # no_answer with a span
        return "malformed", f"verdict {verdict} with a span"
    return ("unanswerable", None) if shown else ("malformed", "no passage shown")


def span_problem(label: dict) -> str | None:
    """Why a label's span is no span of its passage's text giving its answer (None: it is one)."""
    text, start, end, answer = (label.get(name) for name in ("text", "answer_start", "answer_end", "answer"))
    if not isinstance(text, str) or not text.strip():
        return "no passage text for its span"
    if not (isinstance(start, int) and isinstance(end, int) and 0 <= start < end <= len(text)):
        return f"[{start}, {end}) is not a span of its passage's {len(text)} characters"
    if not isinstance(answer, str) or not answer.strip() or text[start:end] != answer:
        return f"its answer {answer!r} is not the passage's text at [{start}, {end})"
    return None


def latest_labels(rows) -> tuple[list[dict], dict, dict]:
    """(each question's latest label in id order, the counts, {id: why} of the malformed rows): `rows` consumed as a
    stream (only the labels kept are held). Counts: rows, wrong_not_labels, malformed, labels (the rows that are
    labels), superseded (labels a later one of their question replaced), answerable and unanswerable (the labels
    kept: one per question), last_label_id (the highest id read: the export holds the rows up to it)."""
    counts, malformed, latest, last = Counter(), {}, {}, None
    for row in rows:
        counts["rows"] += 1
        last = row["id"] if last is None or row["id"] > last else last
        kind, why = kind_of(row)
        if kind == "wrong":
            counts["wrong_not_labels"] += 1
            continue
        if kind == "malformed":
            malformed[row["id"]] = why
            continue
        counts["labels"] += 1
        key = question_key(row["question"])
        if key in latest:
            counts["superseded"] += 1
        if key not in latest or row["id"] > latest[key]["id"]:
            latest[key] = row
    kept = sorted(latest.values(), key=lambda label: label["id"])
    kinds = Counter(kind_of(label)[0] for label in kept)
    names = ("rows", "wrong_not_labels", "labels", "superseded")
    return kept, {**{name: counts[name] for name in names}, "malformed": len(malformed),
                  "answerable": kinds["answerable"], "unanswerable": kinds["unanswerable"],
                  "last_label_id": last}, malformed


def answerable(label: dict) -> bool:
    return kind_of(label)[0] == "answerable"


def document_of(passage: dict) -> str:
    """The article a passage belongs to: its document, else (a corpus without documents) its title."""
    return passage.get("document") or passage.get("title") or ""


def distinct_shown(label: dict) -> list[dict]:
    """The passages a label's answer showed, each once (by passage_id, else text), in the order shown."""
    seen, out = set(), []
    for p in label["shown"]:
        if passage_key(p) not in seen:
            seen.add(passage_key(p))
            out.append(p)
    return out


def unanswered_passage(label: dict) -> dict:
    """The passage an unanswerable label is trained in: the one the answer given came from (where the reader found a
    plausible span: the hardest negative), else the first shown."""
    given = label.get("given_passage_id")
    return next((p for p in label["shown"] if given is not None and p.get("passage_id") == given), label["shown"][0])


def squad_examples(labels: list[dict]) -> list[dict]:
    """The labels as SQuAD examples in the flat layout (utils.files.squad), grouped: by article (document) in the
    order of its first example, within it by paragraph (passage text) likewise, within it in label order."""
    examples = []
    for label in labels:
        if answerable(label):
            examples.append({"id": f"feedback-{label['id']}", "title": document_of(label), "context": label["text"],
                             "question": label["question"],
                             "answers": {"text": [label["answer"]], "answer_start": [label["answer_start"]]}})
        else:
            p = unanswered_passage(label)
            examples.append({"id": f"feedback-{label['id']}", "title": document_of(p), "context": p["text"],
                             "question": label["question"], "answers": {"text": [], "answer_start": []}})
    articles, paragraphs = {}, {}
    for ex in examples:
        articles.setdefault(ex["title"], len(articles))
        paragraphs.setdefault((ex["title"], ex["context"]), len(paragraphs))
    return sorted(examples, key=lambda ex: (articles[ex["title"]], paragraphs[ex["title"], ex["context"]]))


def squad_data(labels: list[dict]) -> tuple[dict, dict]:
    """(the SQuAD v2.0 document of the labels, its counts: articles, paragraphs, questions, impossible)."""
    document = squad_document(squad_examples(labels))
    paragraphs = [p for a in document["data"] for p in a["paragraphs"]]
    qas = [q for p in paragraphs for q in p["qas"]]
    return document, {"articles": len(document["data"]), "paragraphs": len(paragraphs), "questions": len(qas),
                      "impossible": sum(q["is_impossible"] for q in qas)}


def question_rows(labels: list[dict]) -> list[dict]:
    """The labels as labelled questions: {"id", "question", "answers": [the answer] or [], "title"}."""
    return [{"id": f"feedback-{label['id']}", "question": label["question"],
             "answers": [label["answer"]] if answerable(label) else [],
             "title": document_of(label) if answerable(label) else ""} for label in labels]


def ctx(passage: dict) -> dict:
    return {"title": passage.get("title") or "", "text": passage["text"], "passage_id": passage.get("passage_id")}


def dpr_rows(labels: list[dict]) -> tuple[list[dict], dict]:
    """(the answerable labels as DPR questions, the counts: questions, skipped_unanswerable, hard_negatives,
    shown_holding_the_answer)."""
    rows, counts = [], Counter()
    for label in labels:
        if not answerable(label):
            counts["skipped_unanswerable"] += 1
            continue
        patterns, positive = answer_patterns([label["answer"]]), passage_key(label)
        hard = []
        for p in distinct_shown(label):
            if passage_key(p) == positive:
                continue
            if holds_answer(normalized(p["text"]), patterns):
                counts["shown_holding_the_answer"] += 1
            else:
                hard.append(ctx(p))
        counts["hard_negatives"] += len(hard)
        rows.append({"dataset": "feedback", "id": f"feedback-{label['id']}", "question": label["question"],
                     "answers": [label["answer"]], "positive_ctxs": [ctx(label)], "negative_ctxs": [],
                     "hard_negative_ctxs": hard})
    names = ("skipped_unanswerable", "hard_negatives", "shown_holding_the_answer")
    return rows, {"questions": len(rows), **{name: counts[name] for name in names}}


def export(rows) -> tuple[dict, list[dict], list[dict], dict]:
    """(SQuAD v2.0 document, labelled questions, DPR questions, summary) of the store's rows (an iterable, read
    once). The summary: the rule, the counts of `latest_labels`, each file's counts and the malformed rows' ids
    with why."""
    labels, counts, malformed = latest_labels(rows)
    squad, squad_counts = squad_data(labels)
    questions = question_rows(labels)
    dpr, dpr_counts = dpr_rows(labels)
    summary = {"rule": RULE, "counts": counts, "squad": squad_counts,
               "questions": {"questions": len(questions), "unanswerable": sum(not q["answers"] for q in questions)},
               "dpr": dpr_counts, "malformed": {str(i): why for i, why in malformed.items()}}
    return squad, questions, dpr, summary

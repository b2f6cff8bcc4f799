"""A user's feedback on one answer, as POST /feedback takes it (`FeedbackRequest`: strict JSON, no other field), and
the label it becomes (`label_of`): checked against the index serving, the passages' texts taken from it, never from
the request, so that a label holds the passage exactly as the reader read it. Bad feedback is a `BadRequest` naming
the field; an answer from a version of the index, or a reader, no longer serving is a 409 (ask again)."""

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from utils.errors import BadRequest


class ShownPassage(BaseModel):
    """A passage the answer showed, as /ask gave it."""
    model_config = ConfigDict(extra="forbid", strict=True)

    passage_id: str = Field(description="Its passage_id, as /ask gave it.")
    position: int = Field(description="Its position in the index, as /ask gave it.")


class Span(BaseModel):
    """Where the answer is: characters [start, end) of one of the passages shown."""
    model_config = ConfigDict(extra="forbid", strict=True)

    passage: int = Field(description="Which of the passages shown (0: the first).")
    start: int = Field(description="The answer's first character in the passage's text.")
    end: int = Field(description="One past its last character.")
    text: str = Field(description="The passage's text from start to end, as the user selected it.")


class FeedbackRequest(BaseModel):
    """The body of POST /feedback: what the user said of one answer of /ask."""
    model_config = ConfigDict(extra="forbid", strict=True)

    question: str = Field(description="The question, as asked.")
    verdict: Literal["right", "wrong", "span", "no_answer"] = Field(
        description="right: the answer given is right; wrong: it is wrong (counted, not a label without a span); "
                    "span: the answer is `span`, selected in a passage shown; no_answer: no passage shown answers "
                    "the question.")
    passages: list[ShownPassage] = Field(description="The passages the answer showed, in its order.")
    index_version: int | None = Field(description="The answer's index_version, as /ask gave it.")
    reader: str | None = Field(None, description="The reader that gave the answer: its settings' reader, as /ask "
                                                 "gave it (checked when given: the label is of that reader's answer).")
    answer: str | None = Field(description="The answer the system gave (null: it abstained).")
    answer_passage: int | None = Field(None, description="Which of the passages shown the answer was in.")
    span: Span | None = Field(None, description="With verdict span (and right, the answer's own): where the answer "
                                                "is.")


def label_of(request: FeedbackRequest, system, max_passages: int, max_question_chars: int) -> dict:
    """The label `request` gives (utils.feedback.store's fields), the passages' texts read from `system`'s corpus,
    or BadRequest naming the field."""
    for field, text in (("question", request.question), ("answer", request.answer),
                        ("span.text", request.span and request.span.text), ("reader", request.reader)):
        storable(field, text)
    question = request.question.strip()
    if not question or len(question) > max_question_chars:
        raise BadRequest("question", f"must be 1 to {max_question_chars} characters")
    if not 1 <= len(request.passages) <= max_passages:
        raise BadRequest("passages", f"must list the 1 to {max_passages} passages the answer showed")
    index = system.index
    version = index.version if index is not None else None
    if request.index_version != version:
        raise BadRequest("index_version", f"{request.index_version}: the answer came from another version of the "
                                          f"index than the one serving ({version}): ask again", 409)
    if request.reader is not None and request.reader != system.reader.fingerprint:
        raise BadRequest("reader", f"{request.reader}: the answer came from another reader than the one serving "
                                   f"({system.reader.fingerprint}): ask again", 409)
    shown = [passage_at(system.passages, p, i, version) for i, p in enumerate(request.passages)]
    if (request.answer_passage is None) != (not request.answer):
        raise BadRequest("answer_passage", "goes with an answer given, and only with one: the passage it is in")
    if request.answer_passage is not None and not 0 <= request.answer_passage < len(shown):
        raise BadRequest("answer_passage", f"must be one of the {len(shown)} passages shown (0 to {len(shown) - 1})")
    if request.verdict == "right" and not request.answer and request.span is not None:
        raise BadRequest("span", "given with verdict right on an abstention: no passage shown answers it")
    if request.verdict == "right" and request.span is not None and request.span.passage != request.answer_passage:
        raise BadRequest("span.passage", "with verdict right the span is the answer given, in its passage "
                                         f"({request.answer_passage})")
    if request.verdict == "right" and request.answer and request.span is None:
        raise BadRequest("span", "missing: with verdict right, the answer's own span (its passage and offsets)")
    if request.verdict == "span" and request.span is None:
        raise BadRequest("span", "missing: with verdict span, where the answer is in a passage shown")
    if request.span is not None and request.verdict not in ("span", "right"):
        raise BadRequest("span", f"given with verdict {request.verdict}: a span goes with right or span only")
    label = {"question": question, "verdict": request.verdict, "given": request.answer or "",
             "given_passage_id": shown[request.answer_passage]["passage_id"] if request.answer_passage is not None
             else None, "index_version": version, "reader": system.reader.fingerprint, "shown": shown}
    if request.span is not None:
        label.update(span_label(request.span, shown, request.answer if request.verdict == "right" else None))
    return label


def storable(field: str, text: str | None) -> None:
    """A string every store keeps as it is: UTF-8 (no lone surrogate, which JSON's \\ud800 can carry) without NUL
    (which PostgreSQL's text refuses)."""
    if text is None:
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise BadRequest(field, "not valid Unicode (a lone surrogate)") from None
    if "\x00" in text:
        raise BadRequest(field, "holds a NUL character")


def passage_at(passages, shown: ShownPassage, i: int, version) -> dict:
    """Passage i shown, as the index serving holds it at its position: it must be the one /ask gave there (the index
    serving is the answer's version: a mismatch is the request's error)."""
    if not 0 <= shown.position < len(passages) or passages[shown.position]["passage_id"] != shown.passage_id:
        raise BadRequest(f"passages[{i}]", f"{shown.passage_id!r} is not at position {shown.position} of the index "
                                           f"the answer came from (version {version})")
    p = passages[shown.position]
    return {"passage_id": p["passage_id"], "title": p.get("title", ""), "text": p["text"],
            "document": p.get("document")}


def span_label(span: Span, shown: list[dict], answer: str | None) -> dict:
    """The span's fields of a label: its passage as read, its offsets and text, checked against that text (and, for
    verdict right, against the answer given)."""
    if not 0 <= span.passage < len(shown):
        raise BadRequest("span.passage", f"must be one of the {len(shown)} passages shown (0 to {len(shown) - 1})")
    passage = shown[span.passage]
    text = passage["text"]
    if not 0 <= span.start < span.end <= len(text):
        raise BadRequest("span.start" if not 0 <= span.start < len(text) else "span.end",
                         f"[{span.start}, {span.end}) is not a span of passage {span.passage}'s {len(text)} "
                         "characters")
    if not span.text.strip():
        raise BadRequest("span.text", "holds no answer: only spaces")
    if text[span.start:span.end] != span.text:
        raise BadRequest("span.text", f"{span.text[:80]!r} is not the passage's text at [{span.start}, {span.end}) "
                                      f"({text[span.start:span.end][:80]!r})")
    if answer is not None and span.text != answer:
        raise BadRequest("span.text", f"with verdict right the span is the answer given ({answer[:80]!r})")
    return {"passage_id": passage["passage_id"], "title": passage["title"], "text": text,
            "document": passage["document"], "answer_start": span.start, "answer_end": span.end,
            "answer": span.text}

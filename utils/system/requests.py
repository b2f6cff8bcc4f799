"""What a request to the QA server may be, and what a bad one gets: `AskRequest` (the body of POST /ask, strict JSON
types, no field it does not take), `Limits` (what one request may ask: serve.py's flags), `check_request`, the
body's size checked before it is read (`BodyLimit`), and every error the app answers, FastAPI's own included (a body
that is not JSON in UTF-8, or nested too deeply to parse; a path it does not serve), in one shape:
`{"error": "<field>: <what is wrong>", "field": ...}` with a 4xx (`install_error_handlers`)."""

from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException

from utils.errors import BadRequest, check_at_least_one
from utils.files.questions import QuestionError, question_list
from utils.runtime.flags import arg

EXAMPLE = '{"question": "...", "k": 5}'
# What a field of the wrong type must be, in words: the field is named once, before it, in the error
FIELD_TYPES = {"question": "must be a string or a list of strings",
               "k": 'must be an integer, such as 5 (not "5", 5.0 or true)',
               "unanswerable_share": 'must be a number, such as 0.3 (not "0.3" or true)',
               "body": f"must be a JSON object sent as application/json, such as {EXAMPLE}"}


class AskRequest(BaseModel):
    """The body of POST /ask. Strict: each field of its JSON type (no "5" read as 5, no true as 1), and no other
    field (one the server would ignore, a misspelt "top_k", would answer with settings the client did not ask)."""
    model_config = ConfigDict(extra="forbid", strict=True)

    question: str | list[str] = Field(description="One question, or a list of them.")
    k: int | None = Field(None, description="Passages read per question (default: the server's --k).")
    unanswerable_share: float | None = Field(
        None, description="The share of questions expected to have no answer, which the no-answer threshold moves "
                          "to (needs a server calibrated with the share it was fitted on; default: the server's "
                          "--unanswerable_share, else as tuned).")


@dataclass(frozen=True)
class Limits:
    """What one request may ask (serve.py's flags of the same names); the k it reads by default is the system's
    (SystemConfig)."""
    max_k: int = arg(20, "The largest k a request may ask for.")
    max_questions_per_request: int = arg(16, "Questions one request may carry.", aliases=["--max_questions"])
    max_question_chars: int = arg(1000, "The longest question, in characters.")
    max_body_bytes: int = arg(1 << 20, "The largest request body, in bytes: a larger one is refused (413) before it "
                                       "is read whole or parsed.")

    def __post_init__(self):
        check_at_least_one(self, "max_k", "max_questions_per_request", "max_question_chars", "max_body_bytes")


class BodyLimit:
    """ASGI middleware: a request whose body is over `max_bytes` is answered 413 (JSON, naming the body) by its
    Content-Length, or as it arrives when it has none (a chunked body), before the app reads it whole or parses it;
    one within the limit reaches the app as it came."""

    def __init__(self, app, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        length = headers.get(b"content-length", b"")
        if length.isdigit() and int(length) > self.max_bytes:
            # a client that waits for "100 Continue" before it sends the body sends none: nothing to drop
            return await self.refuse(receive, send, more=headers.get(b"expect", b"").lower() != b"100-continue")
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":  # the client went: nobody to answer
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            more = message.get("more_body", False)
            if size > self.max_bytes:
                return await self.refuse(receive, send, more)
        replayed = False

        async def replay():  # the body read, then what the client sends next (its disconnect)
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": b"".join(chunks), "more_body": False}

        await self.app(scope, replay, send)

    async def refuse(self, receive, send, more: bool):
        """The 413 at once; the rest of the body is then read and dropped as it arrives, never held: a client still
        sending it (one that asked to close the connection after the answer too) gets the answer, not a reset."""
        error = JSONResponse({"error": f"body: over {self.max_bytes} bytes", "field": "body"}, status_code=413)
        await send({"type": "http.response.start", "status": error.status_code, "headers": error.raw_headers})
        await send({"type": "http.response.body", "body": error.body, "more_body": True})
        while more:
            message = await receive()
            more = message["type"] == "http.request" and message.get("more_body", False)
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def check_request(body: AskRequest, limits: Limits, default_k: int) -> tuple[list[str], int]:
    """(questions, k) of a request, or BadRequest naming the field: the questions by the Python API's own check
    (utils.files.questions) at the server's limits, k as asked or `default_k`."""
    try:
        questions = question_list(body.question, limits.max_questions_per_request, limits.max_question_chars,
                                  at_least_one=True)
    except QuestionError as err:
        raise BadRequest(err.field("question"), err.problem, err.status) from None
    k = default_k if body.k is None else body.k
    if not 1 <= k <= limits.max_k:
        raise BadRequest("k", f"must be between 1 and {limits.max_k} (got {k})")
    return questions, k


def install_error_handlers(app: FastAPI) -> None:
    """Every error of `app` in the API's shape (the handlers below)."""
    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(HTTPException, refused)
    app.add_exception_handler(BadRequest, bad)


async def invalid(request: Request, exc: RequestValidationError):
    first = exc.errors()[0]
    loc = [x for x in first.get("loc", ()) if x not in ("body", "query")]
    if first.get("type") == "json_invalid" or not loc:
        field = "body"
    elif request.url.path == "/ask":
        field = str(loc[0])
    else:  # a nested field by its path, such as span.start or passages[0].position
        field = "".join(f"[{x}]" if isinstance(x, int) else f".{x}" for x in loc).lstrip(".")
    if first.get("type") == "json_invalid":
        message = f"malformed JSON: send {EXAMPLE}" if request.url.path == "/ask" else "malformed JSON"
    elif first.get("type") == "extra_forbidden":
        message = f"not a field of {request.url.path}" + (" (it takes question, k and unanswerable_share)"
                                                          if request.url.path == "/ask" else "")
    elif first.get("type") == "missing" and field != "body":
        message = "missing"
    elif request.url.path == "/ask":
        message = FIELD_TYPES.get(field, first.get("msg", "invalid"))
    else:
        message = first.get("msg", "invalid")
    return JSONResponse({"error": f"{field}: {message}", "field": field}, status_code=422)

async def refused(request: Request, exc: HTTPException):
    """FastAPI's own refusals in the API's shape: a body it could not parse (its 400: not UTF-8, or JSON nested
    deeper than Python's parser goes, whose RecursionError it caught: the server serves on), a path or a method
    it does not serve (404, 405)."""
    if exc.status_code == 400:  # a 422 as malformed JSON is, with what FastAPI's message leaves out
        why = {UnicodeDecodeError: "not UTF-8", RecursionError: "nested too deeply"}.get(type(exc.__cause__),
                                                                                         "unreadable")
        return JSONResponse({"error": f"body: malformed JSON ({why}): send {EXAMPLE}", "field": "body"},
                            status_code=422)
    return JSONResponse({"error": str(exc.detail), "field": None}, status_code=exc.status_code,
                        headers=exc.headers)

async def bad(request: Request, exc: BadRequest):
    return JSONResponse({"error": f"{exc.field}: {exc.message}", "field": exc.field}, status_code=exc.status)

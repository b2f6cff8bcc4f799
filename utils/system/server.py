"""The QA system over HTTP (FastAPI): `POST /ask`, `GET /health`, the page at `GET /`, OpenAPI docs at `/docs`.

The app loads the models and the index once, on a thread of its own, so that `/health` answers (503, "loading")
while they load; `/ask` then answers through the micro-batcher (utils.system.batcher), with exactly
`QASystem.ask`'s rule, threshold and settings. Every bad request is a 4xx JSON error naming the field
(`{"error": ..., "field": ...}`) and never reaches the models; a request the system fails on anyway fails alone
(the batcher answers the others of its pass without it), as a JSON error too. Every error the app answers,
FastAPI's own included (a body that is not JSON in UTF-8, or nested too deeply to parse; a path it does not serve),
has that shape. A request's fields have strict JSON types (`k` an integer: not "5", 5.0 or true; the share a
number: not "0.3" or true), and a field /ask does not take (a misspelt "top_k") is refused, not ignored.
"""

import asyncio
import logging
import os
import threading
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException

from utils.errors import UserError, check_at_least_one
from utils.files.questions import QuestionError, question_list
from utils.runtime.flags import arg
from utils.system.answer import check_share
from utils.system.batcher import Batcher
from utils.system.reload import IndexWatch

logger = logging.getLogger("qa-amp")
PAGE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "page.html")
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
    """What one request may ask (serve.py's flags of the same names)."""
    k: int = arg(5, "Passages read per question when a request does not say.")
    max_k: int = arg(20, "The largest k a request may ask for.")
    max_questions: int = arg(16, "Questions one request may carry.")
    max_question_chars: int = arg(1000, "The longest question, in characters.")
    max_body_bytes: int = arg(1 << 20, "The largest request body, in bytes: a larger one is refused (413) before it "
                                       "is read whole or parsed.")

    def __post_init__(self):
        check_at_least_one(self, "k", "max_k", "max_questions", "max_question_chars", "max_body_bytes")
        if self.k > self.max_k or self.max_k > 100:
            raise UserError(f"--k ({self.k}) must be at most --max_k ({self.max_k}), and --max_k at most 100")


class BadRequest(Exception):
    def __init__(self, field: str, message: str, status: int = 422):
        self.field, self.message, self.status = field, message, status


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


def check_request(body: AskRequest, limits: Limits) -> tuple[list[str], int]:
    """(questions, k) of a request, or BadRequest naming the field: the questions by the Python API's own check
    (utils.files.questions) at the server's limits."""
    try:
        questions = question_list(body.question, limits.max_questions, limits.max_question_chars, at_least_one=True)
    except QuestionError as err:
        raise BadRequest(err.field("question"), err.problem, err.status) from None
    k = limits.k if body.k is None else body.k
    if not 1 <= k <= limits.max_k:
        raise BadRequest("k", f"must be between 1 and {limits.max_k} (got {k})")
    return questions, k


def public(a: dict, settings: dict) -> dict:
    """One answer of `QASystem.ask` as the API returns it: the answer (None when the system abstains) with its
    score, passage and character offsets, its probability of no answer, the passages read with their retrieval
    scores, and the `settings` it was made with."""
    return {"answer": a["answer"] or None, "score": a["score"], "passage_id": a["passage_id"], "title": a["title"],
            "text": a["text"], "source": a["source"], "start": a["start"], "end": a["end"],
            "no_answer_probability": a["no_answer_probability"], "settings": settings,
            "passages": [{"passage_id": p["passage_id"], "title": p["title"], "text": p["text"], "score": p["score"],
                          "source": p.get("source")} for p in a["passages"]]}


def answer_settings(system, threshold, unanswerable_share="system") -> dict:
    """What the system answers with, said with every answer: the no-answer threshold applied (None: it always
    answers; moved to --unanswerable_share if given, which it says), whether no_answer_probability is calibrated
    (--no_answer_calibration; else the shared rule's share of the softmaxes, or None), the rule and the weight of the
    retriever's score."""
    threshold, calibration = system.settings(threshold, unanswerable_share)
    share = system.unanswerable_share if unanswerable_share == "system" else unanswerable_share
    return {"no_answer_threshold": threshold, "unanswerable_share": share,
            "calibrated": calibration is not None, "rule": "question" if system.shared_norm else "window",
            "retriever_weight": system.retriever_weight}


def create_app(load_system, limits: Limits, max_batch: int, max_wait: float, threshold="recorded",
               on_load_failure=None, watch: IndexWatch | None = None, check_seconds: float = 0) -> FastAPI:
    """`load_system()`: builds the QASystem (called once, on a thread, at start). `threshold`: QASystem.ask's.
    `on_load_failure(message)`: what to do when loading fails (the server cannot serve). `watch`: the index to
    reload when it gets a new version, checked every `check_seconds` (utils.system.reload); /health's
    "index_failed" is the version on disk that could not be loaded and why ({"version", "error"}; null: none)."""
    state = {"system": None, "error": None, "started": time.time(), "reloads": 0}

    def answer_many(questions: list[str], ks: list[int], shares: list) -> list[dict]:
        system = state["system"]  # taken once: the whole pass is answered from this system and its index
        settings = {share: answer_settings(system, threshold, share) for share in set(shares)}
        return [public(a, settings[share])
                for a, share in zip(system.ask(questions, ks, threshold=threshold, unanswerable_share=shares), shares)]

    batcher = Batcher(answer_many, max_batch, max_wait)

    def load() -> None:
        logger.info("loading the models and the corpus")
        try:
            system = load_system()
            state["system"] = system
            logger.info("ready: %d passages", len(state["system"].passages))
        except UserError as err:
            state["error"] = str(err)
        except Exception as err:  # noqa: BLE001 - reported, then the server stops
            state["error"] = f"{type(err).__name__}: {err}"
        if state["error"] and on_load_failure:
            on_load_failure(state["error"])
        while watch is not None and check_seconds > 0 and not state["error"]:
            time.sleep(check_seconds)
            try:
                new = watch.check(state["system"])
            except Exception:  # noqa: BLE001 - a reload that fails keeps the version serving, and checks again
                logger.exception("reloading the index failed")
                continue
            if new is not None:  # one reference replaced: the passes under way finish on the system they took
                state["system"], state["reloads"] = new, state["reloads"] + 1

    @asynccontextmanager
    async def lifespan(app):
        batcher.queue = asyncio.Queue()
        worker = asyncio.create_task(batcher.run())
        threading.Thread(target=load, name="qa-load", daemon=True).start()
        yield
        worker.cancel()

    app = FastAPI(title="qa-amp QA system", lifespan=lifespan,
                  description="Answers questions over a corpus with a trained retriever and reader.")
    app.state.batcher = batcher
    app.add_middleware(BodyLimit, max_bytes=limits.max_body_bytes)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError):
        first = exc.errors()[0]
        loc = [x for x in first.get("loc", ()) if x != "body"]
        field = str(loc[0]) if loc and first.get("type") != "json_invalid" else "body"
        if first.get("type") == "json_invalid":
            message = f"malformed JSON: send {EXAMPLE}"
        elif first.get("type") == "extra_forbidden":
            message = "not a field of /ask (it takes question, k and unanswerable_share)"
        elif first.get("type") == "missing" and field != "body":
            message = "missing"
        else:
            message = FIELD_TYPES.get(field, first.get("msg", "invalid"))
        return JSONResponse({"error": f"{field}: {message}", "field": field}, status_code=422)

    @app.exception_handler(HTTPException)
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

    @app.exception_handler(BadRequest)
    async def bad(request: Request, exc: BadRequest):
        return JSONResponse({"error": f"{exc.field}: {exc.message}", "field": exc.field}, status_code=exc.status)

    @app.get("/health")
    async def health():
        ready = state["system"] is not None
        body = {"ready": ready, "status": "ready" if ready else "failed" if state["error"] else "loading",
                "error": state["error"], "passes": batcher.passes, "questions_answered": batcher.questions,
                "index_version": ready and state["system"].index and state["system"].index.version or None,
                "reloads": state["reloads"], "index_failed": watch.failed if watch else None,
                "uptime_seconds": round(time.time() - state["started"], 1)}
        return JSONResponse(body, status_code=200 if ready else 503)

    @app.post("/ask")
    async def ask(body: AskRequest):
        questions, k = check_request(body, limits)
        if state["system"] is None:
            return JSONResponse({"error": "the models are still loading" if not state["error"] else state["error"],
                                 "field": None}, status_code=503)
        share = "system" if body.unanswerable_share is None else body.unanswerable_share
        if body.unanswerable_share is not None:  # checked here: a share the system cannot move to fails alone
            calibration = state["system"].calibration
            try:
                check_share(body.unanswerable_share, calibration)
            except UserError as err:
                no_share = 0 < body.unanswerable_share < 1 and (calibration is None or len(calibration) != 3)
                why = ("this server cannot move its threshold: it was started without --no_answer_calibration A B "
                       "SHARE (qa_system.py --validation_file fits them)" if no_share else str(err))
                raise BadRequest("unanswerable_share", why.removeprefix("unanswerable_share ")) from None
        try:
            answers = await batcher.ask(questions, k, share)
        except QuestionError as err:  # what the checks above let through and the system refused
            raise BadRequest(err.field("question"), err.problem, err.status) from None
        except UserError as err:
            return JSONResponse({"error": str(err), "field": None}, status_code=422)
        except Exception as err:  # noqa: BLE001 - this request failed alone (utils.system.batcher): a JSON 500
            logger.exception("a request of %d questions failed", len(questions))
            return JSONResponse({"error": f"the system failed on this request: {type(err).__name__}: {err}",
                                 "field": None}, status_code=500)
        return {"answers": answers, "k": k}

    @app.get("/", include_in_schema=False)
    async def page():
        return FileResponse(PAGE, media_type="text/html")

    return app

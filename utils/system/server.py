"""The QA system over HTTP (FastAPI): `POST /ask`, `GET /health`, the page at `GET /`, OpenAPI docs at `/docs`, and
the users' labels of its answers: `POST /feedback`, `GET /feedback` (utils.feedback).

The app's state is one object, `ServerState`: the system serving, the batcher that answers in passes, the index and
reader it watches, what the server was started with. It loads the models and the index once, on a thread of its
own, so that `/health` answers (503, "loading") while they load; `/ask` then answers through the micro-batcher
(utils.system.batcher), with exactly `QASystem.ask`'s rule, threshold and settings. Every bad request is a 4xx JSON
error naming the field and never reaches the models (utils.system.requests); a request the system fails on anyway
fails alone (the batcher answers the others of its pass without it), as a JSON error too. A new version of the
index or of the reader (utils.system.reload) replaces the system whole between passes: a pass, so every request, is
answered by one index and one reader.
"""

import asyncio
import logging
import os
import threading
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass

from fastapi import FastAPI
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse
from sqlalchemy.exc import SQLAlchemyError

from utils.errors import BadRequest, UserError, check_at_least_one
from utils.feedback.access import FeedbackAccess
from utils.feedback.labels import FeedbackRequest, label_of
from utils.feedback.store import FeedbackStore, one_line
from utils.files.questions import QuestionError
from utils.reader.trained import normalization
from utils.runtime.flags import arg
from utils.system.answer import check_share
from utils.system.batcher import Batcher
from utils.system.documents import document_path, document_view, link, media_type, viewed_as_itself
from utils.system.reload import Watch
from utils.system.requests import AskRequest, BodyLimit, Limits, check_request, install_error_handlers

logger = logging.getLogger("qa-amp")
PAGE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "page.html")


@dataclass(frozen=True)
class ServeArgs:
    """The server's own flags; the system is SystemConfig's, the answer rule's settings AnswerSettings', what a
    request may ask Limits'."""
    host: str = arg("127.0.0.1", "Address to listen on (127.0.0.1: this machine only; 0.0.0.0: every interface).")
    port: int = arg(8000, "Port to listen on.")
    max_batch: int = arg(32, "Questions answered together in one pass (retrieval and reading batched); 1: one at a "
                             "time.")
    max_wait_ms: float = arg(5.0, "How long a pass waits for more questions to arrive before it starts.")
    reload_check_seconds: float = arg(5.0, "How often the --index manifest and the --reader directory are checked "
                                           "for a new version (index_corpus.py or train_reader.py run again on "
                                           "them): it is loaded beside the one serving and swapped in between "
                                           "passes, no request failed or answered from a mix; 0: never.",
                                      aliases=["--index_check_seconds"])

    def __post_init__(self):
        check_at_least_one(self, "max_batch")
        if not 0 <= self.max_wait_ms <= 1000:
            raise UserError(f"--max_wait_ms must be between 0 and 1000 (got {self.max_wait_ms})")
        if self.reload_check_seconds < 0:
            raise UserError(f"--reload_check_seconds must be 0 (never) or more (got {self.reload_check_seconds})")
        if not 0 <= self.port < 65536:
            raise UserError(f"--port {self.port}: not a port")


def public(a: dict, settings: dict, documents: list[str] | None = None, index_version: int | None = None) -> dict:
    """One answer of `QASystem.ask` as the API returns it: the answer (None when the system abstains) with its
    score, passage and character offsets, its probability of no answer, the passages read with their retrieval
    scores and positions in the index, the index's version, and the `settings` it was made with (a label of the
    answer, POST /feedback, gives back the version and positions). Where the index was built from `documents`, each
    source carries the link to its document (utils.system.documents)."""
    positions = {p["passage_id"]: p.get("position") for p in a["passages"]}

    def source(s, position):
        found = link(documents, s, position)
        return {**s, "link": found} if found else s

    return {"answer": a["answer"] or None, "score": a["score"], "passage_id": a["passage_id"], "title": a["title"],
            "text": a["text"], "source": source(a["source"], positions.get(a["passage_id"])), "start": a["start"],
            "end": a["end"], "no_answer_probability": a["no_answer_probability"], "settings": settings,
            "index_version": index_version,
            "passages": [{"passage_id": p["passage_id"], "title": p["title"], "text": p["text"], "score": p["score"],
                          "position": p["position"], "source": source(p.get("source"), p.get("position"))}
                         for p in a["passages"]]}


def answered_with(system, threshold, unanswerable_share="system") -> dict:
    """What the system answers with, said with every answer: the no-answer threshold applied (None: it always
    answers; moved to --unanswerable_share if given, which it says), whether no_answer_probability is calibrated
    (--no_answer_calibration; else the shared rule's share of the softmaxes, or None), the rule, the weight of the
    retriever's score and the reader's fingerprint (a label of the answer, POST /feedback, gives it back)."""
    threshold, calibration = system.settings(threshold, unanswerable_share)
    share = system.unanswerable_share if unanswerable_share == "system" else unanswerable_share
    return {"no_answer_threshold": threshold, "unanswerable_share": share,
            "calibrated": calibration is not None, "rule": normalization(system.shared_norm),
            "retriever_weight": system.retriever_weight, "reader": system.reader.fingerprint}


class ServerState:
    """The app's state, one object: the system serving (None while it loads; replaced whole by a reload), why it
    cannot serve (loading failed), the batcher, the index watch, and what the server was started with.

    `load_system()` builds the QASystem (once, on the loading thread); `threshold`: QASystem.ask's; `k`: the
    passages a request reads when it does not say; `on_load_failure(message)`: what to do when loading fails;
    `watches`: the index and the reader to reload when they get a new version (utils.system.reload); `feedback`: the
    store of the labels users give (utils.feedback.store), `access` who may use it (utils.feedback.access)."""

    def __init__(self, load_system, args: ServeArgs, limits: Limits, k: int, threshold="recorded",
                 watches: tuple[Watch, ...] = (), on_load_failure=None, feedback: FeedbackStore | None = None,
                 access: FeedbackAccess | None = None):
        self.load_system, self.args, self.limits, self.k, self.threshold = load_system, args, limits, k, threshold
        self.watches, self.on_load_failure, self.feedback, self.access = watches, on_load_failure, feedback, access
        self.system, self.error, self.started = None, None, time.time()
        self.reloads = {watch.what: 0 for watch in watches}
        self.batcher = Batcher(self.answer_many, args.max_batch, args.max_wait_ms / 1000)

    def answer_many(self, questions: list[str], ks: list[int], shares: list) -> list[dict]:
        """One pass of the batcher: every question answered from the system as it is when the pass starts."""
        system = self.system  # taken once: the whole pass is answered from this system and its index
        settings = {share: answered_with(system, self.threshold, share) for share in set(shares)}
        answers = system.ask(questions, ks, threshold=self.threshold, unanswerable_share=shares)
        documents, version = (system.index.documents, system.index.version) if system.index is not None else (None,
                                                                                                            None)
        return [public(a, settings[share], documents, version) for a, share in zip(answers, shares)]

    def load(self) -> None:
        """The loading thread: the system, then the index and the reader watched every --reload_check_seconds."""
        logger.info("loading the models and the corpus")
        try:
            system = self.load_system()
            system.reader.fingerprint  # noqa: B018 - hashed now, on this thread: the reader as loaded
            self.system = system
            logger.info("ready: %d passages", len(self.system.passages))
        except UserError as err:
            self.error = str(err)
        except Exception as err:  # noqa: BLE001 - reported, then the server stops
            self.error = f"{type(err).__name__}: {err}"
        if self.error and self.on_load_failure:
            self.on_load_failure(self.error)
        while self.watches and self.args.reload_check_seconds > 0 and not self.error:
            time.sleep(self.args.reload_check_seconds)
            for watch in self.watches:
                try:
                    new = watch.check(self.system)
                except Exception:  # noqa: BLE001 - a reload that fails keeps the version serving, and checks again
                    logger.exception("reloading the %s failed", watch.what)
                    continue
                if new is not None:  # one reference replaced: the passes under way finish on the system they took
                    self.system = new
                    self.reloads[watch.what] += 1

    def health(self) -> JSONResponse:
        """/health: ready or not (503 while loading, or after a failed load), the passes and questions answered, the
        index's version and the reader's fingerprint, their reloads, and a version of either on disk that could not
        be loaded and why ("index_failed", "reader_failed": {"version", "error"})."""
        system = self.system
        failed = {watch.what: watch.failed for watch in self.watches}
        body = {"ready": system is not None, "status": "ready" if system else "failed" if self.error else "loading",
                "error": self.error, "passes": self.batcher.passes, "questions_answered": self.batcher.questions,
                "index_version": system and system.index and system.index.version or None,
                "reloads": self.reloads.get("index", 0), "index_failed": failed.get("index"),
                "reader": system and system.reader.fingerprint or None,
                "reader_reloads": self.reloads.get("reader", 0), "reader_failed": failed.get("reader"),
                "uptime_seconds": round(time.time() - self.started, 1)}
        return JSONResponse(body, status_code=200 if system else 503)

    def share_asked(self, share: float | None):
        """The unanswerable share a request asks for ("system": the server's), or BadRequest where the system cannot
        move its threshold there (checked here: such a request fails alone)."""
        if share is None:
            return "system"
        calibration = self.system.calibration
        try:
            check_share(share, calibration)
        except UserError as err:
            no_share = 0 < share < 1 and (calibration is None or len(calibration) != 3)
            why = ("this server cannot move its threshold: it was started without --no_answer_calibration A B SHARE "
                   "(qa_system.py --validation_file fits them)" if no_share else str(err))
            raise BadRequest("unanswerable_share", why.removeprefix("unanswerable_share ")) from None
        return share

    def document(self, name: str, passage: int, original: bool):
        """/documents/NAME?passage=P: the document of passage P, read-only, if the index lists it there and it lies
        where the index was built from; a PDF (or `original`) as the file, any other as its text with the passage
        highlighted (utils.system.documents); anything else not found."""
        system = self.system  # one version for the whole request, as a pass
        index = system and system.index
        path = document_path(index, name, passage) if index is not None else None
        if path is None:
            return JSONResponse({"error": f"{name}: no such document", "field": None}, status_code=404)
        if original or viewed_as_itself(name):
            return FileResponse(path, media_type=media_type(path))
        return HTMLResponse(document_view(index, name, passage))

    def feedback_refused(self, authorization: str | None):
        """/feedback's answer when it cannot be used: 404 without a store, 401 without the token it needs, 403 on a
        server that takes no feedback (another address than loopback, no token given)."""
        if self.feedback is None:
            return JSONResponse({"error": "this server keeps no feedback", "field": None}, status_code=404)
        refused = self.access.refusal(authorization)
        if refused:
            status, why = refused
            return JSONResponse({"error": why, "field": None}, status_code=status,
                                headers={"WWW-Authenticate": "Bearer"} if status == 401 else None)
        return None

    async def give_feedback(self, body: FeedbackRequest):
        """POST /feedback (its access checked by create_app's middleware): the label checked against the index
        serving (utils.feedback.labels), then written in one transaction (off the event loop: /ask goes on
        meanwhile); 201 with the label as stored."""
        system = self.system  # one version for the whole request, as a pass
        if system is None:
            return JSONResponse({"error": self.error or "the models are still loading", "field": None},
                                status_code=503)
        label = label_of(body, system, self.limits.max_k, self.limits.max_question_chars)
        try:
            stored = await asyncio.to_thread(self.feedback.add, label)
        except SQLAlchemyError as err:  # the database is down or full: this request fails, the server serves on
            logger.error("writing a label failed: %s", one_line(err))
            return JSONResponse({"error": f"the feedback store failed: {one_line(err)}", "field": None},
                                status_code=503)
        return JSONResponse(stored, status_code=201)

    async def list_feedback(self, after: int, limit: int):
        """GET /feedback?after=ID&limit=N: the labels written after label ID, in order, N at most (1 to 1000); "next"
        is the `after` of the next page (None at the end), "total" how many there are."""
        if not 1 <= limit <= 1000:
            raise BadRequest("limit", f"must be between 1 and 1000 (got {limit})")
        if not 0 <= after < 2 ** 31:  # a label's id: what every store's integer holds
            raise BadRequest("after", f"must be a label's id, 0 to {2 ** 31 - 1} (got {after})")
        try:
            labels, total = await asyncio.to_thread(self.feedback.page, after, limit)
        except SQLAlchemyError as err:
            return JSONResponse({"error": f"the feedback store failed: {one_line(err)}", "field": None},
                                status_code=503)
        return {"labels": labels, "total": total, "next": labels[-1]["id"] if len(labels) == limit else None}

    async def ask(self, body: AskRequest):
        """/ask: the request checked, then answered in the batcher's next pass."""
        questions, k = check_request(body, self.limits, self.k)
        if self.system is None:
            return JSONResponse({"error": self.error or "the models are still loading", "field": None},
                                status_code=503)
        share = self.share_asked(body.unanswerable_share)
        try:
            answers = await self.batcher.ask(questions, k, share)
        except QuestionError as err:  # what the checks above let through and the system refused
            raise BadRequest(err.field("question"), err.problem, err.status) from None
        except UserError as err:
            return JSONResponse({"error": str(err), "field": None}, status_code=422)
        except Exception as err:  # noqa: BLE001 - this request failed alone (utils.system.batcher): a JSON 500
            logger.exception("a request of %d questions failed", len(questions))
            return JSONResponse({"error": f"the system failed on this request: {type(err).__name__}: {err}",
                                 "field": None}, status_code=500)
        return {"answers": answers, "k": k}


def create_app(state: ServerState) -> FastAPI:
    """The app over `state`: its routes, the body's size limit, the errors in the API's shape; the batcher runs and
    the system loads (on a thread) while the app lives."""

    @asynccontextmanager
    async def lifespan(app):
        state.batcher.queue = asyncio.Queue()
        worker = asyncio.create_task(state.batcher.run())
        threading.Thread(target=state.load, name="qa-load", daemon=True).start()
        yield
        worker.cancel()

    app = FastAPI(title="qa-amp QA system", lifespan=lifespan,
                  description="Answers questions over a corpus with a trained retriever and reader.")
    app.state.server = state
    app.add_middleware(BodyLimit, max_bytes=state.limits.max_body_bytes)
    install_error_handlers(app)

    @app.middleware("http")  # added last, so run first: before the body is read, its size or its fields checked
    async def feedback_access(request, call_next):
        """/feedback refused (401/403/404) before anything of the request is read: only the token's holder learns
        what a request's body or page would have been told."""
        refused = state.feedback_refused(request.headers.get("authorization")) \
            if request.url.path == "/feedback" else None
        return refused if refused is not None else await call_next(request)

    @app.get("/health")
    async def health():
        return state.health()

    @app.post("/ask")
    async def ask(body: AskRequest):
        return await state.ask(body)

    @app.post("/feedback", status_code=201)
    async def feedback(body: FeedbackRequest):
        return await state.give_feedback(body)

    @app.get("/feedback")
    async def labels(after: int = 0, limit: int = 100):
        return await state.list_feedback(after, limit)

    @app.get("/documents/{name:path}", include_in_schema=False)
    async def document(name: str, passage: int = -1, original: bool = False):
        return state.document(name, passage, original)

    @app.get("/", include_in_schema=False)
    async def page():
        return FileResponse(PAGE, media_type="text/html")

    return app

"""Serve the QA system: an HTTP API and a page to ask it, answering concurrent questions in shared passes.

Runbook (from the repository root, after `pip install -r requirements.txt`):

  python serve.py --retriever outputs/dpr-squad --reader outputs/reader-squad --index outputs/corpus-index
      Loads the models and the index once, then serves on http://127.0.0.1:8000 (127.0.0.1 unless --host says
      otherwise): the page at /, `POST /ask` {"question": "..." or [...], "k": 5}, `GET /health`, the OpenAPI docs at
      /docs. The same question gets the same answer as qa_system.py at the same threshold and weights (the reader's
      recorded threshold and no weight unless --no_answer_threshold and --retriever_weight; a qa_system.py run with
      --validation_file tunes them, and --no_answer_calibration, per k). With --unanswerable_share S (or
      "unanswerable_share" in a request) the threshold moves to that share of unanswerable questions by its odds
      (utils/system/answer.py; needs --no_answer_calibration A B SHARE).

  python serve.py --retriever bm25 --reader outputs/reader-squad --passages corpus.jsonl --port 8080
      BM25 over a corpus given as passages (a trained retriever embeds them at start instead).

  curl -s localhost:8000/ask -H 'content-type: application/json' -d '{"question": "Who designed the lighthouse?"}'

  An --index built from a folder (index_corpus.py --documents) gives each answer a link to its document, which the
  server serves read-only from that folder only: GET /documents/NAME?passage=P (a PDF as the file, at #page=N; any
  other document as its text with the passage highlighted; utils/system/documents.py).

  Under each answer the page has buttons to label it (right, wrong, the answer is this selected span, no passage
  shown answers it): the same as `POST /feedback`, listed by `GET /feedback?after=ID&limit=N`, kept in
  --feedback_db (a SQLite file; a PostgreSQL URL where several servers share it). On any --host but loopback,
  /feedback needs the token of --feedback_token_file or QA_AMP_FEEDBACK_TOKEN (`Authorization: Bearer TOKEN`).

  index_corpus.py run again on the --index (documents added, changed or removed): the server sees the new manifest
  within --reload_check_seconds, loads the new version beside the one serving and swaps it in between passes: no
  request fails, and each is answered from one version (/health gives "index_version" and "reloads"). A version
  that is not whole (a file missing or cut short) is never swapped in: the one serving goes on, /health's
  "index_failed" says which version and why, the log says it once. The same for a reader train_reader.py
  publishes into --reader again (fine-tuned on the labels): /health's "reader" (its fingerprint), "reader_reloads"
  and "reader_failed"; the thresholds given as flags stay, the recorded one is the new reader's.

Requests that arrive within --max_wait_ms of each other are answered in one pass (up to --max_batch questions):
under load a pass is a batch, not one question (utils/system/batcher.py; benchmarks/serve_benchmark.py measures it).
Bad requests get a 4xx JSON error naming the field (a body over --max_body_bytes: 413, before it is read whole);
SIGTERM (or Ctrl-C) stops taking requests, finishes the ones in flight and exits 0. The port is taken before
anything loads: one in use is a one-line error (exit 2) at once.
"""

import errno
import logging
import os
import signal
import socket
import sys

import uvicorn

from utils.errors import UserError, exit_on_user_error
from utils.feedback.access import FeedbackAccess, read_token
from utils.feedback.store import FeedbackConfig, FeedbackStore
from utils.files.corpus import load_passages
from utils.index.index import Index
from utils.runtime.flags import parse_args
from utils.system.answer import AnswerSettings
from utils.system.inputs import SystemConfig, build_system, load_reader
from utils.system.reload import IndexWatch, ReaderWatch
from utils.system.requests import Limits
from utils.system.server import ServeArgs, ServerState, create_app

logger = logging.getLogger("qa-amp")


FLAGS = (SystemConfig, AnswerSettings, ServeArgs, Limits, FeedbackConfig)


def resolve(config: SystemConfig, answer_settings: AnswerSettings, args: ServeArgs, limits: Limits,
            feedback: FeedbackConfig):
    """The checks across the parsed configs, once, as qa_system.py's resolve does for its own."""
    if config.k > limits.max_k or limits.max_k > 100:
        raise UserError(f"--k ({config.k}) must be at most --max_k ({limits.max_k}), and --max_k at most 100")
    answer_settings.check()
    if limits.max_questions_per_request > args.max_batch and args.max_batch > 1:
        raise UserError(f"--max_questions_per_request ({limits.max_questions_per_request}) must fit in one pass "
                        f"(--max_batch {args.max_batch})")
    return config, answer_settings, args, limits, feedback


@exit_on_user_error
def main(argv=None):
    # --- setup: check everything, and take the port, before anything is loaded ------------------------
    config, answer_settings, args, limits, feedback = resolve(*parse_args(FLAGS, argv))
    access = FeedbackAccess(args.host, read_token(feedback.feedback_token_file))
    sock = listening_socket(args.host, args.port)
    # the users' labels: opened (created) now, a bad store is one line; "none": no store, /feedback not served
    store = FeedbackStore(feedback.feedback_db) if feedback.feedback_db != "none" else None
    logging.basicConfig(format="%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S", level=logging.INFO)
    failure = []

    def load_system():  # on the app's loading thread: /health says "loading" meanwhile
        passages = load_passages(config.passages) if config.passages else None
        index = Index.load(config.index) if config.index else None
        return build_system(config, answer_settings, None, passages, index, progress=False)

    def on_load_failure(message):  # nothing to serve: stop, and exit 2 as every user error does
        failure.append(message)
        os.kill(os.getpid(), signal.SIGTERM)

    threshold = "recorded" if answer_settings.no_answer_threshold is None else answer_settings.no_answer_threshold
    # watched from before the load: a version published during it is loaded next
    watches = (*([IndexWatch(config.index)] if config.index else []),
               ReaderWatch(config.reader, lambda directory: load_reader(config, directory)))
    app = create_app(ServerState(load_system, args, limits, config.k, threshold, watches, on_load_failure, store,
                                 access))

    # --- serve: SIGTERM/SIGINT stop taking requests and drain the ones in flight -------------------------
    server = DrainingServer(uvicorn.Config(app, host=args.host, port=args.port, log_level="warning",
                                           timeout_graceful_shutdown=60))
    server.run(sockets=[sock])
    if failure:
        raise UserError(failure[0])
    print(f"stopped after answering {app.state.server.batcher.questions} questions", file=sys.stderr, flush=True)


BIND_ERRORS = {errno.EADDRINUSE: "address in use", errno.EADDRNOTAVAIL: "not an address of this machine",
               errno.EACCES: "permission denied"}


def listening_socket(host: str, port: int) -> socket.socket:
    """The server's socket, bound now, before the models load (uvicorn serves on it): a port in use, a host that is
    not this machine's, is one line and exit 2 at once, not uvicorn's error once everything is loaded."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: a port just freed is free
    try:
        sock.bind((host, port))
    except OSError as err:
        sock.close()
        reason = "unknown host" if isinstance(err, socket.gaierror) else BIND_ERRORS.get(err.errno, err.strerror)
        raise UserError(f"could not listen on {host}:{port}: {reason}") from None
    return sock


class DrainingServer(uvicorn.Server):
    """uvicorn's server, which on SIGTERM/SIGINT finishes the requests in flight; uvicorn then re-raises the signal
    at exit (status 143 for SIGTERM), whereas a drained, orderly stop is a success: exit 0."""

    def handle_exit(self, sig, frame):
        super().handle_exit(sig, frame)
        self._captured_signals.clear()


if __name__ == "__main__":
    main()

"""A folder of documents kept indexed (index_corpus.py --documents, --watch): its documents read into the index's own
corpus (DOCUMENTS_CORPUS, utils.files.ingest) and the index built or brought up to date from it (utils.index.writer:
only new and changed passages embedded), now and, with a period, again whenever a document was added, changed or
removed: the folder's content hashes are compared, not the files' times, so a file touched is no update and a file
rewritten with its old time is one. A running serve.py picks each new version up.

SIGTERM or Ctrl-C stops the watch between updates: an update under way runs to its end and publishes (a second
Ctrl-C interrupts it: the index keeps its previous version, and the next run resumes the update). Several processes
(accelerate launch) watch together: the first reads the folder and decides, every process embeds its shard."""

import os
import signal
import threading

from accelerate.utils import broadcast_object_list

from utils.errors import UserError
from utils.files.documents import DocumentsConfig
from utils.files.ingest import fingerprint, ingest
from utils.index.format import DOCUMENTS_CORPUS, holds_index_manifest
from utils.index.index import check_index_target
from utils.index.writer import build_index
from utils.splitting import SplitConfig


class Stop:
    """SIGTERM and SIGINT as a request to stop between updates (on the main thread; a second SIGINT is Ctrl-C)."""

    def __init__(self):
        self.requested = threading.Event()
        signal.signal(signal.SIGTERM, self.ask)
        signal.signal(signal.SIGINT, self.ask)

    def ask(self, signum, frame):
        if signum == signal.SIGINT and self.requested.is_set():
            raise KeyboardInterrupt
        self.requested.set()


def keep_indexed(accelerator, encoder, reading: DocumentsConfig, split: SplitConfig, output_dir: str,
                 period: float, report, overwrite: bool = False, **build) -> dict:
    """Index the documents of `reading` into `output_dir` with `encoder` (a collective), then, with a `period` in
    seconds, again whenever they change, until asked to stop. `report(meta)` says what each build did; `build`:
    build_index's other settings (dtype, chunk_passages, bm25). Returns the last manifest."""
    corpus = os.path.join(output_dir, DOCUMENTS_CORPUS)
    stop = Stop() if period else None
    on_main(accelerator, lambda: prepare(output_dir))
    seen, meta = None, None
    while True:
        now = fingerprint(reading) if accelerator.is_main_process else None
        changed = broadcast_object_list([now != seen])[0] if accelerator.num_processes > 1 else now != seen
        if changed:
            counts = on_main(accelerator, lambda: ingest(reading, split, corpus))
            accelerator.print(f"{output_dir}: {counts['documents']} documents read, {counts['passages']} passages "
                              f"({len(counts['skipped'])} skipped)")
            meta = build_index(accelerator, encoder, corpus, output_dir, documents=reading.documents,
                               overwrite=overwrite and seen is None, **build)  # replaced once, at the start
            report(meta)
            seen = now
        if not period or wait(accelerator, stop, period):
            return meta


def prepare(output_dir: str) -> None:
    """The index's directory, before its corpus is written into it: an index of this project, or a new or empty
    directory (utils.index.index.check_index_target)."""
    if holds_index_manifest(output_dir):
        return
    check_index_target(output_dir, False, "--overwrite_output_dir", own_corpus=True)
    try:
        os.makedirs(output_dir, exist_ok=True)
    except OSError as err:
        raise UserError(f"{output_dir}: cannot create the index directory ({err.strerror or err})") from None


def on_main(accelerator, work):
    """`work()` on the first process, its result (or its one-line error) on every process."""
    result, failure = None, None
    if accelerator.is_main_process:
        try:
            result = work()
        except UserError as err:
            failure = str(err)
    if accelerator.num_processes > 1:
        result, failure = broadcast_object_list([result, failure])
    if failure:
        raise UserError(failure)
    return result


def wait(accelerator, stop: Stop, period: float) -> bool:
    """Wait one period; whether to stop (the first process's word: every process stops together)."""
    stop.requested.wait(period)
    asked = stop.requested.is_set()
    return broadcast_object_list([asked])[0] if accelerator.num_processes > 1 else asked

"""Questions that arrive together are answered together: the server's micro-batching.

Each request puts its questions on one queue and waits. A single worker takes the first waiting request, then
every request that arrives within `max_wait` seconds (or is already waiting) while its questions fit in `max_batch`
(the first that does not fit opens the next pass, so requests keep their order), and answers them in one pass on a
worker thread (retrieval and reading batched across the requests). While a pass runs, new requests queue up, so
under load every pass is as full as `max_batch` allows: throughput is a batch's, not one question's, and an idle
server adds at most `max_wait` to a lone question's latency. With `max_batch=1` each request is its own pass (what
the benchmark compares against). A pass that fails answers each of its requests again on its own, so a request
the system cannot answer fails alone: its client gets the error, every other client its answers.
"""

import asyncio
import ctypes
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass


def release_freed_memory() -> None:
    """Hand the pages glibc holds free back to the kernel (malloc_trim). Passes of every size and padded length free
    and allocate blocks of ever other sizes on the pass thread's arena, whose free space fragments, and glibc
    returns free memory on its own only from the top of a heap: a long-running server's RSS would creep up with the
    questions it answered."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):  # not glibc: nothing to do
            pass


@dataclass
class _Request:
    questions: list[str]
    k: int
    future: asyncio.Future
    unanswerable_share: float | None = None


def _fail(request: _Request, err: Exception) -> None:
    if not request.future.done():  # the client may have gone
        request.future.set_exception(err)


class Batcher:
    def __init__(self, answer_many, max_batch: int, max_wait: float):
        """`answer_many(questions, ks, shares)`: one answer per question (with its own k and expected share of
        unanswerable questions), computed in one pass."""
        self.answer_many, self.max_batch, self.max_wait = answer_many, max_batch, max_wait
        self.queue: asyncio.Queue | None = None
        self.held: _Request | None = None  # taken from the queue but left for the next pass: it did not fit
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="qa-pass")
        self.passes = self.questions = 0  # counters for /health

    async def ask(self, questions: list[str], k: int, unanswerable_share: float | None = None) -> list[dict]:
        future = asyncio.get_running_loop().create_future()
        await self.queue.put(_Request(questions, k, future, unanswerable_share))
        return await future

    async def _answer(self, batch: list[_Request]) -> None:
        """One pass over the requests of `batch`, each handed its answers; raises what the pass raised."""
        questions = [q for r in batch for q in r.questions]
        ks = [r.k for r in batch for _ in r.questions]
        shares = [r.unanswerable_share for r in batch for _ in r.questions]
        answers = await asyncio.get_running_loop().run_in_executor(self.executor, self.answer_many, questions, ks,
                                                                   shares)
        self.passes, self.questions = self.passes + 1, self.questions + len(questions)
        first = 0
        for r in batch:
            if not r.future.done():  # the client may have gone
                r.future.set_result(answers[first:first + len(r.questions)])
            first += len(r.questions)

    async def run(self) -> None:
        """The worker: forever gather a batch, answer it off the event loop, hand each request its answers."""
        loop = asyncio.get_running_loop()
        self.queue = self.queue or asyncio.Queue()
        while True:
            batch = [self.held if self.held is not None else await self.queue.get()]
            self.held = None
            size = len(batch[0].questions)
            deadline = loop.time() + self.max_wait
            while size < self.max_batch:
                try:
                    nxt = self.queue.get_nowait() if loop.time() >= deadline else await asyncio.wait_for(
                        self.queue.get(), deadline - loop.time())
                except (asyncio.QueueEmpty, asyncio.TimeoutError):
                    break
                if size + len(nxt.questions) > self.max_batch:  # first in the next pass: requests keep their order
                    self.held = nxt
                    break
                batch.append(nxt)
                size += len(nxt.questions)
            try:
                await self._answer(batch)
            except Exception as err:  # noqa: BLE001 - a failed pass fails its requests, not the server
                if len(batch) == 1:
                    _fail(batch[0], err)
                    continue
                for r in batch:  # which request failed it? Each again on its own: only one that fails alone fails
                    if not r.future.done():  # the client may have gone
                        try:
                            await self._answer([r])
                        except Exception as own:  # noqa: BLE001 - its own error, for its own client
                            _fail(r, own)
            if self.queue.empty() and self.held is None:  # nothing waits: a moment to give freed memory back,
                # on the pass thread's arena
                await loop.run_in_executor(self.executor, release_freed_memory)

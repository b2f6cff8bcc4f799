"""The server's micro-batching (utils.system.batcher) on its own: passes never carry more than max_batch questions,
requests keep their order, and every request gets its own answers."""

import asyncio

from utils.system.batcher import Batcher


def test_a_pass_never_exceeds_max_batch_and_requests_keep_their_order():
    passes = []

    def answer_many(questions, ks):
        passes.append(list(questions))
        return [f"answer to {q} at k={k}" for q, k in zip(questions, ks)]

    async def main():
        batcher = Batcher(answer_many, max_batch=4, max_wait=0.05)
        batcher.queue = asyncio.Queue()
        requests = [[f"q{i}-{j}" for j in range(n)] for i, n in enumerate([3, 3, 1, 4, 2])]
        asks = [asyncio.ensure_future(batcher.ask(r, k=i + 1)) for i, r in enumerate(requests)]
        worker = asyncio.ensure_future(batcher.run())
        answers = await asyncio.wait_for(asyncio.gather(*asks), 10)
        worker.cancel()
        batcher.executor.shutdown()
        return requests, answers

    requests, answers = asyncio.run(main())
    assert [len(p) for p in passes] == [3, 4, 4, 2]  # 3 | 3+1 | 4 | 2: a request that would overflow waits
    assert [q for p in passes for q in p] == [q for r in requests for q in r]
    assert answers == [[f"answer to {q} at k={i + 1}" for q in r] for i, r in enumerate(requests)]

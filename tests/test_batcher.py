"""The server's micro-batching (utils.system.batcher) on its own: passes never carry more than max_batch questions,
requests keep their order, every request gets its own answers, and a request whose questions fail a pass fails
alone."""

import asyncio

from utils.system.batcher import Batcher


def test_a_pass_never_exceeds_max_batch_and_requests_keep_their_order():
    passes = []

    def answer_many(questions, ks, shares):
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


def test_a_failing_request_fails_alone_and_the_others_of_its_pass_are_answered():
    passes = []

    def answer_many(questions, ks, shares):
        passes.append(list(questions))
        if "bad" in questions:
            raise ValueError("cannot read 'bad'")
        return [f"answer to {q}" for q in questions]

    async def main():
        batcher = Batcher(answer_many, max_batch=8, max_wait=0.05)
        batcher.queue = asyncio.Queue()
        requests = [["q0"], ["q1", "bad"], ["q2", "q3"]]
        asks = [asyncio.ensure_future(batcher.ask(r, k=3)) for r in requests]
        worker = asyncio.ensure_future(batcher.run())
        answers = await asyncio.wait_for(asyncio.gather(*asks, return_exceptions=True), 10)
        worker.cancel()
        batcher.executor.shutdown()
        return batcher, answers

    batcher, answers = asyncio.run(main())
    assert passes[0] == ["q0", "q1", "bad", "q2", "q3"]  # one pass, which failed: each request again on its own
    assert sorted(map(tuple, passes[1:])) == [("q0",), ("q1", "bad"), ("q2", "q3")]
    assert answers[0] == ["answer to q0"] and answers[2] == ["answer to q2", "answer to q3"]
    assert isinstance(answers[1], ValueError) and str(answers[1]) == "cannot read 'bad'"
    assert batcher.questions == 3  # the questions answered

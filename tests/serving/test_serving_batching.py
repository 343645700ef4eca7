"""The micro-batcher on its own: concurrent submissions, one predict call per batch, answers sliced back."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from sparktune.serve.batching import (
    BatcherStopped,
    MicroBatcher,
    QueueFull,
    length_groups,
    predict_in_length_groups,
)
from sparktune.serve.champion import Scored


class RecordingModel:
    """Answers each text with itself upper-cased (so a slice given to the wrong caller shows) and
    records every batch it was called with, and on which thread."""

    def __init__(self, delay_s: float = 0.01, fail_on: str | None = None) -> None:
        self.batches: list[list[str]] = []
        self.threads: set[int] = set()
        self.delay_s = delay_s
        self.fail_on = fail_on

    def __call__(self, texts: list[str]) -> Scored:
        self.batches.append(list(texts))
        self.threads.add(threading.get_ident())
        time.sleep(self.delay_s)
        if self.fail_on and self.fail_on in texts:
            raise RuntimeError(f"cannot score {self.fail_on!r}")
        return Scored("m", "7", [t.upper() for t in texts], [len(t) / 100 for t in texts])


async def _with_batcher(model: RecordingModel, work, **kwargs):
    batcher = MicroBatcher(model, **kwargs)
    await batcher.start()
    try:
        return await work(batcher), batcher
    finally:
        await batcher.stop()


def test_concurrent_submissions_share_batches_and_each_caller_gets_its_own_rows():
    model = RecordingModel(delay_s=0.02)
    requests = [[f"r{i}-t{j}" for j in range(1 + i % 4)] for i in range(30)]

    async def work(batcher):
        return await asyncio.gather(*(batcher.submit(texts) for texts in requests))

    answers, batcher = asyncio.run(_with_batcher(model, work, max_batch_rows=32, max_wait_s=0.01))
    for texts, answer in zip(requests, answers, strict=True):
        assert answer.predictions == [t.upper() for t in texts]
        assert answer.scores == [len(t) / 100 for t in texts]
        assert (answer.model_name, answer.model_version) == ("m", "7")
    assert len(model.batches) < len(requests) / 3
    assert all(len(batch) <= 32 for batch in model.batches)
    assert sorted(t for batch in model.batches for t in batch) == sorted(t for r in requests for t in r)
    assert batcher.stats.batches == len(model.batches) and batcher.stats.requests == len(requests)
    assert threading.get_ident() not in model.threads  # predict ran off the event loop's thread


def test_a_batch_keeps_arrival_order_and_its_row_limit_and_a_large_request_runs_alone():
    model = RecordingModel(delay_s=0.0)

    async def work(batcher):
        sizes = (3, 3, 8, 1)
        tasks = []
        for n, size in enumerate(sizes):
            tasks.append(asyncio.create_task(batcher.submit([f"{n}.{j}" for j in range(size)])))
            await asyncio.sleep(0)  # each is queued before the next: a known arrival order
        return await asyncio.gather(*tasks)

    asyncio.run(_with_batcher(model, work, max_batch_rows=5, max_wait_s=0.05))
    assert [[t.split(".")[0] for t in batch] for batch in model.batches] == [
        ["0"] * 3,  # 3 + 3 > 5: the second request starts the next batch
        ["1"] * 3,
        ["2"] * 8,  # larger than a batch: alone, never split
        ["3"],
    ]


def test_a_failing_predict_fails_the_callers_of_that_batch_only():
    model = RecordingModel(delay_s=0.0, fail_on="boom")

    async def work(batcher):
        bad = batcher.submit(["fine", "boom"])
        result = await asyncio.gather(bad, return_exceptions=True)
        later = await batcher.submit(["after"])
        return result[0], later

    (error, later), batcher = asyncio.run(_with_batcher(model, work, max_wait_s=0.0))
    assert isinstance(error, RuntimeError) and "boom" in str(error)
    assert later.predictions == ["AFTER"]
    assert batcher.stats.failed_batches == 1 and batcher.stats.batches == 1


def test_stopping_answers_what_was_submitted_and_refuses_what_comes_after():
    model = RecordingModel(delay_s=0.2)

    async def scenario():
        batcher = MicroBatcher(model, max_batch_rows=1, max_wait_s=0.0)
        await batcher.start()
        first = asyncio.create_task(batcher.submit(["first"]))
        queued = asyncio.create_task(batcher.submit(["second"]))
        await asyncio.sleep(0.05)  # "first" is in predict, "second" queued behind it
        await batcher.stop()
        with pytest.raises(BatcherStopped, match="shutting down"):
            await batcher.submit(["late"])
        return await first, await queued

    first, queued = asyncio.run(scenario())
    assert (first.predictions, queued.predictions) == (["FIRST"], ["SECOND"])


def test_what_is_still_unanswered_when_the_stop_times_out_fails_with_a_retry_hint():
    model = RecordingModel(delay_s=0.3)

    async def scenario():
        batcher = MicroBatcher(model, max_batch_rows=1, max_wait_s=0.0)
        await batcher.start()
        tasks = [asyncio.create_task(batcher.submit([name])) for name in ("first", "second")]
        await asyncio.sleep(0.05)
        await batcher.stop(timeout_s=0.0)
        return await asyncio.gather(*tasks, return_exceptions=True)

    for outcome in asyncio.run(scenario()):
        assert isinstance(outcome, BatcherStopped) and "send it again" in str(outcome)


def test_a_batch_is_predicted_in_groups_of_similar_length_and_answered_in_input_order():
    short, medium, long_ = "s" * 40, "m" * 300, "l" * 5000
    texts = [long_, short, medium, short + "!", "m" * 500, long_ + "?"]
    # Under 256 characters all count as 256: the short ones and the 300/500 ones go together.
    assert length_groups(texts, max_length_ratio=2.0) == [[1, 3, 2, 4], [0, 5]]
    assert length_groups(texts, max_length_ratio=1.0) == [[1, 3], [2], [4], [0], [5]]
    model = RecordingModel(delay_s=0.0)
    scored = predict_in_length_groups(model, texts, max_length_ratio=2.0)
    assert scored.predictions == [t.upper() for t in texts]
    assert [len(batch) for batch in model.batches] == [4, 2]
    together = predict_in_length_groups(model, [short, medium], 2.0)
    assert together.predictions == [short.upper(), medium.upper()]
    assert len(model.batches) == 3  # one group: one call


def test_an_idle_runner_waits_only_for_as_many_requests_as_recent_batches_held():
    model = RecordingModel(delay_s=0.0)

    async def work(batcher):
        began = time.perf_counter()
        await batcher.submit(["alone"])  # no history: nobody to wait for
        lone = time.perf_counter() - began
        await asyncio.gather(*(batcher.submit([f"burst {i}"]) for i in range(4)))  # queued together

        async def staggered(i: int):
            await asyncio.sleep(0.03 * i)
            return await batcher.submit([f"in step {i}"])

        began = time.perf_counter()
        await asyncio.gather(*(staggered(i) for i in range(4)))
        return lone, time.perf_counter() - began

    (lone, in_step), _ = asyncio.run(_with_batcher(model, work, max_batch_rows=64, max_wait_s=1.0))
    assert lone < 0.5, "a lone request waited for company"
    assert [len(b) for b in model.batches] == [1, 4, 4]  # the staggered four: one batch, as the burst
    assert in_step < 0.9, "the batch waited out max_wait_s after its 4th request arrived"


def test_a_full_queue_refuses_the_next_request_at_once_and_answers_those_it_holds():
    gate, entered = threading.Event(), threading.Event()

    def blocked(texts: list[str]) -> Scored:
        entered.set()
        assert gate.wait(10), "the test never opened the gate"
        return Scored("m", "7", [t.upper() for t in texts], [0.5] * len(texts))

    async def scenario():
        batcher = MicroBatcher(blocked, max_batch_rows=1, max_wait_s=0.0, max_queued_requests=2)
        await batcher.start()
        try:
            first = asyncio.create_task(batcher.submit(["first"]))
            while not entered.is_set():  # "first" is being predicted: out of the queue
                await asyncio.sleep(0.005)
            held = [asyncio.create_task(batcher.submit([name])) for name in ("second", "third")]
            await asyncio.sleep(0.02)
            assert batcher.queued_requests == 2
            began = time.perf_counter()
            with pytest.raises(QueueFull) as refused:
                await batcher.submit(["fourth"])
            waited = time.perf_counter() - began
            assert batcher.queued_requests == 2  # the refused one never entered the queue
            gate.set()
            answers = await asyncio.gather(first, *held)
            after = await batcher.submit(["fifth"])  # room again once the queue drained
            return refused.value, waited, answers, after, batcher.stats
        finally:
            gate.set()
            await batcher.stop()

    refused, waited, answers, after, stats = asyncio.run(scenario())
    assert waited < 0.5, "a full queue made the refused request wait"
    assert (refused.waiting, refused.limit) == (2, 2) and refused.retry_after_s >= 1
    assert "2 requests are waiting" in str(refused)
    assert [a.predictions for a in answers] == [["FIRST"], ["SECOND"], ["THIRD"]]
    assert after.predictions == ["FIFTH"]
    assert stats.rejected_requests == 1 and stats.requests == 4
    assert stats.to_summary()["rejected_requests"] == 1


def test_the_retry_hint_is_the_time_the_waiting_batches_take_at_the_recent_pace():
    gate = threading.Event()
    calls: list[list[str]] = []

    def paced(texts: list[str]) -> Scored:
        calls.append(texts)
        if len(calls) == 1:
            time.sleep(0.4)  # the pace: 0.4 s a batch
        else:
            assert gate.wait(10), "the test never opened the gate"
        return Scored("m", "7", list(texts), [0.5] * len(texts))

    async def scenario():
        batcher = MicroBatcher(paced, max_batch_rows=2, max_wait_s=0.0, max_queued_requests=8)
        await batcher.start()
        try:
            assert batcher.retry_after_s() == 1  # nothing predicted yet: no pace to go by
            await batcher.submit(["a", "b"])  # one batch, two texts per request
            busy = asyncio.create_task(batcher.submit(["c", "d"]))  # held in predict by the gate
            await asyncio.sleep(0.05)
            waiting = [asyncio.create_task(batcher.submit([f"{i}a", f"{i}b"])) for i in range(5)]
            await asyncio.sleep(0.02)
            hint = batcher.retry_after_s()
            gate.set()
            await asyncio.gather(busy, *waiting)
            return hint
        finally:
            gate.set()
            await batcher.stop()

    # 5 waiting requests of 2 texts: 5 batches of 2, plus the one being predicted, at about 0.4 s
    # each: 2.4 s, rounded up (a slower clock on a busy machine: 4).
    assert asyncio.run(scenario()) in (3, 4)


def test_with_two_workers_two_batches_are_predicted_at_once_and_each_caller_gets_its_rows():
    both_in, release = threading.Barrier(2, timeout=10), threading.Event()
    batches: list[list[str]] = []

    def model(texts: list[str]) -> Scored:
        batches.append(list(texts))
        if len(batches) <= 2:
            both_in.wait()  # the first two batches meet here: they run at the same time
        release.wait(10)
        return Scored("m", "7", [t.upper() for t in texts], [0.5] * len(texts))

    async def scenario():
        batcher = MicroBatcher(model, max_batch_rows=2, max_wait_s=0.0, workers=2)
        await batcher.start()
        try:
            tasks = [asyncio.create_task(batcher.submit([f"r{i}"])) for i in range(6)]
            while len(batches) < 2:
                await asyncio.sleep(0.005)
            await asyncio.sleep(0.05)
            assert len(batches) == 2, "a third batch started while both workers were busy"
            release.set()
            return await asyncio.gather(*tasks)
        finally:
            release.set()
            await batcher.stop()

    answers = asyncio.run(scenario())
    assert [a.predictions for a in answers] == [[f"R{i}"] for i in range(6)]
    assert sorted(t for b in batches for t in b) == [f"r{i}" for i in range(6)]
    assert all(len(b) <= 2 for b in batches)

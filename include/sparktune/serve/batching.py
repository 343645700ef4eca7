"""Micro-batching: texts of requests that arrive together go to the model in one predict call.

Each predict call pays a fixed cost (a DataFrame, MLflow's input checks, tokenizing, the Python
dispatch of every layer), which for a small model is most of the call: answering concurrent
requests one by one spends the model's time on it again and again. Requests wait in an asyncio
queue; one runner takes the first, then whatever else arrives, up to ``max_batch_rows`` texts, and
predicts them in ONE call on a worker thread, so the event loop keeps reading requests meanwhile
(and those form the next batch: under load batches grow by themselves). An idle runner waits at
most ``max_wait_s`` for company, and only for as many requests as recent batches held: a lone
client never waits, and clients in step are batched as soon as the last of them arrives. Each
caller gets its own slice of the answers back through a future.

By default one batch is predicted at a time: the model's own threads (torch intra-op) use the
cores, and a second concurrent call would only compete with them for the cores (and for the GIL).
With ``workers`` > 1, up to that many batches are predicted at once, each on its own thread: the
way to use several cores when the model runs one torch thread per call (``OMP_NUM_THREADS=1``), as
long as its work is matrix work that releases the GIL. A batch is collected only once a worker is
free, so requests that arrive meanwhile still wait together for the next batch.

The queue is bounded (``max_queued_requests``): when that many requests already wait for a batch,
:meth:`MicroBatcher.submit` refuses the next one at once with :class:`QueueFull`, which carries how
long the waiting requests should take to be answered (the server's ``Retry-After``). Past the
model's rate, waiting longer only makes every answer later; a client told to come back can go to
another replica or back off, and the server's memory and latency stay bounded.

A model that pads a batch to its longest text pays for the padding: one pasted 5,000-character log
among seven short messages made the project's label pyfunc take 2.7 s instead of 0.26 s for the
same eight texts apart. :func:`predict_in_length_groups` therefore splits a batch into groups of
similar length (longest at most ``max_length_ratio`` times the shortest) and predicts each group
in its own call, with the same model.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from sparktune.serve.champion import Scored


@dataclass
class BatchStats:
    """What the runner did since it started: batches (one ``predict`` each) and the texts and
    requests they answered."""

    batches: int = 0
    rows: int = 0
    requests: int = 0
    largest_batch_rows: int = 0
    failed_batches: int = 0
    # Refused with QueueFull: the queue held max_queued_requests already.
    rejected_requests: int = 0

    def to_summary(self) -> dict[str, float]:
        return {
            "batches": self.batches,
            "rows": self.rows,
            "requests": self.requests,
            "largest_batch_rows": self.largest_batch_rows,
            "failed_batches": self.failed_batches,
            "rejected_requests": self.rejected_requests,
            "mean_batch_rows": round(self.rows / self.batches, 2) if self.batches else 0.0,
        }


@dataclass
class _Pending:
    texts: Sequence[str]
    answer: asyncio.Future[Scored] = field(repr=False)


# How many recent batches tell how many requests arrive together.
RECENT_BATCHES = 8
# Texts shorter than this count as this long when lengths are compared: padding short texts is cheap.
SHORT_TEXT_CHARS = 256


def length_groups(texts: Sequence[str], max_length_ratio: float) -> list[list[int]]:
    """Indices of ``texts`` in groups of similar length, shortest first: within a group the longest
    text has at most ``max_length_ratio`` times the characters of the shortest (both counted as
    at least :data:`SHORT_TEXT_CHARS`)."""
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    groups: list[list[int]] = []
    floor = 0.0
    for i in order:
        length = max(len(texts[i]), SHORT_TEXT_CHARS)
        if not groups or length > floor * max_length_ratio:
            groups.append([])
            floor = length
        groups[-1].append(i)
    return groups


def predict_in_length_groups(
    predict: Callable[[list[str]], Scored], texts: list[str], max_length_ratio: float
) -> Scored:
    """``predict`` once per :func:`length_groups` group, the answers put back in input order.

    ``predict`` is one model's (a bound method): every group of a batch gets the same version.
    """
    groups = length_groups(texts, max_length_ratio)
    if len(groups) == 1:
        return predict(texts)
    predictions: list[str] = [""] * len(texts)
    scores: list[float] = [0.0] * len(texts)
    scored = None
    for group in groups:
        scored = predict([texts[i] for i in group])
        for i, prediction, score in zip(group, scored.predictions, scored.scores, strict=True):
            predictions[i], scores[i] = prediction, score
    assert scored is not None
    return Scored(scored.model_name, scored.model_version, predictions, scores)


class BatcherStopped(RuntimeError):
    """The server is shutting down and no longer predicts."""


class QueueFull(RuntimeError):
    """``limit`` requests already wait for a batch: this one was refused without waiting.

    ``retry_after_s`` is how long those waiting should take to be answered (whole seconds, at least
    1), from the recent batches' predict time.
    """

    def __init__(self, waiting: int, limit: int, retry_after_s: int) -> None:
        super().__init__(f"{waiting} requests are waiting for the model, the most the queue holds ({limit})")
        self.waiting, self.limit, self.retry_after_s = waiting, limit, retry_after_s


class MicroBatcher:
    """Groups :meth:`submit` calls into ``predict`` calls of at most ``max_batch_rows`` texts.

    ``predict`` runs on one worker thread and answers a batch in input order (a :class:`Scored`).
    """

    def __init__(
        self,
        predict: Callable[[list[str]], Scored],
        *,
        max_batch_rows: int = 64,
        max_wait_s: float = 0.003,
        max_queued_requests: int = 256,
        workers: int = 1,
    ) -> None:
        if max_queued_requests < 1 or workers < 1:
            raise ValueError(
                f"max_queued_requests and workers must be >= 1, got {max_queued_requests}, {workers}"
            )
        self._predict = predict
        self.max_batch_rows = max_batch_rows
        self.max_wait_s = max_wait_s
        self.max_queued_requests = max_queued_requests
        self.workers = workers
        self.stats = BatchStats()
        self._queue: asyncio.Queue[_Pending] | None = None
        self._runner: asyncio.Task[None] | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._free_workers: asyncio.Semaphore | None = None
        self._held: _Pending | None = None  # took it from the queue, but it did not fit the last batch
        self._batch: list[_Pending] = []  # being collected
        self._predicting: list[list[_Pending]] = []  # batches on a worker
        self._tasks: set[asyncio.Task[None]] = set()
        self._accepting = False
        self._recent_batch_requests: deque[int] = deque(maxlen=RECENT_BATCHES)
        self._recent_batch_seconds: deque[float] = deque(maxlen=RECENT_BATCHES)

    async def start(self) -> None:
        self._queue = asyncio.Queue(maxsize=self.max_queued_requests)
        self._executor = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="sparktune-predict")
        self._free_workers = asyncio.Semaphore(self.workers)
        self._runner = asyncio.create_task(self._run(), name="sparktune-micro-batcher")
        self._accepting = True

    async def stop(self, timeout_s: float = 30.0) -> None:
        """Refuse new work, answer what was already submitted (for up to ``timeout_s``), then stop;
        whatever is still unanswered then fails with :class:`BatcherStopped`."""
        self._accepting = False
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self._has_work() and loop.time() < deadline:
            await asyncio.sleep(0.005)
        if self._runner is not None:
            self._runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._runner
            self._runner = None
        for task in list(self._tasks):
            task.cancel()
        waiting = [*self._batch, *(p for batch in self._predicting for p in batch)]
        waiting += [self._held] if self._held else []
        self._batch, self._predicting, self._held = [], [], None
        while self._queue is not None and not self._queue.empty():
            waiting.append(self._queue.get_nowait())
        for pending in waiting:
            if not pending.answer.done():
                pending.answer.set_exception(BatcherStopped("the server is shutting down; send it again"))
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    def _has_work(self) -> bool:
        queued = self._queue is not None and not self._queue.empty()
        running = self._runner is not None and not self._runner.done()
        return running and bool(self._batch or self._predicting or self._held or queued)

    async def submit(self, texts: Sequence[str]) -> Scored:
        """Answers for ``texts`` (in order), from whichever batch they were predicted in."""
        if not self._accepting or self._queue is None or self._runner is None or self._runner.done():
            raise BatcherStopped("the server is not accepting predictions (starting or shutting down)")
        pending = _Pending(texts, asyncio.get_running_loop().create_future())
        try:
            self._queue.put_nowait(pending)
        except asyncio.QueueFull:
            self.stats.rejected_requests += 1
            raise QueueFull(self._queue.qsize(), self.max_queued_requests, self.retry_after_s()) from None
        return await pending.answer

    @property
    def queued_requests(self) -> int:
        """Requests waiting for a batch (not those in the batch being collected or predicted)."""
        return self._queue.qsize() if self._queue is not None else 0

    def retry_after_s(self) -> int:
        """Whole seconds (at least 1) the waiting requests should take: the batches they make, plus
        the one being predicted, over the workers, at the recent batches' mean predict time."""
        if not self._recent_batch_seconds:
            return 1
        per_batch = sum(self._recent_batch_seconds) / len(self._recent_batch_seconds)
        rows_per_request = self.stats.rows / self.stats.requests if self.stats.requests else 1.0
        batches = math.ceil(self.queued_requests * rows_per_request / self.max_batch_rows) + 1
        return max(1, math.ceil(math.ceil(batches / self.workers) * per_batch))

    async def _run(self) -> None:
        """Collect a batch once a worker is free, hand it to the worker, collect the next."""
        assert self._queue is not None and self._free_workers is not None
        loop = asyncio.get_running_loop()
        while True:
            await self._free_workers.acquire()
            try:
                batch = await self._collect(loop)
            except BaseException:
                self._free_workers.release()
                raise
            batch = [p for p in batch if not p.answer.done()]  # callers that went away
            self._batch = []
            if not batch:
                self._free_workers.release()
                continue
            self._predicting.append(batch)
            task = asyncio.create_task(self._predict_batch(loop, batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _predict_batch(self, loop: asyncio.AbstractEventLoop, batch: list[_Pending]) -> None:
        """One ``predict`` call on a worker thread; each caller gets its slice of the answers."""
        assert self._free_workers is not None
        try:
            texts = [text for pending in batch for text in pending.texts]
            began = loop.time()
            try:
                scored = await loop.run_in_executor(self._executor, self._predict, texts)
            except Exception as exc:
                self.stats.failed_batches += 1
                for pending in batch:
                    if not pending.answer.done():
                        pending.answer.set_exception(exc)
                return
            self._recent_batch_seconds.append(loop.time() - began)
            self._record(len(texts), len(batch))
            start = 0
            for pending in batch:
                end = start + len(pending.texts)
                if not pending.answer.done():
                    pending.answer.set_result(
                        Scored(
                            scored.model_name,
                            scored.model_version,
                            scored.predictions[start:end],
                            scored.scores[start:end],
                        )
                    )
                start = end
        finally:
            with contextlib.suppress(ValueError):  # stop() may have let go of it already
                self._predicting.remove(batch)
            self._free_workers.release()

    async def _collect(self, loop: asyncio.AbstractEventLoop) -> list[_Pending]:
        """The next batch: the first request, then others until the batch is full or the wait is over."""
        assert self._queue is not None
        # Requests that queued up while the model was busy already arrived together: waiting for
        # more would only delay them. An idle runner waits for about as many requests as recent
        # batches held (at most max_wait_s), so that 8 clients in step are batched as soon as the
        # 8th arrives instead of when the wait is over.
        idle = self._held is None and self._queue.empty()
        expected = max(self._recent_batch_requests, default=1)
        first = self._held or await self._queue.get()
        self._held = None
        batch, rows = [first], len(first.texts)
        self._batch = batch  # stop() sees it while the batch fills
        deadline = loop.time() + (self.max_wait_s if idle else 0.0)
        while rows < self.max_batch_rows:
            try:
                if self._queue.empty():
                    if len(batch) >= expected:
                        break
                    remaining = deadline - loop.time()
                    if remaining <= 0:
                        break
                    pending = await asyncio.wait_for(self._queue.get(), remaining)
                else:
                    pending = self._queue.get_nowait()
            except TimeoutError:
                break
            if rows + len(pending.texts) > self.max_batch_rows:
                self._held = pending  # first in the next batch: arrival order is kept
                break
            batch.append(pending)
            rows += len(pending.texts)
        self._recent_batch_requests.append(len(batch))
        return batch

    def _record(self, rows: int, requests: int) -> None:
        self.stats.batches += 1
        self.stats.rows += rows
        self.stats.requests += requests
        self.stats.largest_batch_rows = max(self.stats.largest_batch_rows, rows)

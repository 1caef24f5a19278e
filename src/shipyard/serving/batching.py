"""Runners: how a worker calls a model. Direct, or with dynamic batching.

``DirectRunner`` calls the model inline on the worker's event-loop thread when its calls
are quick: per request, handing the call to a model thread cost more than it saved (two
thread wake-ups per request, and the loop and the model thread trading the GIL: see
BENCHMARKS.md). A call of unknown cost (the first of a signature) or one that last took
longer than ``INLINE_MAX_SECONDS`` goes to a model thread instead, so a slow model
never holds the loop: /ping and requests for other models are answered meanwhile. For a
call that long, the hop's cost is noise.

``BatchingRunner`` merges requests that arrive together (same model, signature, per-row
shapes and dtypes) into one call of at most ``max_batch_size`` rows, made the same way
(inline when quick). A model thread for every call was tried first (to overlap parsing
with computing) and measured slower: the loop and the model thread traded the GIL on
every call, and a thread that needs the GIL while the other runs Python waits out the
5 ms switch interval (1 worker at concurrency 8: ~7100 req/s with the thread, ~8400
inline; BENCHMARKS.md). A worker is one Python thread that parses, calls and answers;
more cores are used by more workers.

When the model is idle the batcher waits at most ``max_wait`` for company, and only when
company is likely: other requests are on their way (being read or parsed by this worker:
``active`` counts them), or the previous batch of this kind had more rows than are
queued now. The second rule is what makes a saturated worker batch well: at
concurrency 8 the next eight requests arrive one by one as their clients read the
previous answers, and without it the first arrivals went alone. It corrects itself: a
batch that waited and found fewer rows sets the next expectation, so after load drops
one request pays at most ``max_wait`` and lone requests then pay none. If a merged call
fails, its requests are retried one by one so an error reaches only the request that
caused it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from shipyard.serving.prometheus import metrics
from shipyard.serving.servables import Servable

Arrays = dict[str, np.ndarray]
log = logging.getLogger("shipyard.serving")


_prometheus = metrics()
INLINE_MAX_SECONDS = 0.02  # calls known to be quicker than this run on the event loop


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class DirectRunner:
    def __init__(self) -> None:
        self._last: dict[tuple[int, str], float] = {}  # seconds the last call took
        self._thread: ThreadPoolExecutor | None = None

    async def run(self, servable: Servable, signature: str, inputs: Arrays) -> Arrays:
        return await self._model(servable, signature, inputs)

    async def _model(self, servable: Servable, signature: str, inputs: Arrays) -> Arrays:
        """``servable.run``: inline when this signature's last call was quick, else (or
        the first time) on the model thread, timed either way."""
        key = (id(servable), signature)
        _prometheus.batch(_rows(inputs))
        last = self._last.get(key)
        if last is not None and last <= INLINE_MAX_SECONDS:
            return _timed(servable.run, signature, inputs, self._last, key)
        if self._thread is None:
            self._thread = ThreadPoolExecutor(1, thread_name_prefix="model")
        return await asyncio.get_running_loop().run_in_executor(
            self._thread, _timed, servable.run, signature, inputs, self._last, key
        )


def _rows(inputs: Arrays) -> int:
    """Rows of one model call (1 for scalars and empty inputs)."""
    for value in inputs.values():
        return int(value.shape[0]) if getattr(value, "ndim", 0) else 1
    return 1


def _timed(
    fn: Callable[[str, Arrays], Arrays],
    signature: str,
    inputs: Arrays,
    record: dict[tuple[int, str], float],
    key: tuple[int, str],
) -> Arrays:
    """``fn(signature, inputs)``, its duration recorded in ``record[key]`` (on the model
    thread: the call's own time, not the wait for the thread)."""
    start = time.perf_counter()
    try:
        return fn(signature, inputs)
    finally:
        record[key] = time.perf_counter() - start


@dataclass
class _Item:
    inputs: Arrays
    rows: int
    future: asyncio.Future[Arrays]


@dataclass
class _Queue:
    items: list[_Item] = field(default_factory=list)
    rows: int = 0
    waiter: asyncio.Future[None] | None = None  # the drain, waiting for company
    task: asyncio.Task[None] | None = None


class BatchingRunner(DirectRunner):
    def __init__(self, max_batch_size: int, max_wait: float) -> None:
        super().__init__()
        self.max_batch_size = max(1, max_batch_size)
        self.max_wait = max(0.0, max_wait)
        self.queues: dict[tuple[Any, ...], _Queue] = {}
        self.calls = 0  # model calls made
        self.in_call = 0  # requests whose batch is being computed (on the model thread)
        self.active: Callable[[], int] = lambda: 0  # requests inside the worker's handlers
        self._expected: dict[tuple[Any, ...], int] = {}  # rows of the last batch, per key

    def _company_coming(self, key: tuple[Any, ...], queue: _Queue) -> bool:
        if queue.rows < self._expected.get(key, 0):
            return True
        queued = sum(len(q.items) for q in self.queues.values())
        return self.active() - queued - self.in_call > 0

    async def run(self, servable: Servable, signature: str, inputs: Arrays) -> Arrays:
        if len(inputs) == 1:  # the usual request, keyed as below without the set and sort
            ((name, a),) = inputs.items()
            if not a.ndim:
                return await super().run(servable, signature, inputs)
            n = a.shape[0]
            key: tuple[Any, ...] = (id(servable), signature, (name, a.shape[1:], a.dtype.str))
        else:
            rows = {a.shape[0] if a.ndim else -1 for a in inputs.values()}
            if len(rows) != 1 or -1 in rows:
                return await super().run(servable, signature, inputs)
            (n,) = rows
            key = (id(servable), signature) + tuple(
                (k, a.shape[1:], a.dtype.str) for k, a in sorted(inputs.items())
            )
        queue = self.queues.setdefault(key, _Queue())
        future: asyncio.Future[Arrays] = asyncio.get_running_loop().create_future()
        queue.items.append(_Item(inputs, n, future))
        queue.rows += n
        waiter = queue.waiter  # woken only once the batch is full or no one else is coming
        if (
            waiter is not None
            and not waiter.done()
            and (queue.rows >= self.max_batch_size or not self._company_coming(key, queue))
        ):
            waiter.set_result(None)
        if queue.task is None:
            queue.task = asyncio.create_task(self._drain(key, queue, servable, signature))
        return await future

    async def _drain(
        self, key: tuple[Any, ...], queue: _Queue, servable: Servable, signature: str
    ) -> None:
        try:
            loop = asyncio.get_running_loop()
            while queue.items:
                if (
                    self.max_wait > 0
                    and queue.rows < self.max_batch_size
                    and self._company_coming(key, queue)
                ):
                    # one future and one timer per wait; an arrival wakes the drain only
                    # when it completes the batch or no one else is expected
                    queue.waiter = waiter = loop.create_future()
                    timer = loop.call_later(self.max_wait, _wake, waiter)
                    try:
                        await waiter
                    finally:
                        timer.cancel()
                        queue.waiter = None
                batch: list[_Item] = []
                rows = 0
                while queue.items and (
                    not batch or rows + queue.items[0].rows <= self.max_batch_size
                ):
                    item = queue.items.pop(0)
                    batch.append(item)
                    rows += item.rows
                queue.rows -= rows
                self._expected[key] = rows
                self.in_call += len(batch)
                try:
                    await self._call(servable, signature, batch, rows)
                finally:
                    self.in_call -= len(batch)
        except BaseException as exc:
            for item in queue.items:
                if not item.future.done():
                    item.future.set_exception(exc)
            queue.items.clear()
            raise
        finally:
            queue.task = None
            if self.queues.get(key) is queue:
                del self.queues[key]

    async def _call(
        self, servable: Servable, signature: str, batch: list[_Item], rows: int
    ) -> None:
        if len(batch) > 1:
            merged = {k: np.concatenate([it.inputs[k] for it in batch]) for k in batch[0].inputs}
            self.calls += 1
            try:
                out = await self._model(servable, signature, merged)
                if all(v.ndim and v.shape[0] == rows for v in out.values()):
                    start = 0
                    for it in batch:
                        if not it.future.done():
                            it.future.set_result(
                                {k: v[start : start + it.rows] for k, v in out.items()}
                            )
                        start += it.rows
                    return
            except Exception as exc:  # noqa: BLE001 - retried singly: errors find their owner
                log.debug(
                    "merged call of %d requests failed (%s); retrying singly", len(batch), exc
                )
        for it in batch:
            self.calls += 1
            try:
                result = await self._model(servable, signature, it.inputs)
            except Exception as exc:  # noqa: BLE001
                if not it.future.done():
                    it.future.set_exception(exc)
            else:
                if not it.future.done():
                    it.future.set_result(result)

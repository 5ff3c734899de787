"""The online batcher: decoded clips from concurrent requests -> budgeted batches -> one model thread.

Requests call :meth:`Batcher.classify` with a decoded clip and await its
probabilities.  One asyncio task keeps the queue: each time a clip
arrives, a batch finishes or the oldest clip's ``max_delay`` runs out, it
asks :func:`specstore.serving.policy.ready_batches` which batches to close, and runs
the first (oldest) of them, as the policy planned it, on the model's own thread
through :meth:`specstore.serving.model.Classifier.run`, the Engine loop ``make infer``
uses (OOM split and retry, windows for clips too long for any batch).  While a
batch runs, the event loop keeps taking uploads and decoders keep
working, so the next batch is chosen from whatever queued meanwhile.

A clip's answer does not depend on its batch-mates (the model masks
padding; tested), and a batch that fails answers only its own clips with
the error.  A clip whose request gave up (timeout, disconnect) before its
batch closed leaves the queue and costs nothing.

The task is supervised: a failure outside a batch's own error handling
(a bug in the queue's bookkeeping, say) is logged, every clip waiting or
running is answered with a :class:`BatchError` at once, later clips are
refused at once, and :attr:`Batcher.failure` says why (``/health`` turns
unhealthy) instead of requests waiting out their timeout on a dead queue.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import functools
import itertools
import logging
import time
from dataclasses import dataclass

import numpy as np

from specstore.infer.batching.budget import Budget

from .errors import BatchError
from .metrics import Metrics
from .model import Classifier, ClipResults
from .policy import BatchPolicy, Closed, Waiting, ready_batches

__all__ = ["Batcher", "BatchError"]

log = logging.getLogger(__name__)


@dataclass
class _Entry:
    waiting: Waiting
    features: np.ndarray
    future: asyncio.Future[np.ndarray]


class Batcher:
    """Queue, policy and model thread; see the module docstring.  Create and use it inside one event loop."""

    def __init__(self, classifier: Classifier, policy: BatchPolicy | None = None,
                 metrics: Metrics | None = None) -> None:
        self.classifier = classifier
        self.policy = policy or BatchPolicy()
        self.metrics = metrics or Metrics()
        self._keys = itertools.count()
        self._waiting: dict[int, _Entry] = {}
        self._running: list[_Entry] = []  # the batch on the model thread now
        self.failure: str | None = None  # why the queue's task stopped, when it failed
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._thread = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix="specstore-model")

    @property
    def waiting(self) -> int:
        """Clips waiting for a batch."""
        return len(self._waiting)

    async def start(self) -> None:
        """Start the queue's task (on the running loop)."""
        if self._task is None:
            self._wake = asyncio.Event()
            self.failure = None
            self._task = asyncio.create_task(self._supervised(), name="specstore-batcher")

    async def stop(self) -> None:
        """Stop the task; clips still waiting get an error; the model thread is joined off the event loop."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        running, self._running = self._running, []
        self._fail_waiting(BatchError("the server is shutting down"), running)
        await asyncio.to_thread(self._thread.shutdown, wait=True)

    def _fail_waiting(self, err: BatchError, entries: list[_Entry] | None = None) -> None:
        """Answer every waiting clip (and ``entries``) with ``err`` and empty the queue."""
        for e in [*self._waiting.values(), *(entries or [])]:
            if not e.future.done():
                e.future.set_exception(err)
        self._waiting.clear()
        self.metrics.waiting.set(0)

    async def _supervised(self) -> None:
        """Run the queue until cancelled; a failure is logged and answers every clip in the queue at once."""
        try:
            while True:
                await self._step()
        except Exception as e:
            log.exception("the batcher stopped")
            self.failure = f"the batcher stopped: {type(e).__name__}: {e}".splitlines()[0]
            running, self._running = self._running, []
            self._fail_waiting(BatchError(self.failure), running)

    async def classify(self, features: np.ndarray) -> np.ndarray:
        """Queue one clip ``(n_bins, n_frames)`` float32 and return its class probabilities when its batch ran."""
        if self.failure is not None:
            raise BatchError(self.failure)
        if self._task is None or self._wake is None:
            raise BatchError("the batcher is not running")
        loop = asyncio.get_running_loop()
        key = next(self._keys)
        entry = _Entry(Waiting(key, int(features.shape[1]), time.monotonic()), features, loop.create_future())
        self._waiting[key] = entry
        self.metrics.waiting.set(len(self._waiting))
        self._wake.set()
        try:
            return await entry.future
        finally:
            if self._waiting.pop(key, None) is not None:  # gave up before its batch closed
                self.metrics.waiting.set(len(self._waiting))

    async def _step(self) -> None:
        """Wait for a clip, a batch's end or the oldest clip's deadline; run the first batch ready, if any."""
        assert self._wake is not None
        self._wake.clear()
        if not self._waiting:
            await self._wake.wait()
            return
        try:
            budget = self.classifier.current_budget()
            now = time.monotonic()
            groups = ready_batches([e.waiting for e in self._waiting.values()], budget, self.policy, now,
                                   batch_overhead_frames=self.classifier.batch_overhead_frames)
        except Exception as e:  # never leave requests hanging on a dead queue
            log.exception("planning the waiting clips failed")
            self._fail_waiting(BatchError(f"the batcher failed: {type(e).__name__}: {e}".splitlines()[0]))
            return
        if not groups:
            oldest = min(e.waiting.since for e in self._waiting.values())
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=max(oldest + self.policy.max_delay - now, 1e-3))
            except TimeoutError:
                pass
            return
        self._running = [self._waiting.pop(k) for k in groups[0].keys]
        self.metrics.waiting.set(len(self._waiting))
        await self._run(self._running, groups[0], budget)
        self._running = []

    async def _run(self, entries: list[_Entry], closed: Closed, budget: Budget) -> None:
        """Run one closed batch on the model thread, as the policy planned it, and answer its clips."""
        clips = [e.features for e in entries]
        run = functools.partial(self.classifier.run, clips, plan=closed.plan,
                                constraint=self.policy.constraint(budget), budget=budget)
        t0 = time.perf_counter()
        try:
            res: ClipResults = await asyncio.get_running_loop().run_in_executor(self._thread, run)
        except Exception as e:  # the model failed: answer this batch's clips, keep serving
            log.exception("a batch of %d clips failed", len(clips))
            err = BatchError(f"the model failed on this clip's batch: {type(e).__name__}: {e}".splitlines()[0])
            for entry in entries:
                if not entry.future.done():
                    entry.future.set_exception(err)
            return
        self.metrics.add_batch(len(clips), res.run.real_frames, res.run.computed_frames, res.run.oom_retries,
                               res.run.windowed, time.perf_counter() - t0)
        for entry, probs in zip(entries, res.probs, strict=True):
            if not entry.future.done():
                entry.future.set_result(probs)

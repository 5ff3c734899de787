"""The server's decode worker processes: started warm, replaced when one dies, shut down off the event loop.

Workers are spawned, not forked: the server has torch's threads running,
which a fork would copy half-started.  Each worker's decoder messages on
stderr (libmpg123's) come to a :class:`specstore.pipeline.decoder_log.DecoderLogListener`:
logged under ``specstore.decoder`` and counted through ``on_warning``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import functools
import logging
import multiprocessing
from collections.abc import Callable
from concurrent.futures.process import BrokenProcessPool
from typing import TypeVar

from specstore.pipeline.decoder_log import DecoderLogListener, log_summary

from .clips import warm_up
from .errors import ClipError, ServerFault

__all__ = ["DecodePool"]

log = logging.getLogger(__name__)

T = TypeVar("T")


class DecodePool:
    """``workers`` decode processes; :meth:`run` sends them a job.  Start and stop it inside one event loop.

    ``workers`` may change between starts (the service's config setter sets it).  A job sent while the pool
    is not running fails with :class:`~specstore.serving.errors.ServerFault` (the server's side, not the file's).
    """

    def __init__(self, workers: int, on_warning: Callable[[str], None]) -> None:
        self.workers = workers
        self.decoder_log = DecoderLogListener(on_warning)
        self._pool: cf.ProcessPoolExecutor | None = None

    @property
    def running(self) -> bool:
        return self._pool is not None

    def _new_pool(self) -> cf.ProcessPoolExecutor:
        return cf.ProcessPoolExecutor(max_workers=self.workers, mp_context=multiprocessing.get_context("spawn"),
                                      **self.decoder_log.pool_options())

    async def start(self) -> None:
        """Start the workers and wait until each has imported the audio stack (its first job is then quick)."""
        self._pool = pool = self._new_pool()
        loop = asyncio.get_running_loop()
        await asyncio.gather(*(loop.run_in_executor(pool, warm_up) for _ in range(self.workers)))

    async def stop(self) -> None:
        """Stop the workers (jobs not started are cancelled) and log the decoders' summary, off the event loop."""
        pool, self._pool = self._pool, None
        if pool is not None:
            await asyncio.to_thread(functools.partial(pool.shutdown, wait=True, cancel_futures=True))
        log_summary(await asyncio.to_thread(self.decoder_log.close), "since the server started")

    async def run(self, job: Callable[[], T]) -> T:
        """``job()`` in a worker; a crashed worker's pool is replaced and the job tried once more.

        A second crash is the file's fault: :class:`~specstore.serving.clips.ClipError`.  A job whose caller has gone
        is cancelled if it has not started, and its result dropped if it has (a decode cannot be stopped).
        """
        loop = asyncio.get_running_loop()
        for attempt in range(2):
            pool = self._pool
            if pool is None:
                raise ServerFault("the server is not running")
            try:
                return await loop.run_in_executor(pool, job)
            except BrokenProcessPool:
                log.warning("a decode worker died; starting a new pool")
                if self._pool is pool:
                    self._pool = self._new_pool()
                    pool.shutdown(wait=False, cancel_futures=True)
                if attempt:
                    raise ClipError("the decoder crashed on this file") from None
        raise AssertionError("unreachable")

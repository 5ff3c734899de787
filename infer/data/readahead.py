"""The loader the built-in commands use: :func:`prefetch`, a reader thread collating batches ahead of the model.

One thread rather than DataLoader worker processes: reads from a store's
mmap views release the GIL in their copies, and ``make bench`` measures
the thread faster on a 2-core machine (docs/benchmarks.md).  It has the
same iteration contract as a ``DataLoader``.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import torch

from specstore.infer.data.collate import Batch

__all__ = ["prefetch"]

_DONE = object()


def prefetch(dataset: Any, batches: Iterable[Sequence[int]] | Iterable[np.ndarray], collate_fn: Any, *,
             ahead: int = 2, pin: bool = False) -> Iterator[Batch]:
    """Yield ``collate_fn([dataset[i] for i in batch])`` for each batch, read ``ahead`` batches early.

    One reader thread (reads from mmap views release the GIL in their
    copies); errors in it are re-raised here; closing the generator stops it.
    ``pin``: pin each batch's memory for asynchronous copies to CUDA.
    """
    q: queue.Queue[Any] = queue.Queue(maxsize=max(1, ahead))
    stop = threading.Event()

    def put(item: Any) -> None:
        """Hand ``item`` over; give up once the consumer has gone (a blocking put would hang the close)."""
        while not stop.is_set():
            try:
                q.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def produce() -> None:
        try:
            for ids in batches:
                if stop.is_set():
                    return
                batch = collate_fn([dataset[int(i)] for i in ids])
                if pin and torch.cuda.is_available():
                    batch = batch.pin_memory()
                put(batch)
        except BaseException as e:  # handed to the consumer
            put(e)
            return
        put(_DONE)

    thread = threading.Thread(target=produce, name="specstore-prefetch", daemon=True)
    thread.start()
    try:
        while True:
            item = q.get()
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        thread.join(timeout=5)

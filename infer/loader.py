"""Feeding batches from the store to the model: a background thread reads and collates ahead.

Features come from the store's reader (zero-copy mmap views for local raw
stores); a producer thread gathers each planned batch into a padded tensor
(pinned on CUDA) while the model runs the previous one.  Holding at most
``prefetch`` batches bounds memory; raw audio is never involved.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from store import FeatureView

from .collate import Batch, collate

__all__ = ["prefetch_batches"]

_DONE = object()


def prefetch_batches(
    view: FeatureView,
    batches: Sequence[np.ndarray],
    *,
    multiple_of: int = 1,
    pin: bool = False,
    prefetch: int = 2,
    rows: np.ndarray | None = None,
) -> Iterator[Batch]:
    """Yield a collated :class:`Batch` per id array in ``batches``, read ``prefetch`` ahead.

    ``rows`` maps batch ids to store rows (default: ids are rows).  Errors in
    the reader thread are re-raised in the consumer.  Stopping early (closing
    the generator) stops the thread.
    """
    q: queue.Queue[Any] = queue.Queue(maxsize=max(1, prefetch))
    stop = threading.Event()

    def produce() -> None:
        try:
            for ids in batches:
                if stop.is_set():
                    return
                store_rows = ids if rows is None else rows[ids]
                arrays = [view[int(r)] for r in store_rows]
                batch = collate(arrays, multiple_of=multiple_of, pin=pin, ids=ids)
                while not stop.is_set():
                    try:
                        q.put(batch, timeout=0.1)
                        break
                    except queue.Full:
                        continue
        except BaseException as e:  # handed to the consumer
            q.put(e)
            return
        q.put(_DONE)

    thread = threading.Thread(target=produce, name="specstore-loader", daemon=True)
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


def to_device(batch: Batch, device: torch.device) -> Batch:
    """Move a batch, asynchronously when its memory is pinned."""
    if device.type == "cpu":
        return batch
    return batch.to(device, non_blocking=True)

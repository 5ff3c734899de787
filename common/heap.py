"""How the process's C heap treats large freed blocks: kept for reuse, up to the limits glibc itself adapts to.

glibc serves a request above ``M_MMAP_THRESHOLD`` with a fresh ``mmap`` and
unmaps it when it is freed, and hands the top of the heap back to the system
once more than ``M_TRIM_THRESHOLD`` of it is free.  Both start at 128 KiB
and glibc raises them by itself as large blocks are freed, up to 32 MiB and
64 MiB; but a process whose largest recurring block is a few MiB (an
extraction worker: a minute of decoded audio is 5 MiB, an FFT batch 1 MiB)
stays near its own block size, and its loop page-faults every block in
again.  Measured on one core (docs/features.md): an extraction run in a new
process spent a third of its CPU time in the kernel doing so, and ran 17%
faster with :func:`keep_freed_blocks`.

:func:`keep_freed_blocks` sets both thresholds to that ceiling
(:data:`KEPT_THRESHOLDS`: 32 MiB each) for the rest of the process: values
glibc's own adjustment reaches or passes in any process that frees a 32 MiB
block, so nothing is kept that a long-lived process would not keep anyway.  Setting them
explicitly ends glibc's adjustment, which is why it is not undone (setting
the 128 KiB values again would leave the process slower than it found it).
CPU training raises them much further for its steps
(``specstore.infer.train.prepare.keep_freed_memory``) and comes back to this ceiling
when it ends.  Where the C library is not glibc the functions do nothing and
say so (False).
"""

from __future__ import annotations

import ctypes
import functools
import sys
from typing import Any

__all__ = ["KEPT_THRESHOLDS", "keep_freed_blocks", "set_malloc_thresholds"]

#: ``(M_MMAP_THRESHOLD, M_TRIM_THRESHOLD)`` in bytes: the highest mmap threshold glibc's dynamic adjustment
#: sets (``DEFAULT_MMAP_THRESHOLD_MAX`` on 64-bit systems; it would set the trim threshold to twice that).
#: Measured on extraction: a 16 MiB trim threshold kept none of the gain, 32 MiB, 64 MiB and 1 GiB all of it;
#: the lowest of those keeps the least freed memory resident.
KEPT_THRESHOLDS = (32 << 20, 32 << 20)


def set_malloc_thresholds(mmap_bytes: int, trim_bytes: int, *, trim: bool = False) -> bool:
    """Set glibc's ``M_MMAP_THRESHOLD`` and ``M_TRIM_THRESHOLD`` (bytes), then ``malloc_trim(0)`` if ``trim``.

    False where the C library is not glibc (nothing is changed there).
    """
    libc = _libc()
    if libc is None:
        return False
    try:
        m_trim_threshold, m_mmap_threshold = -1, -3
        ok = bool(libc.mallopt(m_mmap_threshold, mmap_bytes)) and bool(libc.mallopt(m_trim_threshold, trim_bytes))
        if trim:
            libc.malloc_trim(0)
        return ok
    except AttributeError:
        return False


@functools.cache
def _libc() -> Any:
    """glibc, loaded once (every decoded file sets the thresholds); None where it is not the C library."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def keep_freed_blocks() -> bool:
    """Keep freed blocks up to 32 MiB, and up to 32 MiB of free heap top, for reuse (:data:`KEPT_THRESHOLDS`).

    For the rest of the process (see the module docstring for why it is not undone).  Called where a loop of
    multi-MiB allocations begins: every file :func:`specstore.pipeline.features.compute_features` decodes (an extraction
    task's, ``specstore classify``'s and the server's).  Two ``mallopt`` calls; idempotent.
    """
    return set_malloc_thresholds(*KEPT_THRESHOLDS)

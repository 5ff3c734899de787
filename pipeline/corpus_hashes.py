"""Fingerprints of a whole corpus, taken on the driver's threads before any decoding
(:mod:`specstore.pipeline.hashing`)."""

from __future__ import annotations

import functools
import os
import stat
from concurrent.futures import ThreadPoolExecutor

from tqdm.auto import tqdm

from .corpus import CorpusItem
from .errors import SourceChanged
from .hashing import Fingerprint, fingerprint

__all__ = ["HASH_BATCH", "hash_batch", "hash_files"]

#: Files hashed per thread call (amortises dispatch; hashing one file is ~ms).
HASH_BATCH = 64


def hash_batch(sources: list[str], algorithm: str) -> list[tuple[Fingerprint | None, str | None]]:
    """``(fingerprint, None)`` or ``(None, reason)`` for each source file (``algorithm``: the store's content hash)."""
    out: list[tuple[Fingerprint | None, str | None]] = []
    for src in sources:
        try:
            if os.path.islink(src) and not os.path.exists(src):
                out.append((None, "broken symlink"))
                continue
            st = os.stat(src)
            if not stat.S_ISREG(st.st_mode):
                out.append((None, "not a regular file"))
            elif st.st_size == 0:
                out.append((None, "empty file"))
            else:
                out.append((fingerprint(src, algorithm=algorithm), None))
        except SourceChanged as e:
            out.append((None, e.strerror or "changed while being read"))
        except PermissionError:
            out.append((None, "unreadable: permission denied"))
        except FileNotFoundError:
            out.append((None, "file not found (removed while the corpus was scanned)"))
        except OSError as e:
            out.append((None, f"unreadable: {e.strerror or e}"))
    return out


def hash_files(items: list[CorpusItem], progress: bool,
                algorithm: str) -> tuple[dict[str, Fingerprint], dict[str, str]]:
    """Fingerprint every file on local threads (hashlib releases the GIL on large buffers) with ``algorithm``,
    the store's content hash.

    Hashing is I/O-bound and happens where the driver runs, whatever the
    extraction backend, so it needs no worker processes.
    """
    threads = min(8, os.cpu_count() or 1)
    # At most HASH_BATCH files per call, and never fewer calls than threads: a corpus of under
    # HASH_BATCH files would otherwise be hashed on one thread while the others (and the
    # workers, which wait for the hashes) sit idle.
    size = max(1, min(HASH_BATCH, -(-len(items) // threads)))
    batches = [items[i:i + size] for i in range(0, len(items), size)]
    fps: dict[str, Fingerprint] = {}
    errors: dict[str, str] = {}
    with ThreadPoolExecutor(max_workers=threads) as pool, \
            tqdm(total=len(items), unit="file", desc="hashing", disable=not progress, leave=False) as bar:
        results = pool.map(functools.partial(hash_batch, algorithm=algorithm),
                           ([str(it.source) for it in b] for b in batches))
        for batch, res in zip(batches, results, strict=False):
            for it, (fp, reason) in zip(batch, res, strict=False):
                if fp is not None:
                    fps[it.path] = fp
                else:
                    errors[it.path] = reason or "unreadable"
            bar.update(len(batch))
    return fps, errors

"""Removing what a killed run left behind: joblib/loky files in ``/dev/shm``, and a store's unfinished shards.

A run stopped with ``kill -9`` cannot clean up after itself: joblib's
memmapping folders (``joblib_memmapping_folder_<pid>_...``) and loky's
named semaphores (``sem.loky-<pid>-...``) stay in ``/dev/shm`` (or the temp
folder) until reboot.  Each name carries the pid of the process that made
it; the next run removes those whose process is gone.

What makes this safe: only names of those two exact forms, only ones owned
by this user, only when no process with that pid exists on this machine
and the entry has not been touched for :data:`MIN_AGE_SECONDS`.  (A process
in another pid namespace sharing ``/dev/shm``, such as another container,
could look dead from here; the age rule keeps its fresh files.)

A store's shards that were written but never committed are removed by
:func:`remove_interrupted_shards` before a run decodes anything: the store's
own orphan cleanup (:meth:`specstore.store.StoreWriter.remove_orphans`), plus the
shard folders an interrupt left before their ``zarr.json`` was written (or
after an abort removed it).  zarr warns about each such folder when it lists
the shards ("not recognized as a component of a Zarr hierarchy"), so a
resumed ``make features`` printed a library warning; here they go first.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from specstore.store.layout import SHARDS_GROUP

if TYPE_CHECKING:
    from specstore.store import StoreWriter

__all__ = ["MIN_AGE_SECONDS", "clean_stale_worker_files", "remove_interrupted_shards"]

log = logging.getLogger(__name__)

#: Entries younger than this are never removed.
MIN_AGE_SECONDS = 600.0

_NAMES = (re.compile(r"^joblib_memmapping_folder_(\d+)_[0-9a-f]+_[0-9a-f]+$"),
          re.compile(r"^sem\.loky-(\d+)-[A-Za-z0-9_]+$"))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean_stale_worker_files(folders: list[Path] | None = None, *, min_age: float = MIN_AGE_SECONDS) -> list[Path]:
    """Remove joblib/loky leftovers of dead processes from ``folders`` (default /dev/shm and the temp folder).

    Returns what was removed.  Never raises: a folder that cannot be listed
    or an entry that cannot be removed is skipped.
    """
    if folders is None:
        folders = [Path("/dev/shm"), Path(tempfile.gettempdir())]
    removed: list[Path] = []
    now = time.time()
    uid = os.getuid()
    for folder in folders:
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            m = next((m for rx in _NAMES if (m := rx.match(entry.name))), None)
            if m is None:
                continue
            try:
                st = entry.stat(follow_symlinks=False)
                if st.st_uid != uid or now - st.st_mtime < min_age or _alive(int(m.group(1))):
                    continue
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path)
                else:
                    os.unlink(entry.path)
                removed.append(Path(entry.path))
            except OSError:
                continue
    if removed:
        log.info("removed %d file(s) left in %s by killed worker pools", len(removed),
                 ", ".join(sorted({str(p.parent) for p in removed})))
    return removed


def remove_interrupted_shards(writer: StoreWriter) -> list[str]:
    """Remove the uncommitted shards of the store ``writer`` holds locked; their names.

    On a local disk (a kernel lock: no other writer can be at work) a shard
    folder with no ``zarr.json`` is removed as it is found.  Then the store's
    own cleanup removes the uncommitted shards that are zarr groups.  On an
    object store (a lease) a folder without ``zarr.json`` may be another
    writer's shard being created, so it stays, and zarr's warning about it
    while the shards are listed is not shown: such a folder is never read
    (only committed shards are) and the cleanup does nothing else with it.
    """
    writer.lock.check()
    removed = []
    folder = writer.location.local / SHARDS_GROUP if writer.location.local is not None else None
    if folder is not None and writer.lock.reliable and folder.is_dir():
        committed = set(writer.metadata.commit.shards)
        for entry in sorted(folder.iterdir()):
            if entry.is_dir() and not entry.is_symlink() and entry.name not in committed \
                    and not (entry / "zarr.json").exists():
                shutil.rmtree(entry, ignore_errors=True)
                removed.append(entry.name)
        if removed:
            log.info("removed %d unfinished shard folder(s) left by an interrupted run", len(removed))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Object at .* is not recognized as a component of a Zarr "
                                                  r"hierarchy")
        return removed + writer.remove_orphans()

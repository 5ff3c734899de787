"""Removing what a killed run's worker pool left behind: joblib/loky files in ``/dev/shm``.

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
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
import time
from pathlib import Path

__all__ = ["MIN_AGE_SECONDS", "clean_stale_worker_files"]

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

"""Finding the audio of a corpus and its labels: a folder per label, or a CSV manifest.

Folder corpus: ``root/<label>/.../file.ext`` (GTZAN style); files directly in
``root`` are unlabelled.  Links to folders are followed (a link back to a
folder above it is recorded as a bad entry, never followed round).  CSV
manifest: a header ``path,label[,group]`` (other columns are ignored; a
UTF-8 byte order mark is accepted) and one row per file; relative paths are
taken relative to the CSV's folder, the label and the group (for example the
musical work, so that movements of one work stay on one side of a split) may
be empty.  Paths are recorded relative to the corpus root with ``/``
separators, so a store does not depend on where the corpus was mounted, and
escaped losslessly where a file name is not UTF-8 (:func:`specstore.store.escape_path`).

Links never lead out of the corpus root unless asked (``follow_links``): a
link to a file or folder whose real path is outside the root (the folder, or
the manifest's folder) is recorded as a bad entry with its reason
(:func:`outside_root`), so a downloaded corpus cannot pull other audio of the
machine into a store.  Links that stay inside the root are followed.  A
manifest row that names a path outside its folder outright (absolute, or
with ``..``) is read as written: the manifest names it in plain text.

Groups of a folder corpus (``group_by``, the ``--group-by`` option): a
folder has no ``group`` column, so without ``group_by`` its files have no
group and a train/validation split keys them by content (the stems of one
song can then land on both sides).  ``group_by="parent"`` gives each file
the path of its folder below the label folder (``rock/album/cd1/t.wav``:
``album/cd1``; the label is left out, so the stems of one song filed under
several labels, ``drums/song1/`` and ``bass/song1/``, form one group); a
file directly in a label folder, or in the root, gets none.  Any other value
is a regular expression (Python ``re``) searched in the stored path relative
to the corpus root: the group is its first capture group, or the whole match
when it has none; a file it does not match (or whose capture is empty) gets
none.  A file without a group is split by its content, as before; how many
files got none is logged once.  A manifest names its groups in its
``group`` column and refuses ``group_by``.
"""

from __future__ import annotations

import csv
import dataclasses
import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from specstore.common import ConfigError
from specstore.store import escape_path

from .audio_types import AV_EXTENSIONS, SOUNDFILE_EXTENSIONS
from .errors import CorpusError

__all__ = ["AUDIO_EXTENSIONS", "GROUP_BY_PARENT", "CorpusError", "CorpusItem", "group_rule", "outside_root",
           "scan_corpus"]

log = logging.getLogger(__name__)

#: File extensions treated as audio (case-insensitive): soundfile's and the optional PyAV backend's
#: (:mod:`specstore.pipeline.audio_types`).  The latter are searched even without PyAV installed, so such files are
#: recorded as bad files naming the extra to install, never skipped in silence.
AUDIO_EXTENSIONS = SOUNDFILE_EXTENSIONS | AV_EXTENSIONS
#: The ``group_by`` keyword for "the file's folder below its label folder" (anything else is a regex).
GROUP_BY_PARENT = "parent"


@dataclass(frozen=True)
class CorpusItem:
    """One file to index: where it is on disk, how the store names it, its label (None = none) and group.

    ``problem`` is a reason found while scanning (a folder link that loops, a
    link out of the corpus root): such an item is recorded in the store's
    error table, never decoded.
    """

    source: Path
    path: str
    label: str | None
    group: str = ""
    problem: str | None = None


def _is_audio(name: str) -> bool:
    return os.path.splitext(name)[1].lower() in AUDIO_EXTENSIONS


def _inside(path: str, real_root: str) -> bool:
    return path == real_root or path.startswith(real_root.rstrip(os.sep) + os.sep)


def outside_root(path: str | os.PathLike[str], root: str | os.PathLike[str]) -> str | None:
    """Why ``path``, found in the folder ``root``, may not be read as part of it: it leads outside through a link.

    Returns a one-line reason when the real path of ``path`` (every link
    resolved, a broken link's target included) is not ``root``'s real path
    or below it, else None.  This is the corpus rule that ``follow_links``
    lifts; a folder search elsewhere (``specstore classify``) can apply the
    same rule to what it finds.
    """
    real_root = os.path.realpath(root)
    target = os.path.realpath(path)
    if _inside(target, real_root):
        return None
    kind = "folder" if os.path.isdir(target) else "file"
    return f"link to a {kind} outside the corpus ({target}): not followed without --follow-links"


def _scan_folder(root: Path, follow_links: bool) -> list[CorpusItem]:
    """Every audio file under ``root``, following links to folders but never round a loop.

    Links whose target is outside ``root`` are recorded as problems unless
    ``follow_links``.
    """
    items: list[CorpusItem] = []

    def rel_of(p: Path) -> str:
        return escape_path(p.relative_to(root).as_posix())

    def walk(folder: Path, ancestors: frozenset[tuple[int, int]]) -> None:
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError as e:
            if folder != root:
                items.append(CorpusItem(folder, rel_of(folder), None, problem=f"unreadable folder: {e.strerror or e}"))
            return
        for entry in entries:
            if entry.name.startswith("."):
                continue
            full = Path(folder, entry.name)
            try:
                is_dir = entry.is_dir(follow_symlinks=True)
            except OSError:
                is_dir = False
            if not follow_links and (is_dir or _is_audio(entry.name)) and entry.is_symlink():
                escape = outside_root(full, root)
                if escape:
                    items.append(CorpusItem(full, rel_of(full), None, problem=escape))
                    continue
            if is_dir:
                st = full.stat()
                key = (st.st_dev, st.st_ino)
                if key in ancestors:
                    items.append(CorpusItem(full, rel_of(full), None,
                                            problem="folder link loop: links to a folder above it (not followed)"))
                    continue
                walk(full, ancestors | {key})
            elif _is_audio(entry.name):
                rel = rel_of(full)
                parts = rel.split("/")
                items.append(CorpusItem(full, rel, parts[0] if len(parts) > 1 else None))

    st = root.stat()
    walk(root, frozenset({(st.st_dev, st.st_ino)}))
    return items


def _parent_group(path: str) -> str:
    """``label/a/b/file.wav`` -> ``a/b``: the file's folder below its label folder ("" directly in one)."""
    parts = path.split("/")
    return "/".join(parts[1:-1])


def group_rule(group_by: str) -> Callable[[str], str]:
    """The function giving a folder corpus's stored path (relative to its root) its group ("" = none).

    ``group_by`` is :data:`GROUP_BY_PARENT` or a regular expression (see
    the module docstring).  Raises :class:`~specstore.common.ConfigError`, one line,
    for an empty value or a regular expression that does not compile.
    """
    if not group_by:
        raise ConfigError("--group-by needs a value: parent, or a regular expression over the path")
    if group_by == GROUP_BY_PARENT:
        return _parent_group
    try:
        pattern = re.compile(group_by)
    except re.error as e:
        raise ConfigError(f"--group-by {group_by!r} is not a valid regular expression: {e}") from None

    def by_regex(path: str) -> str:
        m = pattern.search(path)
        if m is None:
            return ""
        return (m.group(1) if pattern.groups else m.group(0)) or ""

    return by_regex


def _grouped(items: list[CorpusItem], group_by: str, rule: Callable[[str], str]) -> list[CorpusItem]:
    """``items`` with the groups ``rule`` gives them; logs once how many got none (they split by content)."""
    out = [dataclasses.replace(it, group=rule(it.path)) if it.problem is None else it for it in items]
    none = [it.path for it in out if it.problem is None and not it.group]
    if none:
        why = "directly in a label folder (or the root)" if group_by == GROUP_BY_PARENT else "not matched"
        log.warning("--group-by %s gives no group to %d of %d files, %s (first: %s): each is split by its "
                    "content", group_by, len(none), len(out), why, none[0])
    return out


_SEPARATORS = {";": "semicolon", "\t": "tab", "|": "pipe"}


def _scan_manifest(csv_path: Path, follow_links: bool) -> tuple[Path, list[CorpusItem]]:
    """The rows of a manifest; a row inside the CSV's folder whose link leads out of it is a problem item."""
    root = csv_path.parent
    items: list[CorpusItem] = []
    try:
        with open(csv_path, newline="", encoding="utf-8-sig") as f:  # -sig: a byte order mark is accepted
            reader = csv.DictReader(f)
            if reader.fieldnames is None or "path" not in [n.strip() for n in reader.fieldnames]:
                header = ",".join(reader.fieldnames or [])
                for sep, name in _SEPARATORS.items():
                    if sep in header and "path" in header.split(sep):
                        raise CorpusError(f"{csv_path}: the manifest is separated by '{sep}' ({name}); "
                                          "specstore reads comma-separated path,label[,group]")
                raise CorpusError(f"{csv_path}: a manifest needs a header with a 'path' column "
                                  "(and optional 'label' and 'group')")
            reader.fieldnames = [n.strip() for n in reader.fieldnames]
            seen: set[str] = set()
            for line, row in enumerate(reader, start=2):
                raw = (row.get("path") or "").strip()
                if not raw:
                    raise CorpusError(f"{csv_path}:{line}: empty path")
                p = Path(raw).expanduser()
                full = p if p.is_absolute() else root / p
                try:
                    rel = full.relative_to(root).as_posix()
                except ValueError:
                    rel = full.as_posix()
                if rel in seen:
                    raise CorpusError(f"{csv_path}:{line}: {raw} is listed twice")
                seen.add(rel)
                label = (row.get("label") or "").strip() or None
                group = (row.get("group") or "").strip()
                escape = None
                if not follow_links and _inside(os.path.normpath(full), os.path.normpath(root)):
                    escape = outside_root(full, root)
                items.append(CorpusItem(full, escape_path(rel), label, group, problem=escape))
    except UnicodeDecodeError:
        raise CorpusError(f"{csv_path}: the manifest is not UTF-8 text") from None
    except csv.Error as e:
        raise CorpusError(f"{csv_path}: unreadable CSV ({e})") from None
    return root, items


def scan_corpus(corpus: str | os.PathLike[str], *, follow_links: bool = False,
                group_by: str | None = None) -> tuple[Path, list[CorpusItem]]:
    """The corpus root and its audio files, sorted by stored path.

    Raises :class:`CorpusError` when the corpus does not exist or holds no
    audio.  Broken links and unreadable files are *listed* (they become error
    rows of the store, with their reason), not skipped; so are links whose
    target is outside the root, unless ``follow_links`` (then followed).
    ``group_by`` groups a folder corpus's files (see the module docstring);
    a bad regular expression is a :class:`~specstore.common.ConfigError` and a manifest
    a :class:`CorpusError` (it has its own ``group`` column), both raised
    before the corpus is read.
    """
    rule = None if group_by is None else group_rule(group_by)
    p = Path(corpus).expanduser()
    if not p.exists():
        raise CorpusError(f"corpus {corpus} does not exist")
    if p.is_file():
        if p.suffix.lower() != ".csv":
            raise CorpusError(f"corpus {corpus} is a file but not a .csv manifest")
        if rule is not None:
            raise CorpusError(f"--group-by is for folder corpora; the manifest {corpus} names each file's group "
                              "in its 'group' column (header path,label,group)")
        root, items = _scan_manifest(p.absolute(), follow_links)
    else:
        root, items = p.absolute(), _scan_folder(p.absolute(), follow_links)
    if not items:
        raise CorpusError(f"corpus {corpus} holds no audio files ({', '.join(sorted(AUDIO_EXTENSIONS))})")
    items = sorted(items, key=lambda it: it.path)
    if rule is not None and group_by is not None:
        items = _grouped(items, group_by, rule)
    return root, items

"""Finding the audio of a corpus and its labels: a folder per label, or a CSV manifest.

Folder corpus: ``root/<label>/.../file.ext`` (GTZAN style); files directly in
``root`` are unlabelled.  CSV manifest: a header ``path,label`` and one row
per file; relative paths are taken relative to the CSV's folder and the label
may be empty.  Paths are recorded relative to the corpus root with ``/``
separators, so a store does not depend on where the corpus was mounted.
"""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass
from pathlib import Path

from store import SpecstoreError

__all__ = ["AUDIO_EXTENSIONS", "CorpusError", "CorpusItem", "scan_corpus"]

#: File extensions treated as audio (case-insensitive).
AUDIO_EXTENSIONS = frozenset({".wav", ".flac", ".ogg", ".opus", ".mp3"})


class CorpusError(SpecstoreError):
    """The corpus itself is unusable (missing, empty, malformed manifest); one-line message."""


@dataclass(frozen=True)
class CorpusItem:
    """One file to index: where it is on disk, how the store names it, its label (None = none)."""

    source: Path
    path: str
    label: str | None


def _is_audio(name: str) -> bool:
    return os.path.splitext(name)[1].lower() in AUDIO_EXTENSIONS


def _scan_folder(root: Path) -> list[CorpusItem]:
    items: list[CorpusItem] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            if name.startswith(".") or not _is_audio(name):
                continue
            full = Path(dirpath, name)
            rel = full.relative_to(root).as_posix()
            parts = rel.split("/")
            items.append(CorpusItem(full, rel, parts[0] if len(parts) > 1 else None))
    return items


def _scan_manifest(csv_path: Path) -> tuple[Path, list[CorpusItem]]:
    root = csv_path.parent
    items: list[CorpusItem] = []
    try:
        with open(csv_path, newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            if reader.fieldnames is None or "path" not in reader.fieldnames:
                raise CorpusError(f"{csv_path}: a manifest needs a header with a 'path' column (and optional 'label')")
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
                items.append(CorpusItem(full, rel, label))
    except UnicodeDecodeError:
        raise CorpusError(f"{csv_path}: the manifest is not UTF-8 text") from None
    except csv.Error as e:
        raise CorpusError(f"{csv_path}: unreadable CSV ({e})") from None
    return root, items


def scan_corpus(corpus: str | os.PathLike[str]) -> tuple[Path, list[CorpusItem]]:
    """The corpus root and its audio files, sorted by stored path.

    Raises :class:`CorpusError` when the corpus does not exist or holds no
    audio.  Broken links and unreadable files are *listed* (they become error
    rows of the store, with their reason), not skipped.
    """
    p = Path(corpus).expanduser()
    if not p.exists():
        raise CorpusError(f"corpus {corpus} does not exist")
    if p.is_file():
        if p.suffix.lower() != ".csv":
            raise CorpusError(f"corpus {corpus} is a file but not a .csv manifest")
        root, items = _scan_manifest(p.absolute())
    else:
        root, items = p.absolute(), _scan_folder(p.absolute())
    if not items:
        raise CorpusError(f"corpus {corpus} holds no audio files ({', '.join(sorted(AUDIO_EXTENSIONS))})")
    return root, sorted(items, key=lambda it: it.path)

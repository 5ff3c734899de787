"""Harder corpora cut from a rendered one, without rendering again: fewer works, and a SoundFont shift.

Both write ``path,label,group`` manifests (absolute paths) that
``specstore.pipeline.extract`` reads, next to the corpus's own ``train.csv`` and
``test.csv``:

* :func:`few_works`: the training works of each class, whole, in a seeded
  order, until the class has at least ``per_class`` clips (e.g. 30: about ten
  works of three clips each); the test set is the corpus's own.  What a user
  with a few dozen labelled tracks per genre has.
* :func:`soundfont_shift`: training clips rendered with some SoundFonts,
  test clips (other works, as always) rendered with the others: the same
  music through other instruments, as when a model meets another label's
  recordings.
"""

from __future__ import annotations

import csv
import zlib
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path

from .errors import RealCorpusError

__all__ = ["few_works", "soundfont_shift"]


def _read(path: Path) -> list[dict[str, str]]:
    try:
        with open(path, newline="", encoding="utf-8") as f:
            return list(csv.DictReader(f))
    except OSError as e:
        raise RealCorpusError(f"cannot read {path}: {e.strerror or e} (render the corpus first: make realcorpus)"
                              ) from None


def _write(path: Path, rows: Iterable[dict[str, str]], root: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["path", "label", "group"])
        for r in rows:
            w.writerow([str((root / r["path"]).resolve()), r["label"], r["group"]])
    return path


def few_works(corpus: str | Path, out_dir: str | Path, *, per_class: int = 30, seed: int = 0) -> tuple[Path, Path]:
    """``(train.csv, test.csv)`` in ``out_dir``: whole training works until each class has ``per_class`` clips."""
    root = Path(corpus)
    by_class: dict[str, dict[str, list[dict[str, str]]]] = defaultdict(lambda: defaultdict(list))
    for r in _read(root / "train.csv"):
        by_class[r["label"]][r["group"]].append(r)
    chosen: list[dict[str, str]] = []
    for label in sorted(by_class):
        works = by_class[label]
        n = 0
        for group in sorted(works, key=lambda g: (zlib.crc32(f"{seed}:{g}".encode()), g)):
            if n >= per_class:
                break
            chosen += works[group]
            n += len(works[group])
    out = Path(out_dir)
    return _write(out / "train.csv", chosen, root), _write(out / "test.csv", _read(root / "test.csv"), root)


def soundfont_shift(corpus: str | Path, out_dir: str | Path, *,
                    train_fonts: Sequence[str] = ("fluidr3", "musescore")) -> tuple[Path, Path]:
    """``(train.csv, test.csv)`` in ``out_dir``: training clips of ``train_fonts``, test clips of the others."""
    root = Path(corpus)
    font = {r["path"]: r["soundfont"] for r in _read(root / "clips.csv")}
    fonts = set(train_fonts)
    unknown = fonts - set(font.values())
    if unknown:
        raise RealCorpusError(f"no clip of {root} is rendered with {', '.join(sorted(unknown))}; it has "
                              f"{', '.join(sorted(set(font.values())))}")
    out = Path(out_dir)
    train = [r for r in _read(root / "train.csv") if font[r["path"]] in fonts]
    test = [r for r in _read(root / "test.csv") if font[r["path"]] not in fonts]
    return _write(out / "train.csv", train, root), _write(out / "test.csv", test, root)

"""The music21 works behind each style class: pieces (score files), works (the unit of the split), and one
lister per class that names them from music21's corpus folder.

Cheap and pure: files are listed by name (and, for Humdrum and ABC files, by
reading a few header lines), nothing is parsed.  :mod:`specstore.realcorpus.catalogue`
chooses among them and plans the clips.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["SOURCES", "Piece", "Work"]


@dataclass(frozen=True)
class Piece:
    """One score: ``source`` is relative to music21's corpus folder; ``number`` picks a tune of an ABC file."""

    id: str
    source: str
    number: int | None = None
    excerpts: int = 1
    """How many excerpts to take (spread over the piece)."""
    tactus: float | None = None
    """Beat length in quarter notes overriding the time signature's (renaissance 4/4: a half note)."""


@dataclass(frozen=True)
class Work:
    """The unit of the split: a class, a group id and its pieces."""

    label: str
    group: str
    pieces: tuple[Piece, ...]
    size: int
    """Bytes of its score files (the tiny corpus takes the smallest works)."""


def _slug(text: str) -> str:
    s = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return s or "x"


def _files(root: Path, folder: str, pattern: str) -> list[Path]:
    return sorted((root / folder).glob(pattern))


def _rel(root: Path, p: Path) -> str:
    return p.relative_to(root).as_posix()


def _abc_numbers(path: Path) -> list[int]:
    numbers = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            m = re.match(r"^X:\s*(\d+)", line)
            if m:
                numbers.append(int(m.group(1)))
    return sorted(set(numbers))


# Trecento pieces listed twice in the corpus (two versions of one work) share a group.
_TRECENTO_VARIANT = re.compile(r"(\d+)[ab](?=[-_ ])")


def _medieval(root: Path) -> list[Work]:
    works: dict[str, list[tuple[Piece, int]]] = {}
    paths = _files(root, "trecento", "*.xml") + [root / "ciconia/quod_jactatur.xml", root / "luca/gloria.xml"]
    for p in paths:
        if not p.exists():
            continue
        rel = _rel(root, p)
        group = f"{p.parent.name}:" + _slug(_TRECENTO_VARIANT.sub(r"\1", p.stem))
        works.setdefault(group, []).append((Piece(_slug(f"{p.parent.name}-{p.stem}"), rel), p.stat().st_size))
    return [Work("medieval", g, tuple(x for x, _ in v), sum(s for _, s in v)) for g, v in works.items()]


def _palestrina_mass(path: Path) -> str | None:
    with open(path, encoding="utf-8", errors="replace") as f:
        for _, line in zip(range(12), f, strict=False):
            if line.startswith("!!!OPR:"):
                return line.split(":", 1)[1].strip()
    return None


def _renaissance(root: Path) -> list[Work]:
    works: list[Work] = []
    masses: dict[str, list[Path]] = {}
    for p in _files(root, "palestrina", "*.krn"):
        mass = _palestrina_mass(p)
        if mass:
            masses.setdefault(mass, []).append(p)
    for mass, files in masses.items():
        # One movement per mass (the work is the unit of the split, so more adds little).
        pieces = tuple(Piece(_slug(f"palestrina-{p.stem}"), _rel(root, p), tactus=2.0) for p in files)
        works.append(Work("renaissance", "palestrina:" + _slug(mass), pieces, min(p.stat().st_size for p in files)))
    for p in _files(root, "monteverdi", "madrigal.*.mxl") + _files(root, "lusitano", "*.mxl"):
        w = _slug(f"{p.parent.name}-{p.stem}")
        works.append(
            Work(
                "renaissance",
                f"{p.parent.name}:{_slug(p.stem)}",
                (Piece(w, _rel(root, p), tactus=2.0),),
                p.stat().st_size,
            )
        )
    return works


_BWV = re.compile(r"^bwv(\d+[a-z]?)(\.\d+)?\.mxl$")


def _baroque(root: Path) -> list[Work]:
    groups: dict[str, list[Path]] = {}
    for p in _files(root, "bach", "bwv*.mxl"):
        m = _BWV.match(p.name)
        if m:  # skip the alternative versions (-a, -sc, -lz, ...)
            groups.setdefault(m.group(1), []).append(p)
    return [
        Work(
            "baroque",
            f"bach:bwv{g}",
            tuple(Piece(_slug(f"bach-{p.stem}"), _rel(root, p)) for p in files),
            min(p.stat().st_size for p in files),
        )
        for g, files in groups.items()
    ]


# Whole string quartets in one file: several excerpts each, spread over the movements.
_CLASSICAL_WHOLE = {
    "beethoven/opus18no3.mxl": 3,
    "beethoven/opus18no4.mxl": 3,
    "beethoven/opus18no5.mxl": 3,
    "beethoven/opus74.mxl": 3,
    "beethoven/opus132.mxl": 3,
    "beethoven/opus133.mxl": 2,
}


def _classical(root: Path) -> list[Work]:
    works: dict[str, list[Piece]] = {}
    sizes: dict[str, int] = {}
    for composer in ("haydn", "mozart", "beethoven"):
        for p in sorted((root / composer).rglob("*.mxl")):
            rel = _rel(root, p)
            parts = Path(rel).parts
            group = f"{composer}:{parts[1] if len(parts) > 2 else p.stem}"
            pid = _slug(rel.removesuffix(".mxl"))
            works.setdefault(group, []).append(Piece(pid, rel, excerpts=_CLASSICAL_WHOLE.get(rel, 1)))
            sizes[group] = sizes.get(group, 0) + p.stat().st_size
    return [Work("classical", g, tuple(v), sizes[g]) for g, v in works.items()]


# German-language collections of the Essen folk song database (not the Chinese, Irish or test files).
_ESSEN = (
    "altdeu10",
    "altdeu20",
    "ballad10",
    "ballad20",
    "ballad30",
    "ballad40",
    "ballad50",
    "ballad60",
    "ballad70",
    "ballad80",
    "boehme10",
    "boehme20",
    "dva0",
    "erk10",
    "erk20",
    "erk30",
    "erk5",
    "fink0",
    "kinder0",
    "lot",
    "lux",
    "zuccal0",
)


def _folksong(root: Path) -> list[Work]:
    works = []
    for name in _ESSEN:
        p = root / "essenFolksong" / f"{name}.abc"
        if not p.exists():
            continue
        per = max(1, p.stat().st_size // max(1, len(_abc_numbers(p))))
        for n in _abc_numbers(p):
            pid = _slug(f"essen-{name}-{n}")
            works.append(Work("folksong", f"essen:{name}-{n}", (Piece(pid, _rel(root, p), number=n),), per))
    return works


def _fiddle(root: Path) -> list[Work]:
    works = []
    for p in _files(root, "ryansMammoth", "*.abc"):
        works.append(
            Work(
                "fiddle",
                "ryans:" + _slug(p.stem),
                (Piece(_slug(f"ryans-{p.stem}"), _rel(root, p), number=None),),
                p.stat().st_size,
            )
        )
    for p in _files(root, "oneills1850", "*.abc"):
        per = max(1, p.stat().st_size // max(1, len(_abc_numbers(p))))
        for n in _abc_numbers(p):
            works.append(
                Work("fiddle", f"oneills:{n}", (Piece(_slug(f"oneills-{p.stem}-{n}"), _rel(root, p), number=n),), per)
            )
    # O'Neill's files overlap at their edges (0981-1000 and 0951-0981): one entry per tune number.
    seen: set[str] = set()
    out = []
    for w in works:
        if w.group not in seen:
            seen.add(w.group)
            out.append(w)
    return out


SOURCES: dict[str, Callable[[Path], list[Work]]] = {
    "medieval": _medieval,
    "renaissance": _renaissance,
    "baroque": _baroque,
    "classical": _classical,
    "folksong": _folksong,
    "fiddle": _fiddle,
}
"""Class label -> lister of its candidate works under music21's corpus folder."""

"""What the corpus holds: style classes, the choice of music21 works behind them, the split, the clips.

Everything here is cheap and pure: :mod:`specstore.realcorpus.sources` lists the music21
corpus by file name (and, for Humdrum and ABC files, by reading a few header
lines), nothing is parsed.  A *work* is the unit of the train/test split (a
mass, a cantata, a string quartet, one folk song); a *piece* is one score file
(or one tune of an ABC collection) of a work; a *clip* is one rendered excerpt
of a piece.  Every random choice is seeded from the corpus seed and the id of
the thing it is about, so a clip does not depend on which other clips exist.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path

import numpy as np

from .errors import RealCorpusError
from .sources import SOURCES, Piece, Work

__all__ = [
    "CLASSES", "SIZES", "FORMATS", "SAMPLE_RATES", "RealCorpusError", "Piece", "Work", "Clip",
    "corpus_root", "music21_version", "list_works", "plan_corpus", "rng_for",
]


CLASSES: tuple[str, ...] = ("medieval", "renaissance", "baroque", "classical", "folksong", "fiddle")
"""Style labels, in corpus order (also the folder names)."""

FORMATS: tuple[str, ...] = ("wav", "flac", "ogg", "mp3")
SAMPLE_RATES: tuple[int, ...] = (22050, 44100)


@dataclass(frozen=True)
class SizeSpec:
    """How big a corpus is: works per class, excerpt length range (s), SoundFonts allowed."""

    works: dict[str, int]
    clip_seconds: tuple[float, float]
    soundfonts: tuple[str, ...]
    smallest: bool = False
    """Take the smallest score files (fast to parse) instead of a seeded random choice."""
    train_clips: int = 1
    """Clips per training clip of the plan (>= 1): the extras come from the same work, its other movements
    first, then further excerpts at seeded points. Test works keep one, so the test set does not change
    with it."""


SIZES: dict[str, SizeSpec] = {
    # 0 = every work: medieval (102) and classical (17) use all music21 holds; 150 of the others (renaissance: 151)
    "full": SizeSpec(
        works={"medieval": 0, "renaissance": 150, "baroque": 150, "classical": 0, "folksong": 150, "fiddle": 150},
        clip_seconds=(20.0, 45.0),
        soundfonts=("csoundgm", "fluidr3", "musescore", "timgm6mb"),
        train_clips=3,
    ),
    "small": SizeSpec(
        works={"medieval": 52, "renaissance": 52, "baroque": 52, "classical": 0, "folksong": 52, "fiddle": 52},
        clip_seconds=(20.0, 60.0),
        soundfonts=("csoundgm", "fluidr3", "musescore", "timgm6mb"),
    ),
    "long": SizeSpec(
        works={"medieval": 40, "renaissance": 40, "baroque": 40, "classical": 0, "folksong": 40, "fiddle": 40},
        clip_seconds=(45.0, 150.0),
        soundfonts=("csoundgm", "fluidr3", "musescore", "timgm6mb"),
    ),
    "tiny": SizeSpec(
        works={c: 2 for c in CLASSES},
        clip_seconds=(3.0, 5.0),
        soundfonts=("csoundgm",),
        smallest=True,
        train_clips=2,
    ),
}
"""``full``: the development corpus (1850 clips, 16.6 h: 215 test clips of 202 works, one each; 1635
training clips, three from each of 517 training works; medieval and classical: every work there is).
``small``: the first development corpus (318 clips, 3.5 h), kept to reproduce the figures measured on it
(docs/model.md); the recipe scored 0.84 on its test works (e9).
``long``: few works with long clips, one clip per work (217 works, 45-150 s): the shape of a user's first
corpus of a few hundred labelled tracks, on which the recipe must still beat the simple baselines.
``tiny``: the test suite's (two clips from its training work, one from its test work, per class)."""

TEST_SHARE = 0.28
"""Share of each class's works held out for testing (rounded, at least one)."""


def rng_for(seed: int, *key: str | int) -> np.random.Generator:
    """An independent generator for (seed, key...); stable across runs, processes and machines."""
    words = [int(seed)] + [k if isinstance(k, int) else zlib.crc32(k.encode("utf-8")) for k in key]
    return np.random.default_rng(np.random.SeedSequence(words))


def _hash(seed: int, text: str) -> int:
    return zlib.crc32(f"{seed}:{text}".encode())


@lru_cache(maxsize=1)
def corpus_root() -> Path:
    """The folder of music21's bundled corpus."""
    try:
        from music21 import corpus
    except ImportError:
        raise RealCorpusError(
            "music21 is not installed: pip install 'specstore[realcorpus]' (or make realcorpus-deps)"
        ) from None
    return Path(corpus.__file__).parent


def music21_version() -> str:
    import music21

    return str(music21.__version__)


@dataclass(frozen=True)
class Clip:
    """One output file: which piece, which excerpt of how many, how it is rendered and encoded."""

    label: str
    group: str
    split: str
    piece: Piece
    excerpt: int
    relpath: str
    seconds: float
    """Target length (s); a piece shorter than that gives a shorter clip (folk tunes are repeated)."""
    ext: str
    sample_rate: int
    channels: int
    soundfont: str
    seed: int

    @property
    def id(self) -> str:
        return f"{self.piece.id}-{self.excerpt}"


# Per class, sub-collections that get a fixed share of the works (so one big source does not crowd out the rest).
_QUOTAS: dict[str, dict[str, float]] = {
    "renaissance": {"palestrina": 0.66, "monteverdi": 0.30, "lusitano": 0.04},
    "fiddle": {"ryans": 0.7, "oneills": 0.3},
}

# Pieces that music21 cannot render sensibly (no notes, unparseable): never chosen.
EXCLUDED: frozenset[str] = frozenset()


def list_works(label: str) -> list[Work]:
    """Every candidate work of a class, in a stable order."""
    if label not in SOURCES:
        raise RealCorpusError(f"unknown class {label!r}; choose from {', '.join(CLASSES)}")
    works = []
    for w in SOURCES[label](corpus_root()):
        pieces = tuple(p for p in w.pieces if p.id not in EXCLUDED)
        if pieces:
            works.append(Work(w.label, w.group, pieces, w.size))
    return sorted(works, key=lambda w: w.group)


def _choose(works: list[Work], n: int, seed: int, label: str, smallest: bool) -> list[Work]:
    if n <= 0 or n >= len(works):
        return list(works)
    if smallest:
        return sorted(works, key=lambda w: (w.size, w.group))[:n]
    quotas = _QUOTAS.get(label)
    order = sorted(works, key=lambda w: (_hash(seed, w.group), w.group))
    if not quotas:
        return order[:n]
    chosen: list[Work] = []
    for prefix, share in quotas.items():
        k = max(1, round(share * n))
        chosen += [w for w in order if w.group.split(":")[0] == prefix][:k]
    rest = [w for w in order if w not in chosen]
    return (chosen + rest)[:n]


def _split(works: list[Work], seed: int, label: str) -> dict[str, str]:
    """group -> 'train' | 'test': a seeded TEST_SHARE of the class's works, at least one each side."""
    n = len(works)
    n_test = min(n - 1, max(1, round(TEST_SHARE * n))) if n > 1 else 0
    order = sorted(works, key=lambda w: (_hash(seed + 1, w.group), w.group))
    test = {w.group for w in order[:n_test]}
    return {w.group: ("test" if w.group in test else "train") for w in works}


def _encodings(n: int, offset: int = 0) -> list[tuple[str, int, int]]:
    """``n`` (format, sample rate, channels) triples: any 16 consecutive ones hold all 16 combinations,
    and in any run the two sample rates (and the two channel counts) differ in count by at most two."""
    nf = len(FORMATS)
    return [(FORMATS[i % nf], SAMPLE_RATES[(i + i // 8) % 2], 1 + (i + i // 4) % 2) for i in range(offset, offset + n)]


def plan_corpus(
    size: str = "full", *, seed: int = 0, classes: Sequence[str] = CLASSES, train_clips: int | None = None
) -> list[Clip]:
    """Every clip of the corpus, without rendering anything (pure and cheap).

    ``train_clips`` overrides the size's clips per training clip of the plan (``SizeSpec.train_clips``);
    the test clips do not depend on it.
    """
    if size not in SIZES:
        raise RealCorpusError(f"unknown size {size!r}; choose from {', '.join(SIZES)}")
    if train_clips is not None and (isinstance(train_clips, bool) or not isinstance(train_clips, int)
                                    or train_clips < 1):
        raise RealCorpusError(f"train_clips must be a positive integer, got {train_clips!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise RealCorpusError(f"seed must be a non-negative integer, got {seed!r}")
    bad = [c for c in classes if c not in CLASSES]
    if bad or not classes:
        raise RealCorpusError(f"unknown class(es) {bad or '(none)'}; choose from {', '.join(CLASSES)}")
    spec = SIZES[size] if train_clips is None else replace(SIZES[size], train_clips=train_clips)
    lo, hi = spec.clip_seconds
    clips: list[Clip] = []
    for label in CLASSES:
        if label not in classes:
            continue
        works = _choose(list_works(label), spec.works[label], seed, label, spec.smallest)
        split = _split(works, seed, label)
        rows: list[tuple[Work, Piece, int]] = []
        extra: dict[int, list[tuple[Work, Piece, int]]] = {}
        for w in sorted(works, key=lambda w: w.group):
            if spec.smallest:
                pieces = [min(w.pieces, key=lambda p: (len(p.source), p.id))]
            elif label == "classical":  # few works: every movement
                pieces = list(w.pieces)
            else:  # one piece per work: a seeded choice among its movements / chorales
                pieces = [min(w.pieces, key=lambda p: (_hash(seed, p.id), p.id))]
            start = len(rows)
            for piece in pieces:
                n_ex = 1 if spec.smallest else piece.excerpts
                rows += [(w, piece, k) for k in range(n_ex)]
            if split[w.group] == "train" and spec.train_clips > 1:
                base = len(rows) - start
                more = _extras(w, pieces, (spec.train_clips - 1) * base, seed, others=not spec.smallest)
                for r in range(1, spec.train_clips):
                    extra.setdefault(r, []).extend(more[(r - 1) * base : r * base])
        # Encodings and SoundFonts are balanced inside the class, in a seeded order: neither predicts the label.
        # Each round of extras (the r-th extra clip of every training clip) is balanced on its own, so that
        # train_clips = n + 1 keeps every clip of train_clips = n (and so of the plan). Round 1's keys carry
        # no number (the clips rendered before there were rounds).
        Key = tuple[str | int, ...]
        parts: list[tuple[list[tuple[Work, Piece, int]], Key, Key]] = [(rows, ("encodings",), ("soundfonts",))]
        for r in sorted(extra):
            n: Key = (r,) if r > 1 else ()
            parts.append((extra[r], ("encodings-extra", *n), ("soundfonts-extra", *n)))
        for part, enc_key, font_key in parts:
            perm = rng_for(seed, *enc_key, label).permutation(len(part))
            encs = _encodings(len(part), 2 * CLASSES.index(label))  # tiny: every format in the corpus
            fonts = [spec.soundfonts[i % len(spec.soundfonts)] for i in range(len(part))]
            font_perm = rng_for(seed, *font_key, label).permutation(len(part))
            for i, (w, piece, k) in enumerate(part):
                ext, sr, ch = encs[perm[i]]
                seconds = float(np.round(rng_for(seed, "length", piece.id, k).uniform(lo, hi), 2))
                relpath = f"{label}/{piece.id}-{k}.{ext}"
                clips.append(
                    Clip(
                        label, w.group, split[w.group], piece, k, relpath, seconds, ext, sr, ch,
                        fonts[font_perm[i]], seed,
                    )
                )
    return clips


def _extras(
    work: Work, used: Sequence[Piece], n: int, seed: int, *, others: bool = True
) -> list[tuple[Work, Piece, int]]:
    """``n`` more (work, piece, excerpt) rows of a training work: its unused pieces (movements, chorales) in a
    seeded order unless ``others`` is false, then excerpt numbers past each piece's planned ones, round robin."""
    order = sorted(work.pieces, key=lambda p: (_hash(seed, p.id), p.id))
    fresh = [p for p in order if p not in used] if others else []
    out = [(work, p, 0) for p in fresh[:n]]
    pool = list(used) + fresh
    nxt = {p.id: p.excerpts for p in used}
    nxt.update({p.id: 1 for p in fresh})
    i = 0
    while len(out) < n:
        p = pool[i % len(pool)]
        out.append((work, p, nxt[p.id]))
        nxt[p.id] += 1
        i += 1
    return out


def per_class(clips: Iterable[Clip]) -> dict[str, dict[str, int]]:
    """label -> {'train': clips, 'test': clips, 'train_works': n, 'test_works': n}."""
    out: dict[str, dict[str, int]] = {}
    works: dict[tuple[str, str], set[str]] = {}
    for c in clips:
        d = out.setdefault(c.label, {"train": 0, "test": 0, "train_works": 0, "test_works": 0})
        d[c.split] += 1
        works.setdefault((c.label, c.split), set()).add(c.group)
    for (label, split), groups in works.items():
        out[label][f"{split}_works"] = len(groups)
    return out

"""``make realcorpus`` / ``specstore-realcorpus``: render the development corpus, resumably, in parallel.

Output layout (``OUT``)::

    OUT/<label>/<piece>-<k>.<ext>     the clips (one folder per label, so a folder scan works too)
    OUT/manifest.csv                  path,label,group,split (group = the work; split = train | test)
    OUT/train.csv, OUT/test.csv       path,label,group: only their rows (pipeline.extract reads them)
    OUT/clips.csv                     how each clip was made: piece, excerpt, SoundFont, ensemble, tempo...
    OUT/README.txt                    provenance: music21, FluidSynth and SoundFont versions, seed, counts
    OUT/.state/<clip>.json            a finished clip (written after its file): a rerun skips it

A clip is written to a hidden ``.part`` file and renamed, then its state file is
written, so an interrupted run (Ctrl-C, kill) loses at most the clips in flight
and the rerun renders only what is missing.  The CSVs and README are written last,
when every clip is there.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import io
import json
import logging
import os
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from specstore.common import run_cli, setup_logging
from specstore.common.limits import Limit
from specstore.common.options import bounded_argument

from .catalogue import CLASSES, SIZES, Clip, music21_version, per_class, plan_corpus, rng_for
from .errors import RealCorpusError
from .render import SOUNDFONTS, check_renderer, encode, render_clip

__all__ = ["Summary", "generate", "main"]

logger = logging.getLogger(__name__)

_NAME = re.compile(r"^[a-z0-9-]+-\d+\.(wav|flac|ogg|mp3)$")


@dataclass(frozen=True)
class Summary:
    out_dir: Path
    clips: tuple[Clip, ...]
    rendered: int
    """clips rendered by this run (the rest were already there)"""
    seconds: float
    """audio seconds in the corpus"""
    elapsed_s: float

    def report(self) -> str:
        counts = per_class(self.clips)
        rows = [f"{label:12s} train {d['train']:3d} clips / {d['train_works']:3d} works   "
                f"test {d['test']:3d} clips / {d['test_works']:3d} works" for label, d in counts.items()]
        return "\n".join([
            (f"realcorpus: {len(self.clips)} clips, {self.seconds / 3600:.2f} h of audio in {self.out_dir} "
             f"({self.rendered} rendered in {self.elapsed_s:.0f} s)"),
            *rows,
            f"manifest: {self.out_dir / 'manifest.csv'} (train.csv, test.csv beside it)",
        ])


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.part")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _state_path(out: Path, clip: Clip) -> Path:
    return out / ".state" / f"{clip.id}.json"


def _done(out: Path, clip: Clip) -> bool:
    return (out / clip.relpath).is_file() and _state_path(out, clip).is_file()


def _render_piece(clips: list[Clip], out_dir: str) -> list[tuple[str, float]]:
    """Worker: parse one piece once, render, encode and write its clips; returns (clip id, seconds)."""
    from .score import load_score

    logging.getLogger("music21").setLevel(logging.ERROR)
    out = Path(out_dir)
    first = clips[0]
    score = load_score(first.piece, first.label, rng_for(first.seed, "score", first.piece.id))
    done = []
    for clip in clips:
        audio, info = render_clip(score, clip)
        data = encode(audio, clip)
        _atomic_write(out / clip.relpath, data)
        seconds = len(audio) / clip.sample_rate
        info.update(seconds=round(seconds, 3), sha256=hashlib.sha256(data).hexdigest(), soundfont=clip.soundfont)
        _atomic_write(_state_path(out, clip), json.dumps(info, sort_keys=True).encode("utf-8"))
        done.append((clip.id, seconds))
    return done


def _check_out(out: Path, clips: list[Clip], prune: bool) -> None:
    if out.exists() and not out.is_dir():
        raise RealCorpusError(f"output path {out} exists and is not a folder")
    wanted = {out / c.relpath for c in clips}
    foreign = []
    for label in CLASSES:
        d = out / label
        if not d.is_dir():
            continue
        for p in sorted(d.iterdir()):
            if p.name.startswith(".") and p.name.endswith(".part"):
                p.unlink()  # left by an interrupted run
            elif p not in wanted:
                foreign.append(p)
    if foreign and prune:
        ours = [p for p in foreign if p.is_file() and _NAME.match(p.name)]
        for p in ours:
            p.unlink()
            (out / ".state" / (p.name.rsplit(".", 1)[0] + ".json")).unlink(missing_ok=True)
        logger.info("pruned %d clips of another plan", len(ours))
        foreign = [p for p in foreign if p not in ours]
    if foreign:
        raise RealCorpusError(f"{out} holds {len(foreign)} file(s) this corpus would not write (e.g. {foreign[0]}); "
                              "use an empty folder, or --prune to delete clips of another size or seed")


def _versions(soundfonts: Sequence[str]) -> dict[str, str]:
    v = {"music21": music21_version()}
    try:
        r = subprocess.run(["fluidsynth", "--version"], capture_output=True, text=True, check=False)
        v["fluidsynth"] = r.stdout.splitlines()[0].split()[-1]
    except (OSError, IndexError):
        v["fluidsynth"] = "?"
    for name in soundfonts:
        pkg = SOUNDFONTS[name].package
        try:
            r = subprocess.run(["dpkg-query", "-W", "-f=${Version}", pkg], capture_output=True, text=True, check=False)
            v[pkg] = r.stdout.strip() or "?"
        except OSError:
            v[pkg] = "?"
    return v


def _csv(rows: list[list[str]], header: list[str]) -> bytes:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(header)
    w.writerows(rows)
    return buf.getvalue().encode("utf-8")


_CLIPS_COLUMNS = [
    "path", "label", "group", "split", "source", "tune", "excerpt", "start_s", "seconds", "soundfont",
    "ensemble", "programs", "transpose", "cents", "qpm", "sample_rate", "channels", "format", "sha256"
]
"""The columns of ``clips.csv``: the plan's fields of a clip, then what rendering chose (from its state file)."""


def _clip_rows(clips: list[Clip], states: dict[str, Any]) -> list[list[str]]:
    """One ``clips.csv`` row per clip (in ``_CLIPS_COLUMNS`` order), from the clip and its rendering state."""
    rows = []
    for c in clips:
        s = states[c.id]
        rows.append(
            [
                c.relpath,
                c.label,
                c.group,
                c.split,
                c.piece.source,
                str(c.piece.number or ""),
                str(c.excerpt),
                f"{s['start_s']}",
                f"{s['seconds']}",
                c.soundfont,
                s["ensemble"],
                " ".join(map(str, s["programs"])),
                str(s["transpose"]),
                str(s["cents"]),
                str(s["qpm"]),
                str(c.sample_rate),
                str(c.channels),
                c.ext,
                s["sha256"],
            ]
        )
    return rows


def _write_index(out: Path, clips: list[Clip], size: str, seed: int, train_clips: int) -> float:
    clips = sorted(clips, key=lambda c: c.relpath)
    states = {c.id: json.loads(_state_path(out, c).read_text(encoding="utf-8")) for c in clips}
    _atomic_write(out / "manifest.csv", _csv([[c.relpath, c.label, c.group, c.split] for c in clips],
                                            ["path", "label", "group", "split"]))
    for split in ("train", "test"):
        _atomic_write(out / f"{split}.csv", _csv([[c.relpath, c.label, c.group] for c in clips if c.split == split],
                                                ["path", "label", "group"]))
    _atomic_write(out / "clips.csv", _csv(_clip_rows(clips, states), _CLIPS_COLUMNS))
    total = sum(states[c.id]["seconds"] for c in clips)
    fonts = sorted({c.soundfont for c in clips})
    versions = _versions(fonts)
    counts = per_class(clips)
    lines = [
        "Realistic development corpus written by `specstore-realcorpus` (python -m specstore realcorpus).",
        f"size={size} seed={seed} train_clips={train_clips} clips={len(clips)} total_seconds={total:.1f}",
        "Scores: the corpus bundled with music21 (see docs/realcorpus.md for sources and licences).",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()),
        "SoundFonts: " + ", ".join(f"{f} ({SOUNDFONTS[f].path}, {SOUNDFONTS[f].licence})" for f in fonts),
        "Per class: "
        + "; ".join(
            f"{k} train {d['train']} ({d['train_works']} works) test {d['test']} ({d['test_works']} works)"
            for k, d in counts.items()
        ),
        "manifest.csv: path,label,group,split (group = work; no work is in both splits); "
        "train.csv/test.csv: their rows.",
        "For research and development on this machine: the score encodings carry their own terms (some",
        "non-commercial); do not redistribute the audio without checking them.",
        "Regenerate with the same arguments and versions to get byte-identical files.",
    ]
    _atomic_write(out / "README.txt", ("\n".join(lines) + "\n").encode("utf-8"))
    return float(total)


def generate(
    out_dir: str | os.PathLike[str],
    *,
    size: str = "full",
    seed: int = 0,
    jobs: int | None = None,
    classes: Sequence[str] = CLASSES,
    prune: bool = False,
    progress: bool = True,
    train_clips: int | None = None,
) -> Summary:
    """Render the corpus into ``out_dir`` (resumable); returns what is there and how long this run took.

    ``train_clips`` overrides the size's clips per training clip of the plan (``plan_corpus``)."""
    t0 = time.perf_counter()
    if jobs is not None and (isinstance(jobs, bool) or jobs < 1):
        raise RealCorpusError(f"jobs must be at least 1, got {jobs}")
    clips = plan_corpus(size, seed=seed, classes=classes, train_clips=train_clips)
    check_renderer(SIZES[size].soundfonts)
    out = Path(out_dir).expanduser()
    try:
        _check_out(out, clips, prune)
        for label in dict.fromkeys(c.label for c in clips):
            (out / label).mkdir(parents=True, exist_ok=True)
        (out / ".state").mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise RealCorpusError(f"cannot write to {out}: {e}") from None
    todo = [c for c in clips if not _done(out, c)]
    by_piece: dict[str, list[Clip]] = {}
    for c in todo:
        by_piece.setdefault(c.piece.id, []).append(c)
    # Longest first: whole quartets (slow to parse, several excerpts) do not end the run alone.
    tasks = sorted(by_piece.values(), key=lambda cs: (-len(cs), -sum(c.seconds for c in cs), cs[0].id))
    n_jobs = max(1, min(jobs or os.cpu_count() or 1, len(tasks) or 1))
    logger.info(
        "%d clips planned, %d already there; rendering %d pieces with %d job(s)",
        len(clips),
        len(clips) - len(todo),
        len(tasks),
        n_jobs,
    )
    failures: list[str] = []
    bar = tqdm(total=len(todo), unit="clip", desc="realcorpus", disable=not progress or not todo)
    try:
        if n_jobs == 1:
            for t in tasks:
                try:
                    bar.update(len(_render_piece(t, str(out))))
                except RealCorpusError as e:
                    failures.append(f"{t[0].piece.id}: {e}")
        else:
            with ProcessPoolExecutor(max_workers=n_jobs) as pool:
                futures = {pool.submit(_render_piece, t, str(out)): t for t in tasks}
                try:
                    for fut in as_completed(futures):
                        try:
                            bar.update(len(fut.result()))
                        except RealCorpusError as e:
                            failures.append(f"{futures[fut][0].piece.id}: {e}")
                except BaseException:
                    pool.shutdown(wait=True, cancel_futures=True)
                    raise
    finally:
        bar.close()
    if failures:
        for f in failures:
            logger.error("%s", f)
        raise RealCorpusError(
            f"{len(failures)} piece(s) could not be rendered (first: {failures[0]}); no manifest written"
        )
    total = _write_index(out, clips, size, seed, train_clips or SIZES[size].train_clips)
    summary = Summary(out, tuple(clips), len(todo), total, time.perf_counter() - t0)
    logger.info(
        "%d clips (%.2f h) in %s; %d rendered in %.1f s", len(clips), total / 3600, out, len(todo), summary.elapsed_s
    )
    return summary


# ---- CLI --------------------------------------------------------------------------------------

EPILOG = """\
examples:
  specstore-realcorpus data/realcorpus --jobs 2        # the development corpus (about 16 min on 2 cores)
  specstore-realcorpus /tmp/rc-tiny --tiny             # 18 short clips, seconds (the test suite's)
  python -c "import specstore; print(specstore.extract('data/realcorpus/train.csv', 'data/rc-train.zarr').report())"
  make eval STORE=data/rc-test.zarr MODEL=models/rc.pt SPLIT=all BASELINES=1 BASELINE_STORE=data/rc-train.zarr

Needs fluidsynth and the SoundFont packages (make realcorpus-deps; the tiny size
only fluidsynth and csound-soundfont) and music21 (pip install 'specstore[realcorpus]').
Rerunning the same command resumes an interrupted run: finished clips are not
rendered again. Same arguments and versions give byte-identical files.
"""


SEED = Limit(0, 2**32 - 1, "a 32-bit seed, as the other commands take")
JOBS = Limit(1, 256, "worker processes on this machine, each running FluidSynth on one clip; beyond the cores they "
                     "only compete", optional=True)
TRAIN_CLIPS = Limit(1, 64, "clips rendered from each training work, each about half a minute of FluidSynth work: "
                           "the full corpus takes 16 min on 2 cores with 3", optional=True)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="specstore realcorpus",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=EPILOG,
        description=(
            "Render a realistic music-style development corpus: real compositions from music21's corpus "
            f"({', '.join(CLASSES)}) played by FluidSynth with several General-MIDI SoundFonts, varied "
            "instruments, tempo, key, room, EQ, noise, loudness, format, sample rate and channels; split "
            "into train and test by work (manifest.csv, train.csv, test.csv)."
        ),
    )
    p.add_argument("out_dir", metavar="OUT", help="output folder (created if missing)")
    p.add_argument(
        "--size",
        choices=sorted(SIZES),
        default="full",
        help="full: the development corpus (default; 1850 clips of 20-45 s, 3 per training work and 1 per test "
        "work, about 16 min on 2 cores); small: the first, 318-clip development corpus; long: 217 works, one "
        "clip of 45-150 s each (a few hundred labelled tracks); tiny: 2 works per class, 3-5 s clips, one "
        "small SoundFont",
    )
    p.add_argument("--tiny", action="store_const", const="tiny", dest="size", help="same as --size tiny")
    bounded_argument(p, "--seed", limit=SEED, default=0,
                     help="corpus seed: which works, split, every rendering choice (default 0)")
    bounded_argument(p, "--jobs", "-j", limit=JOBS, default=None, help="worker processes (default: all cores)")
    p.add_argument("--classes", default=",".join(CLASSES), help="comma-separated subset of the classes (default: all)")
    bounded_argument(
        p,
        "--train-clips",
        limit=TRAIN_CLIPS,
        default=None,
        metavar="N",
        help="clips from each training work per clip of a test work (default: the size's, 3 for full; 1 gives the "
        "corpus before 2026-12-02). N extends N - 1: rerunning with a larger N renders only the new clips",
    )
    p.add_argument("--prune", action="store_true", help="delete clips of another size or seed found in OUT")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar, warnings only")
    p.add_argument("--verbose", "-v", action="store_true", help="debug logging")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    level = logging.DEBUG if args.verbose else logging.WARNING if args.quiet else logging.INFO
    setup_logging(level)
    logging.getLogger("music21").setLevel(logging.ERROR)

    def body() -> int:
        classes = [c.strip() for c in args.classes.split(",") if c.strip()]
        summary = generate(
            args.out_dir,
            size=args.size,
            seed=args.seed,
            jobs=args.jobs,
            classes=classes,
            prune=args.prune,
            progress=not args.quiet,
            train_clips=args.train_clips,
        )
        print(summary.report())
        return 0

    return run_cli(
        body, interrupted="interrupted; finished clips are kept, rerun the same command to resume", verbose=args.verbose
    )


if __name__ == "__main__":
    sys.exit(main())

"""Writing a corpus: plan it, check the output folder, render and encode the files in worker processes.

Each file is written to ``.<name>.part`` and renamed, so an interrupted run
leaves no half file under its real name (and its ``.part`` files are removed
by the next run).  ``OUT_DIR/README.txt`` records the arguments.
"""

from __future__ import annotations

import logging
import os
import re
import time
import zlib
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from .encode import encode_clip
from .errors import DemoCorpusError
from .plan import FORMATS, MAX_SECONDS, STYLES, ClipPlan, plan_corpus
from .render import render_clip

PROGRESS_BAR = {
    "unit": "s audio",
    "desc": "demo corpus",
    "bar_format": "{l_bar}{bar}| {n:.1f}/{total:.1f} s [{elapsed}<{remaining}, {rate_fmt}{postfix}]",
}
"""The progress bar counts seconds of audio written: exact float totals, shown rounded to 0.1 s (a float
``n`` summed clip by clip would otherwise show as ``4843.599999999999/7212.0``)."""

__all__ = ["CorpusSummary", "generate_corpus"]

logger = logging.getLogger(__name__)

_FILE_RE = re.compile(r"^(?P<style>[a-z0-9]+)_(?P<index>\d{3,})\.(?P<ext>[a-z0-9]+)$")
"""A file name this generator writes, ``<style>_<nnn>.<ext>`` (what ``prune`` may delete)."""


@dataclass(frozen=True)
class CorpusSummary:
    """What :func:`generate_corpus` wrote.  ``total_seconds`` and ``elapsed_s`` in seconds."""

    out_dir: Path
    clips: tuple[ClipPlan, ...]
    elapsed_s: float

    @property
    def styles(self) -> tuple[str, ...]:
        """Style (label) names in corpus order."""
        return tuple(dict.fromkeys(c.style for c in self.clips))

    @property
    def n_files(self) -> int:
        """Number of files written."""
        return len(self.clips)

    @property
    def total_seconds(self) -> float:
        """Length of all files together, seconds."""
        return float(sum(c.n_frames / c.sample_rate for c in self.clips))

    @property
    def total_hours(self) -> float:
        """Length of all files together, hours."""
        return self.total_seconds / 3600.0

    @property
    def files_per_format(self) -> dict[str, int]:
        """File extension -> number of files."""
        return dict(Counter(c.ext for c in self.clips))

    @property
    def files_per_style(self) -> dict[str, int]:
        """Style -> number of files."""
        return dict(Counter(c.style for c in self.clips))


def _write_clip(plan: ClipPlan, out_dir: str) -> float:
    """Render, encode and atomically write one file; returns its length in seconds."""
    audio = render_clip(plan)
    data = encode_clip(audio, plan.sample_rate, plan.ext, serial=zlib.crc32(plan.relpath.encode("utf-8")))
    path = Path(out_dir) / plan.relpath
    tmp = path.with_name(f".{path.name}.part")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return len(audio) / plan.sample_rate


def _foreign_files(out: Path, plans: Sequence[ClipPlan]) -> list[Path]:
    """Files under the style folders of ``out`` that this corpus would not write.

    Half-written ``.<name>.part`` files of an interrupted run are ours: they are removed.
    """
    wanted = {out / p.relpath for p in plans}
    found: list[Path] = []
    for style in STYLES:
        d = out / style
        if not d.is_dir():
            continue
        for p in sorted(d.rglob("*")):
            if p.is_file() and p.name.startswith(".") and p.name.endswith(".part"):
                logger.info("removing %s left by an interrupted run", p)
                p.unlink()
            elif p.is_file() and p not in wanted:
                found.append(p)
    return found


def _readme(plans: Sequence[ClipPlan], n_per_style: int, seed: int) -> str:
    """The text of ``OUT_DIR/README.txt``: how the corpus was made and how to make it again."""
    styles = sorted({p.style for p in plans})
    total = sum(p.n_frames / p.sample_rate for p in plans)
    return (
        "Synthetic demo corpus written by `python -m specstore demo-corpus`.\n"
        f"seed={seed} per_style={n_per_style} files={len(plans)} total_seconds={total:.1f}\n"
        f"styles (one folder per label): {', '.join(styles)}\n"
        "Regenerate with the same arguments to get byte-identical files.\n"
    )


def _check_foreign(out: Path, plans: Sequence[ClipPlan], prune: bool) -> None:
    """Refuse files under ``out``'s style folders that the corpus would not write; with ``prune``, first delete
    those named like this generator's files (``<style>_<digits>.<ext>``)."""
    foreign = _foreign_files(out, plans)
    if foreign and prune:
        ours = [
            p for p in foreign if (m := _FILE_RE.match(p.name)) and m["style"] == p.parent.name and m["ext"] in FORMATS
        ]
        for p in ours:
            p.unlink()
        logger.info("pruned %d stale corpus files", len(ours))
        foreign = [p for p in foreign if p not in ours]
    if foreign:
        raise DemoCorpusError(
            f"{out} holds {len(foreign)} file(s) this corpus would not write (e.g. {foreign[0]}); "
            "use an empty directory" + ("" if prune else " or --prune to delete stale corpus files")
        )


def generate_corpus(
    out_dir: str | os.PathLike[str],
    *,
    n_per_style: int = 40,
    seed: int = 0,
    min_seconds: float | None = None,
    max_seconds: float = MAX_SECONDS,
    formats: Sequence[str] = tuple(FORMATS),
    styles: Sequence[str] = STYLES,
    jobs: int | None = None,
    prune: bool = False,
    progress: bool = True,
) -> CorpusSummary:
    """Write the demo corpus to ``out_dir/<style>/<style>_<nnn>.<ext>`` plus a README.txt.

    ``n_per_style`` files per style; durations in seconds within ``[min_seconds,
    max_seconds]`` (``min_seconds`` defaults to ``min(5, max_seconds)``); ``jobs``
    worker processes (default: all CPUs, 1 = in this process).  Files already there
    are rewritten (same seed -> same bytes).  Other files in the style folders raise
    :class:`DemoCorpusError`, since a folder-per-label scanner would pick them up,
    unless ``prune`` is set, which deletes those matching this generator's naming
    pattern (``<style>_<digits>.<ext>``), e.g. left over from a larger corpus.
    """
    t_start = time.perf_counter()
    plans = plan_corpus(n_per_style, seed=seed, min_seconds=min_seconds, max_seconds=max_seconds, formats=formats,
                        styles=styles)
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise DemoCorpusError(f"output path exists and is not a directory: {out}")
    _check_foreign(out, plans, prune)
    for style in dict.fromkeys(p.style for p in plans):
        (out / style).mkdir(parents=True, exist_ok=True)
    (out / "README.txt").write_text(_readme(plans, n_per_style, seed), encoding="utf-8")
    others = sorted(p.name for p in out.iterdir() if p.name != "README.txt" and p.name not in STYLES)
    if others:
        logger.warning("%s also holds %s; a folder-per-label scan of it will include them", out, ", ".join(others[:5]))

    n_jobs = max(1, min(jobs if jobs is not None else (os.cpu_count() or 1), len(plans)))
    # Most expensive first (longest-processing-time scheduling), so that no worker is left
    # alone with a 4-minute file at the end.  Rough cost model: synthesis is per second,
    # MP3 encoding costs ~4x synthesis per second and channel.
    order = sorted(plans, key=lambda p: -p.duration_s * (1.0 + (4.0 * p.channels if p.ext == "mp3" else 0.0)))
    total_s = sum(p.n_frames / p.sample_rate for p in plans)
    logger.info("writing %d files (%.2f h of audio) to %s with %d job(s)", len(plans), total_s / 3600, out, n_jobs)
    if n_jobs == 1:
        with tqdm(total=total_s, disable=not progress, **PROGRESS_BAR) as bar:
            for clip in order:
                bar.update(_write_clip(clip, str(out)))
    else:
        with ProcessPoolExecutor(max_workers=n_jobs) as pool:
            # Submit (which starts the workers) before tqdm starts its monitor thread.
            futures = [pool.submit(_write_clip, p, str(out)) for p in order]
            try:
                with tqdm(total=total_s, disable=not progress, **PROGRESS_BAR) as bar:
                    for fut in as_completed(futures):
                        bar.update(fut.result())
            except BaseException:
                pool.shutdown(wait=True, cancel_futures=True)  # do not render the rest first
                raise
    summary = CorpusSummary(out, tuple(plans), time.perf_counter() - t_start)
    logger.info(
        "wrote %d files, %.2f h of audio, in %.1f s (%.0fx realtime)",
        summary.n_files,
        summary.total_hours,
        summary.elapsed_s,
        summary.total_seconds / max(summary.elapsed_s, 1e-9),
    )
    return summary

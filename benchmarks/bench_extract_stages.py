"""Where one extraction's time goes, stage by stage (decode, resample, framing, FFT, mel filter, CQT, dB, cast, write).

:func:`stage_profile` runs :func:`specstore.pipeline.extract.extract` with ``jobs=1``
(all the work in this process) with timers wrapped around the functions
that make up each stage, and reports each stage's *exclusive* time (a
timer nested inside another is subtracted from it, so the stages add up to
the timed total) per format, in CPU milliseconds of this thread per minute
of audio (CPU time, not wall time: on a shared machine it does not count
the time other processes hold the core).  The wrappers are installed for the run only and restored after; their
own overhead (about a microsecond per call, a few thousand calls per run) is
in "other".
"""

from __future__ import annotations

import contextlib
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

__all__ = ["STAGES", "stage_profile", "stage_table"]

#: Table rows, in pipeline order.
STAGES = ("decode", "downmix + checks", "resample", "framing", "mel window, power, guard", "FFT (mel)",
          "mel exact redo", "mel filter", "CQT decimation", "FFT (CQT)", "CQT basis product, magnitude", "dB",
          "float16 cast, output buffers", "shard write", "other")


class _Clock:
    """Exclusive time per (format, stage): a stack of running timers, each paying only for itself."""

    def __init__(self) -> None:
        self.spent: dict[tuple[str, str], float] = {}
        self.stack: list[list[Any]] = []  # [stage, start, nested seconds]
        self.fmt = "?"

    def wrap(self, stage: str | Callable[[list[str]], str], fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*a: Any, **k: Any) -> Any:
            name = stage([s[0] for s in self.stack]) if callable(stage) else stage
            frame: list[Any] = [name, time.thread_time(), 0.0]
            self.stack.append(frame)
            try:
                return fn(*a, **k)
            finally:
                self.stack.pop()
                total = time.thread_time() - frame[1]
                key = (self.fmt, name)
                self.spent[key] = self.spent.get(key, 0.0) + total - frame[2]
                if self.stack:
                    self.stack[-1][2] += total
        return timed


def _in_cqt(stack: list[str]) -> bool:
    return any(s.startswith("CQT") for s in stack)


@contextlib.contextmanager
def _hooks(clock: _Clock) -> Iterator[None]:
    """Install the stage timers on the pipeline's functions; restore them after."""
    import scipy.fft
    import soundfile as sf

    import specstore.pipeline.audio as audio
    import specstore.pipeline.cqt as cqt
    import specstore.pipeline.mel as mel
    import specstore.pipeline.mixdown as mixdown
    import specstore.store.shard_writer as sw

    def fmt_of(fn: Callable[..., Any]) -> Callable[..., Any]:
        def run(item: Any, *a: Any, **k: Any) -> Any:
            clock.fmt = Path(item.source).suffix.lstrip(".")
            return clock.wrap("other", fn)(item, *a, **k)
        return run

    def resample(stack: list[str]) -> str:
        return "CQT decimation" if _in_cqt(stack) else "resample"

    def fft(stack: list[str]) -> str:
        return "FFT (CQT)" if _in_cqt(stack) else "FFT (mel)"

    targets: list[tuple[Any, str, str | Callable[[list[str]], str]]] = [
        (sf.SoundFile, "read", "decode"), (mixdown, "downmix", "downmix + checks"),
        (mixdown, "read_pcm16", "downmix + checks"),  # its int16 reads are "decode" (nested)
        (audio, "truncation_reason", "downmix + checks"), (audio, "_length_reason", "downmix + checks"),
        (audio.StreamResampler, "push", resample), (audio.StreamResampler, "finish", resample),
        (mel, "centered_frames", "framing"), (cqt, "centered_frames", "framing"),
        (mel._MelPlan, "_fast", "mel window, power, guard"), (mel._MelPlan, "_exact", "mel exact redo"),
        (mel._MelPlan, "_apply_filters", "mel filter"), (scipy.fft, "rfft", fft),
        (cqt._CqtStream, "feed", "CQT decimation"), (cqt._CqtStream, "finish", "CQT decimation"),
        (cqt._CqtStream, "_emit", "CQT basis product, magnitude"),
        (mel, "to_db", "dB"), (cqt, "to_db", "dB"),
        (mel._MelStream, "_emit", "float16 cast, output buffers"),
        (sw.ShardWriter, "end_clip", "shard write"), (sw.ShardWriter, "close", "shard write"),
    ]
    for name in ("_write_chunk", "append"):
        for cls in vars(sw).values():
            if isinstance(cls, type) and cls.__module__ == sw.__name__ and name in vars(cls):
                targets.append((cls, name, "shard write"))
    saved = [(obj, attr, getattr(obj, attr)) for obj, attr, _ in targets]
    import specstore.pipeline.tasks as tasks

    saved.append((tasks, "_decode_one", tasks._decode_one))
    try:
        for obj, attr, stage in targets:
            setattr(obj, attr, clock.wrap(stage, getattr(obj, attr)))
        tasks._decode_one = fmt_of(tasks._decode_one)
        yield
    finally:
        for obj, attr, fn in reversed(saved):
            setattr(obj, attr, fn)


def stage_profile(corpus: Path, files: list[Path], out: Path, features: tuple[str, ...]) -> dict[str, Any]:
    """One ``extract(jobs=1)`` of ``corpus`` with the stage timers: ms per audio minute by format and stage."""
    import soundfile as sf

    from specstore.pipeline.extract import extract

    minutes: dict[str, float] = {}
    for f in files:
        fmt = f.suffix.lstrip(".")
        minutes[fmt] = minutes.get(fmt, 0.0) + sf.info(str(f)).duration / 60.0
    clock = _Clock()
    shutil.rmtree(out, ignore_errors=True)
    with _hooks(clock):
        t0, c0 = time.perf_counter(), time.process_time()
        extract(corpus, str(out), features=features, jobs=1, progress=False)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    shutil.rmtree(out, ignore_errors=True)
    table: dict[str, dict[str, float]] = {}
    for fmt, mins in sorted(minutes.items()):
        table[fmt] = {s: round(1000 * clock.spent.get((fmt, s), 0.0) / mins, 1) for s in STAGES}
    total_min = sum(minutes.values())
    table["all"] = {s: round(sum(table[f][s] * minutes[f] for f in minutes) / total_min, 1) for s in STAGES}
    timed = sum(clock.spent.values())
    return {"features": list(features), "ms_per_audio_minute": table, "run_wall_s": round(wall, 3),
            "run_cpu_s": round(cpu, 3), "timed_share_of_run": round(timed / max(cpu, 1e-9), 3)}


def stage_table(profiles: dict[str, dict[str, Any]]) -> str:
    """A markdown table: stages as rows; per profile, its formats' and all files' ms per audio minute."""
    cols: list[tuple[str, str]] = []
    for label, prof in profiles.items():
        fmts = list(prof["ms_per_audio_minute"])
        cols += [(label, f) for f in fmts]
    head = "| stage | " + " | ".join(f"{lab}: {f}" for lab, f in cols) + " |"
    rule = "|---|" + "---:|" * len(cols)
    rows = [head, rule]
    for s in STAGES:
        vals = [profiles[lab]["ms_per_audio_minute"][f][s] for lab, f in cols]
        if any(vals):
            rows.append(f"| {s} | " + " | ".join(f"{v:.1f}" for v in vals) + " |")
    totals = [sum(profiles[lab]["ms_per_audio_minute"][f].values()) for lab, f in cols]
    rows.append("| **total** | " + " | ".join(f"**{v:.1f}**" for v in totals) + " |")
    return "\n".join(rows)

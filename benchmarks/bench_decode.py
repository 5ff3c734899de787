"""Decoding formats: PyAV (FFmpeg) beside soundfile (libsndfile), speed and peak memory.

One music-like 44.1 kHz stereo signal is written in every format: WAV (16-bit), FLAC, Ogg Vorbis, MP3 and AIFF
with soundfile (both backends read these), m4a (AAC), WMA (wmav2) and raw ADTS AAC with PyAV's encoders (PyAV
only).  Each is decoded the pipeline's way, :func:`specstore.pipeline.audio.stream_mono` to mono at 22.05 kHz (mix-down
and streaming soxr resampling included, as extraction and ``specstore classify`` decode), once with
``backend="auto"`` (soundfile) and once with ``backend="pyav"``.  Speed: every (format, backend) variant runs
in each repeat, their order rotating from repeat to repeat; a shared format's figure is the median over
repeats of PyAV's time over soundfile's in the same repeat.  Memory: each variant decodes in a fresh
interpreter (``python -m benchmarks.bench_probe decode-mem``) with both decoders imported first; the figure is
the growth of VmHWM (the process's RSS high-water mark) during the decode, MB = 10^6 bytes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import soundfile as sf

from .bench_common import CpuWindow, Figure, GroupResult, median, rotated, run_probe

SR = 44_100
TARGET_SR = 22_050
#: Formats both backends read, written with soundfile: suffix -> (format, subtype).
SHARED = {"wav": ("WAV", "PCM_16"), "flac": ("FLAC", "PCM_16"), "ogg": ("OGG", "VORBIS"),
          "mp3": ("MP3", "MPEG_LAYER_III"), "aiff": ("AIFF", "PCM_16")}
#: Formats only PyAV reads, written with its encoders (:func:`specstore.pipeline.testing.write_with_av`).
NEW = ("m4a", "wma", "aac")
#: Most a PyAV decode of a new format may add to the process's peak memory: it streams in blocks, so this
#: holds for any length (the decoded file is 10.6 MB per minute at 44.1 kHz stereo float32).
MEMORY_TARGET_MB = 20.0


def _files(work: Path, seconds: float) -> dict[str, Path]:
    from specstore.pipeline.testing import music_like, write_with_av

    work.mkdir(parents=True, exist_ok=True)
    x = music_like(seconds, seed=21, sr=SR, channels=2)
    out = {}
    for ext, (fmt, subtype) in SHARED.items():
        out[ext] = work / f"music.{ext}"
        with sf.SoundFile(out[ext], "w", SR, 2, subtype, format=fmt) as f:
            for i in range(0, len(x), 1 << 16):  # in blocks: libsndfile's MP3/Vorbis writers crash on a minute
                f.write(x[i:i + (1 << 16)])
    for ext in NEW:
        out[ext] = write_with_av(work / f"music.{ext}", x, SR)
    return out


def _decode(path: Path, backend: str) -> int:
    from specstore.pipeline.audio import stream_mono

    return sum(len(b) for b in stream_mono(path, TARGET_SR, backend=backend))


def _speed(files: dict[str, Path], repeats: int) -> tuple[dict[tuple[str, str], list[float]], list[float]]:
    variants = [(ext, b) for ext in files for b in (("auto", "pyav") if ext in SHARED else ("pyav",))]
    for v in variants:  # untimed: files in the page cache, codecs initialised
        _decode(files[v[0]], v[1])
    times: dict[tuple[str, str], list[float]] = {v: [] for v in variants}
    foreign: list[float] = []
    for r in range(repeats):
        for ext, backend in rotated(variants, r):
            with CpuWindow() as w:
                _decode(files[ext], backend)
            times[(ext, backend)].append(w.wall)
            foreign.append(w.foreign_cores)
    return times, foreign


def _memory(files: dict[str, Path]) -> dict[tuple[str, str], float]:
    out = {}
    for ext, path in files.items():
        for backend in ("auto", "pyav") if ext in SHARED else ("pyav",):
            res = run_probe(["decode-mem", str(path), backend])
            out[(ext, backend)] = round((res["hwm_kib"] - res["hwm_before_kib"]) * 1024 / 1e6, 1)
    return out


def run(work: Path, *, seconds: float, repeats: int) -> GroupResult:
    files = _files(work, seconds)
    times, foreign = _speed(files, repeats)
    mem = _memory(files)
    common: dict[str, Any] = {"seconds": seconds, "repeats": repeats, "foreign_cores": round(median(foreign), 2)}
    figures = []
    rows = []
    for ext in files:
        pyav_s = median(times[(ext, "pyav")])
        pyav_x, pyav_mb = round(seconds / pyav_s, 1), mem[(ext, "pyav")]
        row: dict[str, Any] = {"format": ext, "pyav_x_realtime": pyav_x, "pyav_mb": pyav_mb}
        if ext in SHARED:
            sf_s = median(times[(ext, "auto")])
            ratio = median([a / b for a, b in zip(times[(ext, "pyav")], times[(ext, "auto")], strict=True)])
            row.update(soundfile_x_realtime=round(seconds / sf_s, 1), soundfile_mb=mem[(ext, "auto")])
            figures.append(Figure(
                f"decode_{ext}_pyav_vs_soundfile", f"Decode {ext}: PyAV's time vs soundfile's", round(ratio, 3),
                "x time (>1: PyAV slower)",
                f"stream_mono of a {seconds:g} s 44.1 kHz stereo {ext} to 22.05 kHz mono, backend='pyav' over "
                "the default (soundfile), median of the per-repeat ratio",
                details={"x_realtime": {"soundfile": row["soundfile_x_realtime"], "pyav": row["pyav_x_realtime"]},
                         "peak_mb": {"soundfile": row["soundfile_mb"], "pyav": row["pyav_mb"]}, **common}))
            figures.append(Figure(
                f"decode_{ext}_pyav_memory_vs_soundfile", f"Decode {ext}: PyAV's peak memory over soundfile's",
                round(pyav_mb - mem[(ext, "auto")], 1), "MB",
                "growth of VmHWM during the decode in a fresh process, PyAV minus soundfile (negative: PyAV "
                "smaller)", details={"peak_mb": {"soundfile": row["soundfile_mb"], "pyav": row["pyav_mb"]},
                                     "seconds": seconds}))
        else:
            figures.append(Figure(
                f"decode_{ext}_pyav_speed", f"Decode {ext} (PyAV only): speed", pyav_x,
                "x realtime",
                f"seconds of audio decoded per wall second by stream_mono of a {seconds:g} s 44.1 kHz stereo "
                f"{ext} to 22.05 kHz mono (PyAV)", details={"times_s": [round(t, 3) for t in times[(ext, "pyav")]],
                                                             **common}))
            figures.append(Figure(
                f"decode_{ext}_pyav_memory", f"Decode {ext} (PyAV only): peak memory added", pyav_mb, "MB",
                f"growth of VmHWM while a fresh process decodes the {seconds:g} s file (the whole decoded file "
                f"would be {seconds * SR * 2 * 4 / 1e6:.1f} MB)", MEMORY_TARGET_MB, "<=", {"seconds": seconds}))
        rows.append(row)
    for f in files.values():
        f.unlink()
    method = f"`python -m benchmarks --only decode-formats`: {__doc__.split(chr(10) + chr(10), 1)[1]}"
    return GroupResult("decode formats", figures, method=f"{method}\n\n{_table(rows)}")


def _table(rows: list[dict[str, Any]]) -> str:
    """Both backends side by side, per format."""
    def cell(row: dict[str, Any], key: str) -> str:
        return str(row[key]) if key in row else "-"

    lines = ["| format | soundfile x realtime | PyAV x realtime | soundfile peak MB | PyAV peak MB |",
             "|---|---|---|---|---|"]
    lines += [f"| {r['format']} | {cell(r, 'soundfile_x_realtime')} | {r['pyav_x_realtime']} | "
              f"{cell(r, 'soundfile_mb')} | {r['pyav_mb']} |" for r in rows]
    return "\n".join(lines)

"""Figures 1-2: extraction speed against the loop users write and the decode floor; worker memory.

Speed: a generated corpus (wav/flac/ogg/mp3, mono/stereo, 22.05/44.1 kHz)
goes through five variants, interleaved in every repeat:

* ``naive``: the per-file loop users write (``librosa.load`` +
  ``melspectrogram`` + ``power_to_db`` + ``np.save``), one process;
* ``naive_jN``: the same loop spread over all cores with joblib;
* ``ours_j1`` / ``ours_jN``: :func:`pipeline.extract.extract` (log-mel only)
  into a fresh store with ``jobs=1`` / all cores;
* ``floor``: decoding the same files with soundfile and nothing else.

All compute the same log-mel (the store's default spec: 22 050 Hz, n_fft
2048, hop 512, 128 mels, fmax 8000, dB against 1.0 without top_db).

Checksums: the time one ``ours_j1`` run spends inside the CRC-32C of its
chunks, timed around each call; and, for context, ``ours_j1`` against the
same run with the CRC replaced by a constant (``ours_j1_nosum``),
interleaved like the rest.

Memory: the worker function (:func:`pipeline.tasks.run_task`) on one
5-minute and one 2-hour file, each in a fresh interpreter; VmHWM.
"""

from __future__ import annotations

import cProfile
import io
import os
import pstats
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np

from .bench_common import CpuWindow, Figure, GroupResult, log, median, rotated, run_probe

SR = 22050

# (format, sample rate, channels): every combination appears in the corpus.
COMBOS = [(fmt, sr, ch) for fmt in ("wav", "flac", "ogg", "mp3") for sr in (22050, 44100) for ch in (1, 2)]


def _write_one(path: str, seconds: float, seed: int, sr: int, channels: int) -> str:
    from pipeline.testing import write_music_like

    write_music_like(path, seconds, seed=seed, sr=sr, channels=channels, loop_seconds=min(15.0, seconds))
    return path


def make_corpus(root: Path, n_files: int, mean_seconds: float, jobs: int) -> list[Path]:
    """``n_files`` music-like files in three label folders, lengths 0.7-1.3 x ``mean_seconds``."""
    from joblib import Parallel, delayed

    specs = []
    for k in range(n_files):
        fmt, sr, ch = COMBOS[k % len(COMBOS)]
        seconds = round(mean_seconds * (0.7 + 0.6 * ((k * 7919) % 97) / 96), 2)
        path = root / ("rock", "jazz", "ambient")[k % 3] / f"t{k:03d}.{fmt}"
        path.parent.mkdir(parents=True, exist_ok=True)
        specs.append((str(path), seconds, k, sr, ch))
    # Longest encodes first (stereo 44.1 kHz mp3/ogg), so the pool finishes together.
    order = sorted(specs, key=lambda s: -(s[1] * s[3] * s[4] * (4 if s[0].endswith((".mp3", ".ogg")) else 1)))
    Parallel(n_jobs=jobs)(delayed(_write_one)(*s) for s in order)
    return [Path(s[0]) for s in specs]


def naive_one(src: str, out: str) -> float:
    """What users write for one file; returns seconds of audio."""
    import librosa

    from store import FeatureSpec

    s = FeatureSpec.mel()
    y, sr = librosa.load(src, sr=s.sample_rate, mono=True)
    mel = librosa.feature.melspectrogram(y=y, sr=sr, n_fft=int(s.n_fft or 2048), hop_length=s.hop_length,
                                         n_mels=s.n_bins, fmin=s.fmin, fmax=s.fmax, power=s.power)
    np.save(out, librosa.power_to_db(mel, ref=s.db_ref, amin=s.amin, top_db=None))
    return len(y) / sr


def decode_only(src: str) -> int:
    """Decode ``src`` with soundfile in the pipeline's block size; nothing else."""
    import soundfile as sf

    from pipeline.audio import DEFAULT_BLOCK_SAMPLES

    n = 0
    with sf.SoundFile(src) as f:
        while True:
            block = f.read(DEFAULT_BLOCK_SAMPLES, dtype="float32", always_2d=True)
            if not block.shape[0]:
                return n
            n += block.shape[0]


class _Runs:
    """The variants, each writing to fresh output under ``work``."""

    def __init__(self, corpus: Path, files: list[Path], work: Path, jobs: int) -> None:
        self.corpus, self.files, self.work, self.jobs = corpus, files, work, jobs
        self.n = 0

    def _fresh(self, name: str) -> Path:
        self.n += 1
        p = self.work / f"{name}-{self.n}"
        shutil.rmtree(p, ignore_errors=True)
        return p

    def naive(self) -> Path:
        out = self._fresh("naive")
        out.mkdir(parents=True)
        for i, f in enumerate(self.files):
            naive_one(str(f), str(out / f"{i:04d}.npy"))
        return out

    def naive_parallel(self) -> Path:
        from joblib import Parallel, delayed

        out = self._fresh("naivej")
        out.mkdir(parents=True)
        Parallel(n_jobs=self.jobs)(delayed(naive_one)(str(f), str(out / f"{i:04d}.npy"))
                                   for i, f in enumerate(self.files))
        return out

    def ours(self, jobs: int, checksums: bool = True) -> Path:
        from contextlib import ExitStack
        from unittest import mock

        from pipeline.extract import extract

        out = self._fresh(f"ours{jobs}")
        with ExitStack() as stack:
            if not checksums:  # jobs=1 runs in this process: the shard writer's CRC becomes a constant
                assert jobs == 1
                stack.enter_context(mock.patch("store.shard_writer.crc32c", lambda data, crc=0: 0))
            summary = extract(self.corpus, str(out), features=("mel",), jobs=jobs, progress=False)
        if summary.errors or summary.decoded != len(self.files):
            raise RuntimeError(f"extraction failed: {summary.report()}")
        return out

    def floor(self) -> None:
        for f in self.files:
            decode_only(str(f))


def _max_db_difference(store: Path, naive_dir: Path, corpus: Path, files: list[Path]) -> float:
    """Largest |ours - naive| in dB over one file of each format (ours is stored float16)."""
    from store import open_store

    s = open_store(store)
    row = {p: i for i, p in enumerate(s.paths)}
    worst = 0.0
    seen: set[str] = set()
    for i, f in enumerate(files):
        if f.suffix in seen:
            continue
        seen.add(f.suffix)
        ours = np.asarray(s[row[f.relative_to(corpus).as_posix()]], dtype=np.float32)
        ref = np.load(naive_dir / f"{i:04d}.npy", allow_pickle=False)
        worst = max(worst, float(np.abs(ours - ref).max()))
    return worst


def features_of(paths: list[str]) -> float:
    """compute_features (log-mel, float16 out) on ``paths`` in this process; returns its CPU seconds."""
    from pipeline.features import compute_features
    from store import FeatureSpec

    specs = {"mel": FeatureSpec.mel()}
    t0 = time.process_time()
    for p in paths:
        compute_features(p, specs, out_dtypes={"mel": "float16"})
    return time.process_time() - t0


def _bare_scaling(files: list[Path], jobs: int, repeats: int) -> dict[str, Any]:
    """How the bare per-file work (decode + log-mel, no driver, no store) scales to ``jobs`` processes.

    Each file is timed alone in this process; the files are then split into
    ``jobs`` groups of equal time (longest first onto the least loaded) and
    the groups run at once on the loky workers.  The speed-up of that is what
    the hardware gives this workload, before any scheduling or driver cost.
    """
    from joblib import Parallel, delayed

    alone = {str(f): 0.0 for f in files}
    for path in files:
        t0 = time.perf_counter()
        features_of([str(path)])
        alone[str(path)] = time.perf_counter() - t0
    groups: list[list[str]] = [[] for _ in range(jobs)]
    load = [0.0] * jobs
    for f, t in sorted(alone.items(), key=lambda x: -x[1]):
        i = load.index(min(load))
        groups[i].append(f)
        load[i] += t
    one, many, cpu = [], [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        features_of([str(f) for f in files])
        one.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        cpu.append(sum(Parallel(n_jobs=jobs)(delayed(features_of)(g) for g in groups)))
        many.append(time.perf_counter() - t0)
    return {"speedup": round(median([a / b for a, b in zip(one, many, strict=False)]), 3),
            "one_process_s": round(median(one), 3), f"{jobs}_processes_s": round(median(many), 3),
            "cpu_s_in_workers": round(median(cpu), 3), "group_balance_s": [round(x, 3) for x in load]}


def timed_run_task(*args: Any, **kwargs: Any) -> Any:
    """:func:`pipeline.tasks.run_task`, with the task's (start, end, pid) attached (wall clock)."""
    from pipeline.tasks import run_task

    t0 = time.time()
    res = run_task(*args, **kwargs)
    res.bench_span = (t0, time.time(), os.getpid())  # type: ignore[attr-defined]
    return res


def _timeline(runs: _Runs, jobs: int) -> dict[str, Any]:
    """One extraction with every task's start and end recorded: where a jobs=N run spends its wall time.

    The driver's ``run_task`` and ``_Run._collect`` are wrapped for this one run (restored after).
    """
    import sys

    mod: Any = sys.modules["pipeline.extract"]
    spans: list[tuple[float, float, int]] = []
    orig_task, orig_collect = mod.run_task, mod._Run._collect

    def collect(self: Any, res: Any, *a: Any, **k: Any) -> Any:
        if getattr(res, "bench_span", None):
            spans.append(res.bench_span)
        return orig_collect(self, res, *a, **k)

    mod.run_task, mod._Run._collect = timed_run_task, collect
    try:
        t0 = time.time()
        out = runs.ours(jobs)
        t1 = time.time()
    finally:
        mod.run_task, mod._Run._collect = orig_task, orig_collect
    shutil.rmtree(out, ignore_errors=True)
    if not spans:
        return {}
    first, last = min(a for a, _, _ in spans), max(b for _, b, _ in spans)
    busy: dict[int, float] = {}
    for a, b, pid in spans:
        busy[pid] = busy.get(pid, 0.0) + (b - a)
    durations = sorted(b - a for a, b, _ in spans)
    return {
        "wall_s": round(t1 - t0, 3), "before_first_task_s (scan, hash, plan)": round(first - t0, 3),
        "tasks_phase_s": round(last - first, 3), "after_last_task_s (final commit)": round(t1 - last, 3),
        "tasks": len(spans), "task_s_min_median_max": [round(durations[0], 3), round(median(durations), 3),
                                                      round(durations[-1], 3)],
        "worker_busy_s": sorted(round(v, 3) for v in busy.values()),
        "worker_idle_in_tasks_phase_s": round(jobs * (last - first) - sum(busy.values()), 3),
    }


def _checksum_share(runs: _Runs) -> float:
    """Fraction of one jobs=1 extraction's CPU time spent computing chunk CRC-32Cs (timed around each call)."""
    from unittest import mock

    import store.shard_writer as sw

    spent = [0.0]
    real = sw.crc32c

    def timed(data: bytes, crc: int = 0) -> int:
        t0 = time.process_time()
        try:
            return real(data, crc)
        finally:
            spent[0] += time.process_time() - t0

    c0 = time.process_time()
    with mock.patch.object(sw, "crc32c", timed):
        out = runs.ours(1)
    total = time.process_time() - c0
    shutil.rmtree(out, ignore_errors=True)
    return round(spent[0] / max(total, 1e-9), 5)


def _profile_extract(runs: _Runs, jobs: int, top: int = 14) -> str:
    """cProfile of the driver process during one extraction (with jobs=1 it sees all the work)."""
    prof = cProfile.Profile()
    prof.enable()
    out = runs.ours(jobs)
    prof.disable()
    shutil.rmtree(out, ignore_errors=True)
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(top)
    lines = [ln for ln in buf.getvalue().splitlines() if ln.strip()]
    start = next((i for i, ln in enumerate(lines) if ln.lstrip().startswith("ncalls")), 0)
    return "\n".join(lines[start:start + top + 1])


def run_speed(work: Path, *, n_files: int, mean_seconds: float, repeats: int) -> GroupResult:
    from joblib import parallel_config

    jobs = len(os.sched_getaffinity(0))
    corpus = work / "corpus"
    t0 = time.perf_counter()
    # One joblib configuration for the whole group (as extract() sets it), so the loky
    # executor and its workers are started once and stay warm.
    with parallel_config(backend="loky", n_jobs=jobs, inner_max_num_threads=1):
        files = make_corpus(corpus, n_files, mean_seconds, jobs)
        gen_seconds = time.perf_counter() - t0
        import soundfile as sf

        audio = float(sum(sf.info(str(f)).duration for f in files))
        size = sum(f.stat().st_size for f in files)
        runs = _Runs(corpus, files, work / "out", jobs)
        variants: dict[str, Any] = {
            "naive": runs.naive, "ours_j1": lambda: runs.ours(1), "floor": runs.floor,
            "ours_jN": lambda: runs.ours(jobs), "naive_jN": runs.naive_parallel,
            "ours_j1_nosum": lambda: runs.ours(1, checksums=False),
        }
        if jobs == 1:
            variants.pop("ours_jN")
            variants.pop("naive_jN")
        # Warm-up (untimed): imports, librosa's caches, the loky workers, the page cache.
        outs = {name: fn() for name, fn in variants.items()}
        max_diff = _max_db_difference(outs["ours_j1"], outs["naive"], corpus, files)
        # A rerun over a complete store decodes nothing: the driver's serial work (scan + hash).
        with CpuWindow() as serial:
            from pipeline.extract import extract

            extract(corpus, str(outs["ours_j1"]), features=("mel",), jobs=jobs, progress=False)
        for out in outs.values():
            if out is not None:
                shutil.rmtree(out, ignore_errors=True)

        times: dict[str, list[float]] = {k: [] for k in variants}
        own: dict[str, list[float]] = {k: [] for k in variants}
        foreign: dict[str, list[float]] = {k: [] for k in variants}
        for r in range(repeats):
            for name in rotated(list(variants), r):
                with CpuWindow() as w:
                    out = variants[name]()
                times[name].append(w.wall)
                own[name].append(w.own_cores)
                foreign[name].append(w.foreign_cores)
                if out is not None:
                    shutil.rmtree(out, ignore_errors=True)
            log.info("extraction repeat %d/%d: %s", r + 1, repeats,
                     ", ".join(f"{k} {audio / times[k][-1]:.0f}x" for k in variants))

        ratio_j1 = [a / b for a, b in zip(times["ours_j1"], times["naive"], strict=False)]
        # CPU seconds of this process tree: on a shared machine far steadier than wall time
        cpu = {k: [o * t for o, t in zip(own[k], times[k], strict=False)] for k in ("ours_j1", "ours_j1_nosum")}
        sum_cost = [a / b for a, b in zip(cpu["ours_j1"], cpu["ours_j1_nosum"], strict=False)]
        sum_wall = [a / b for a, b in zip(times["ours_j1"], times["ours_j1_nosum"], strict=False)]
        crc_share = _checksum_share(runs)
        floor_frac = [a / b for a, b in zip(times["floor"], times["ours_j1"], strict=False)]
        speed = {k: round(audio / median(v), 1) for k, v in times.items()}
        common: dict[str, Any] = {
            "files": len(files), "audio_seconds": round(audio, 1), "corpus_bytes": size,
            "formats": sorted({f.suffix.lstrip(".") for f in files}), "repeats": repeats, "jobs_all": jobs,
            "speed_x_realtime": speed, "times_s": {k: [round(x, 3) for x in v] for k, v in times.items()},
            "own_cores": {k: round(median(v), 2) for k, v in own.items()},
            "foreign_cores": {k: round(median(v), 2) for k, v in foreign.items()},
            "max_abs_db_difference_ours_vs_naive": round(max_diff, 4),
            "serial_rerun_seconds": round(serial.wall, 3), "corpus_generation_seconds": round(gen_seconds, 1),
        }
        figures = [
            Figure("extract_jobs1_time_vs_naive", "Extraction jobs=1: time vs the naive librosa loop",
                   round(median(ratio_j1), 3), "x time",
                   "pipeline.extract(jobs=1) wall time / the per-file librosa.load + melspectrogram + "
                   "power_to_db + np.save loop's, same files and features (median of per-repeat ratios)",
                   target=1.10, op="<=", details=common),
            Figure("extract_checksum_cost", "Extraction jobs=1: time with chunk checksums vs without",
                   round(1.0 / (1.0 - crc_share), 4), "x CPU time",
                   "pipeline.extract(jobs=1) CPU time / the same less the time spent inside the CRC-32C of every "
                   "shard chunk, timed around each call in one run (crc_share_of_cpu). An interleaved A/B against "
                   "runs with the CRC replaced by a constant is in the details (ab_cpu_ratio_median, "
                   "ab_wall_ratio_median): on a shared machine its noise is far above the cost measured",
                   target=1.03, op="<=",
                   details={"crc_share_of_cpu": crc_share, "ab_cpu_ratio_median": round(median(sum_cost), 3),
                            "ab_wall_ratio_median": round(median(sum_wall), 3),
                            "cpu_s": {k: [round(x, 3) for x in v] for k, v in cpu.items()},
                            "times_s": {k: [round(x, 3) for x in times[k]] for k in ("ours_j1", "ours_j1_nosum")}}),
            Figure("extract_jobs1_vs_decode_floor", "Extraction jobs=1: speed as a fraction of decode-only",
                   round(median(floor_frac), 3), "fraction",
                   "decode-only (soundfile, same files, one process) time / pipeline.extract(jobs=1) time: "
                   "1.0 would mean features cost nothing beyond decoding", details={"speed_x_realtime": speed}),
        ]
        profile = ""
        if jobs > 1:
            speedup = [a / b for a, b in zip(times["ours_j1"], times["ours_jN"], strict=False)]
            naive_par = [a / b for a, b in zip(times["naive_jN"], times["ours_jN"], strict=False)]
            target = round(0.9 * jobs, 2)
            fig = Figure(f"extract_jobs{jobs}_speedup", f"Extraction jobs={jobs}: speed-up over jobs=1",
                         round(median(speedup), 3), "x",
                         f"pipeline.extract(jobs=1) time / pipeline.extract(jobs={jobs}) time on {jobs} cores "
                         f"(target {target} = 90% of linear)",
                         target=target, op=">=", details={"speed_x_realtime": speed,
                                                          "own_cores": common["own_cores"],
                                                          "foreign_cores": common["foreign_cores"]})
            figures.append(fig)
            figures.append(Figure(f"extract_jobs{jobs}_vs_naive_jobs{jobs}",
                                  f"Extraction jobs={jobs}: speed vs the naive loop on joblib({jobs})",
                                  round(median(naive_par), 3), "x",
                                  f"naive loop under joblib Parallel(n_jobs={jobs}) time / "
                                  f"pipeline.extract(jobs={jobs}) time", details={"speed_x_realtime": speed}))
            if not fig.met:
                bare = _bare_scaling(files, jobs, repeats=max(1, min(3, repeats)))
                timeline = _timeline(runs, jobs)
                fig.details["bare_work_scaling"] = bare
                profile = (f"jobs={jobs} missed its target. The bare per-file work (decode + log-mel in "
                           f"{jobs} processes on groups of equal single-core time, no driver, no store) scales "
                           f"{bare['speedup']:.2f}x here: that is what these {jobs} cores give this workload. "
                           f"During the jobs={jobs} runs this process tree used "
                           f"{common['own_cores']['ours_jN']:.2f} cores (of {jobs}) while other processes "
                           f"used {common['foreign_cores']['ours_jN']:.2f}; the driver's serial part (scan + "
                           f"hash + commit, measured as a no-op rerun) takes {serial.wall:.2f} s of the "
                           f"{median(times['ours_jN']):.2f} s run.\n\nTimeline of one more jobs={jobs} run "
                           f"(every task's start and end, wall clock):\n\n"
                           + "\n".join(f"  {k}: {v}" for k, v in timeline.items()))
                if timeline:
                    profile += (
                        "\n\nWhat the driver leaves on the table: "
                        f"{timeline['before_first_task_s (scan, hash, plan)']} s "
                        f"before the first task starts (the whole corpus is hashed before any decoding; "
                        f"overlapping the two would let the workers start at once) and "
                        f"{timeline['worker_idle_in_tasks_phase_s']} s of worker idle time while the last "
                        f"of {timeline['tasks']} unequal tasks finish (tasks shrinking towards the end "
                        f"would even that out), out of a {timeline['wall_s']} s run."
                    )
        if not figures[0].met:
            profile += (
                "\n\njobs=1 missed its target; profile of one jobs=1 run (top by own time):\n\n"
                + _profile_extract(runs, 1)
            )
    method = (
        f"{len(files)} generated files ({audio / 60:.1f} min of audio, {size / 2**20:.0f} MiB: "
        f"wav/flac/ogg/mp3 x mono/stereo x 22.05/44.1 kHz), in the page cache (written just before). "
        f"Warm: every variant ran once untimed first, so imports, librosa's caches and the loky "
        f"worker pool ({jobs} workers, reused by joblib across calls) are warm; each timed "
        f"extraction writes a fresh store. {repeats} interleaved repeats, variant order rotated."
    )
    return GroupResult("extraction speed", figures, method=method, profile=profile.strip())


def run_memory(work: Path, *, short_seconds: float, long_seconds: float, repeats: int) -> GroupResult:
    """Peak RSS (VmHWM) of a fresh process running the worker on one short and one long file."""
    from pipeline.testing import write_music_like

    work.mkdir(parents=True, exist_ok=True)
    files = {
        "short": write_music_like(work / "short.wav", short_seconds, seed=11, sr=44100, loop_seconds=20.0),
        "long": write_music_like(work / "long.wav", long_seconds, seed=12, sr=44100, loop_seconds=20.0),
    }
    hwm: dict[str, list[int]] = {"short": [], "long": []}
    raw: dict[str, list[dict[str, Any]]] = {"short": [], "long": []}
    for r in range(repeats):
        for name in rotated(["short", "long"], r):
            d = work / f"probe-{name}-{r}"
            d.mkdir()
            res = run_probe(["extract-mem", str(files[name]), str(d)])
            shutil.rmtree(d, ignore_errors=True)
            hwm[name].append(res["hwm_kib"])
            raw[name].append(res)
    short, long = median(hwm["short"]) * 1024, median(hwm["long"]) * 1024
    growth_mb = (long - short) / 1e6
    for f in files.values():
        f.unlink()
    fig = Figure(
        "extract_memory_growth_2h",
        f"Extraction worker peak memory: {long_seconds / 60:.3g}-min file vs {short_seconds / 60:.3g}-min file",
        round(growth_mb, 1),
        "MB",
        f"VmHWM of a fresh process running pipeline.tasks.run_task (log-mel, one file, 44.1 kHz mono WAV "
        f"resampled to 22.05 kHz) on a {long_seconds / 60:.3g}-minute file minus the same on a "
        f"{short_seconds / 60:.3g}-minute file (MB = 10^6 bytes); features go to the shard block by block",
        target=50.0,
        op="<=",
        details={
            "short_seconds": short_seconds,
            "long_seconds": long_seconds,
            "repeats": repeats,
            "vm_hwm_mib": {"short": round(short / 2**20, 1), "long": round(long / 2**20, 1)},
            "vm_hwm_after_imports_mib": round(median([r["hwm_before_kib"] for r in raw["short"]]) / 1024, 1),
            "float16_output_mb": round((1 + long_seconds * SR // 512) * 128 * 2 / 1e6, 1),
            "float32_output_mb": round((1 + long_seconds * SR // 512) * 128 * 4 / 1e6, 1),
        },
    )
    method = (
        "Each file is processed by the worker function in its own fresh interpreter "
        "(python -m benchmarks.bench_probe extract-mem); VmHWM is the process's RSS high-water "
        "mark, imports included, so the difference isolates what grows with the file's length. "
        f"{repeats} repeat(s), median."
    )
    return GroupResult("extraction memory", [fig], method=method)

"""The extraction variants the speed figures time (naive loop, joblib loop, pipeline.extract, decode floor) and
their diagnostics: the generated corpus, the dB difference, bare scaling, a task timeline, the checksum share,
a profile (see bench_extract)."""

from __future__ import annotations

import cProfile
import io
import multiprocessing
import os
import pstats
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np

from .bench_common import median

__all__ = ["COMBOS", "SR", "Isolated", "audio_seconds", "decode_only", "features_of", "make_corpus", "naive_one",
           "scaling_on", "timed_call"]


SR = 22050

# (format, sample rate, channels): every combination appears in the corpus.
COMBOS = [(fmt, sr, ch) for fmt in ("wav", "flac", "ogg", "mp3") for sr in (22050, 44100) for ch in (1, 2)]


def _write_one(path: str, seconds: float, seed: int, sr: int, channels: int) -> str:
    from specstore.pipeline.testing import write_music_like

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

    from specstore.store import FeatureSpec

    s = FeatureSpec.mel()
    y, sr = librosa.load(src, sr=s.sample_rate, mono=True)
    mel = librosa.feature.melspectrogram(y=y, sr=sr, n_fft=int(s.n_fft or 2048), hop_length=s.hop_length,
                                         n_mels=s.n_bins, fmin=s.fmin, fmax=s.fmax, power=s.power)
    np.save(out, librosa.power_to_db(mel, ref=s.db_ref, amin=s.amin, top_db=None))
    return len(y) / sr


def audio_seconds(files: list[Path]) -> float:
    """Seconds of audio in ``files`` (their headers)."""
    import soundfile as sf

    return float(sum(sf.info(str(f)).duration for f in files))


def decode_only(src: str) -> int:
    """Decode ``src`` with soundfile in the pipeline's block size; nothing else."""
    import soundfile as sf

    from specstore.pipeline.audio import DEFAULT_BLOCK_SAMPLES

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

    def ours(self, jobs: int, checksums: bool = True, features: tuple[str, ...] = ("mel",),
             executor: Any = None) -> Path:
        """pipeline.extract with ``jobs`` workers (on ``executor`` when given: the timeline's)."""
        from contextlib import ExitStack
        from unittest import mock

        from specstore.pipeline.extract import extract

        out = self._fresh(f"ours{jobs}")
        with ExitStack() as stack:
            if not checksums:  # jobs=1 runs in this process: the shard writer's CRC becomes a constant
                assert jobs == 1
                stack.enter_context(mock.patch("specstore.store.shard_writer.crc32c", lambda data, crc=0: 0))
            summary = extract(self.corpus, str(out), features=features, jobs=jobs, progress=False, executor=executor)
        if summary.errors or summary.decoded != len(self.files):
            raise RuntimeError(f"extraction failed: {summary.report()}")
        return out

    def lhotse(self, jobs: int) -> Path:
        """lhotse's own pipeline: ``LibrosaFbank`` (128 mels, n_fft 2048, hop 512 at 22 050 Hz, as our log-mel)
        through ``CutSet.compute_and_store_features`` with ``jobs`` processes (its own pool)."""
        import logging

        from lhotse import CutSet, LibrosaFbank, LibrosaFbankConfig, Recording, RecordingSet

        out = self._fresh(f"lhotse{jobs}")
        logging.getLogger().setLevel(max(logging.getLogger().level, logging.ERROR))  # its per-call thread warning
        recs = RecordingSet.from_recordings(Recording.from_file(f) for f in self.files)
        cuts = CutSet.from_cuts(c.to_mono(mono_downmix=True) if c.num_channels > 1 else c
                                for c in CutSet.from_manifests(recordings=recs)).resample(SR)
        ext = LibrosaFbank(LibrosaFbankConfig(num_mel_bins=128, fft_size=2048, hop_size=512, sampling_rate=SR))
        done = cuts.compute_and_store_features(extractor=ext, storage_path=str(out), num_jobs=jobs,
                                              progress_bar=False)
        if len(done) != len(self.files):
            raise RuntimeError(f"lhotse extracted {len(done)} of {len(self.files)} files")
        return out

    def floor(self) -> None:
        for f in self.files:
            decode_only(str(f))

    def floor_load(self) -> None:
        """Loading the audio as a user's loop does before any feature: ``librosa.load`` at the features' rate
        (decoding, downmix, soxr_hq resampling of the 44.1 kHz files), nothing else."""
        import librosa

        for f in self.files:
            librosa.load(str(f), sr=SR, mono=True)


def _serve(conn: Any, runs: _Runs) -> None:
    """The loop of an :class:`Isolated` child: call the method asked for, answer (status, result, CPU seconds)."""
    while True:
        msg = conn.recv()
        if msg is None:
            return
        method, args, kwargs = msg
        c0 = time.process_time()
        try:
            out = getattr(runs, method)(*args, **kwargs)
            conn.send(("ok", out, time.process_time() - c0))
        except Exception as e:  # the bench process raises it
            conn.send(("error", f"{type(e).__name__}: {e}", 0.0))


class Isolated:
    """One variant run in a persistent child process of its own, warm across repeats.

    What one variant does to its process shapes the next one's if they share it: glibc raises its heap
    thresholds after the naive loop frees whole decoded files (17 MB), which spared every later variant the
    page faults a new process pays, and the extraction's own setting (``specstore.common.heap``) would in turn be
    inherited by the floor and the naive loop.  Each single-process variant therefore runs in its own child
    (the benchmark's process tree, so :class:`CpuWindow` still counts it); ``cpu`` is the child's CPU seconds
    in the last call.
    """

    def __init__(self, runs: _Runs, name: str, method: str, *args: Any, **kwargs: Any) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        own = _Runs(runs.corpus, runs.files, runs.work / name, runs.jobs)  # output paths of its own
        self.proc = ctx.Process(target=_serve, args=(child, own), daemon=True, name=f"bench-{name}")
        self.proc.start()
        child.close()
        self.name, self.call, self.cpu = name, (method, args, kwargs), 0.0

    def __call__(self) -> Any:
        self.conn.send(self.call)
        status, out, cpu = self.conn.recv()
        if status != "ok":
            raise RuntimeError(f"variant {self.name}: {out}")
        self.cpu = cpu
        return out

    def close(self) -> None:
        try:
            self.conn.send(None)
        except OSError:
            pass
        self.proc.join(30)
        if self.proc.is_alive():
            self.proc.kill()


def _max_db_difference(store: Path, naive_dir: Path, corpus: Path, files: list[Path]) -> float:
    """Largest |ours - naive| in dB over one file of each format (ours is stored float16)."""
    from specstore.store import open_store

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
    """compute_features (log-mel, float16 out) on ``paths`` in this process; returns its CPU seconds.

    compute_features sets the heap as an extraction does (``specstore.common.heap.keep_freed_blocks``), wherever
    it runs: the bare work of one process and of several does not depend on what their processes did before.
    """
    from specstore.pipeline.features import compute_features
    from specstore.store import FeatureSpec

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


def scaling_on(work: Path, n_files: int, mean_seconds: float, jobs: int, repeats: int) -> dict[str, Any]:
    """jobs=1 against jobs=``jobs`` extraction (interleaved, fresh stores) and the bare work's scaling, on a
    corpus of its own: how the speed-up behaves once the driver's per-run costs weigh less."""
    corpus = work / "corpus"
    files = make_corpus(corpus, n_files, mean_seconds, jobs)
    runs = _Runs(corpus, files, work / "out", jobs)
    shutil.rmtree(runs.ours(1), ignore_errors=True)  # warm-up: the page cache, this process's imports
    one: list[float] = []
    many: list[float] = []
    for r in range(repeats):
        for n, acc in (((1, one), (jobs, many)) if r % 2 == 0 else ((jobs, many), (1, one))):
            t0 = time.perf_counter()
            out = runs.ours(n)
            acc.append(time.perf_counter() - t0)
            shutil.rmtree(out, ignore_errors=True)
    bare = _bare_scaling(files, jobs, repeats)
    speedup = median([a / b for a, b in zip(one, many, strict=False)])
    return {"files": len(files), "audio_seconds": round(audio_seconds(files), 1),
            "speedup": round(speedup, 3), "bare_speedup": bare["speedup"],
            "fraction_of_bare": round(speedup / bare["speedup"], 3),
            "times_s": {"jobs1": [round(x, 3) for x in one], f"jobs{jobs}": [round(x, 3) for x in many]},
            "bare_work_scaling": bare, "timeline": _timeline(runs, jobs)}


def timed_call(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` (an extraction task), with the task's (start, end, pid) attached to its result
    (wall clock)."""
    t0 = time.time()
    res = fn(*args, **kwargs)
    res.bench_span = (t0, time.time(), os.getpid())
    return res


def _timed_executor(jobs: int, spans: list[tuple[float, float, int]]) -> Any:
    """The executor extraction would use with ``jobs`` workers, each task timed (:func:`timed_call`) and its
    span appended to ``spans`` as its result comes back: passed to the run, no hook in the driver."""
    from specstore.common.executors import Executor, open_executor

    class Timed(Executor):
        def __init__(self) -> None:
            self.inner = open_executor("loky", jobs)
            self.in_process = self.inner.in_process

        def submit(self, fn: Any, /, *args: Any, key: str | None = None, retries: int = 0, **kwargs: Any) -> Any:
            return self.inner.submit(timed_call, fn, *args, key=key, retries=retries, **kwargs)

        def as_completed(self, futures: Any, timeout: float | None = None) -> Any:
            for f in self.inner.as_completed(futures, timeout):
                span = getattr(f.result(), "bench_span", None) if f.exception() is None else None
                if span:
                    spans.append(span)
                yield f

        def live_workers(self) -> int:
            return self.inner.live_workers()

        def describe(self) -> str:
            return self.inner.describe()

        def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
            self.inner.shutdown(wait, cancel_futures=cancel_futures)

    return Timed()


def _timeline(runs: _Runs, jobs: int) -> dict[str, Any]:
    """One extraction with every task's start and end recorded: where a jobs=N run spends its wall time.

    The run is given an executor that times each task (:func:`_timed_executor`).
    """
    spans: list[tuple[float, float, int]] = []
    with _timed_executor(jobs, spans) as executor:
        t0 = time.time()
        out = runs.ours(jobs, executor=executor)
        t1 = time.time()
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

    import specstore.store.shard_writer as sw

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

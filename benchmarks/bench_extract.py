"""Figures 1-2: extraction speed against the loop users write and the decode floor; worker memory.

Speed: a generated corpus (wav/flac/ogg/mp3, mono/stereo, 22.05/44.1 kHz)
goes through five variants, interleaved in every repeat:

* ``naive``: the per-file loop users write (``librosa.load`` +
  ``melspectrogram`` + ``power_to_db`` + ``np.save``), one process;
* ``naive_jN``: the same loop spread over all cores with joblib;
* ``ours_j1`` / ``ours_jN``: :func:`specstore.pipeline.extract.extract` (log-mel only)
  into a fresh store with ``jobs=1`` / all cores;
* ``floor``: decoding the same files with soundfile (its float32 read; the
  pipeline reads 16-bit PCM WAV faster, as int16) and nothing else;
* ``floor_load``: ``librosa.load`` of the same files at 22 050 Hz, mono (what
  a loop pays to have the audio at the features' rate: decoding, downmix and
  resampling), nothing else.

All compute the same log-mel (the store's default spec: 22 050 Hz, n_fft
2048, hop 512, 128 mels, fmax 8000, dB against 1.0 without top_db).

Checksums: the time one ``ours_j1`` run spends inside the CRC-32C of its
chunks, timed around each call; and, for context, ``ours_j1`` against the
same run with the CRC replaced by a constant (``ours_j1_nosum``),
interleaved like the rest.

Memory: the worker function (:func:`specstore.pipeline.tasks.run_task`) on one
5-minute and one 2-hour file, each in a fresh interpreter; VmHWM.

The variants and their diagnostics live in :mod:`benchmarks.bench_extract_runs`.
"""

from __future__ import annotations

import os
import shutil
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from .bench_common import CpuWindow, Figure, GroupResult, log, median, rotated, run_probe
from .bench_extract_runs import (
    SR,
    Isolated,
    _bare_scaling,
    _checksum_share,
    _max_db_difference,
    _profile_extract,
    _Runs,
    _timeline,
    audio_seconds,
    make_corpus,
    scaling_on,
)

Series = dict[str, list[float]]
"""Variant name -> one value per repeat."""


def run_speed(work: Path, *, n_files: int, mean_seconds: float, repeats: int, lhotse_pool: bool = True,
              longer: int = 4) -> GroupResult:
    """The speed figures; ``lhotse_pool=False`` (the smoke run) leaves out lhotse with N jobs, whose own
    process pool imports torch in every worker on each call (seconds, even for tiny files). The jobs=N
    scaling is measured again on a corpus ``longer`` times the files (0: not)."""
    from joblib import parallel_config

    jobs = len(os.sched_getaffinity(0))
    corpus = work / "corpus"
    t0 = time.perf_counter()
    # One joblib configuration for the whole group, the one extract()'s loky executor asks for
    # (specstore.common.executors.LokyExecutor), so one pool of workers is started and stays warm.
    with parallel_config(backend="loky", n_jobs=jobs, inner_max_num_threads=1), ExitStack() as stack:
        files = make_corpus(corpus, n_files, mean_seconds, jobs)
        gen_seconds = time.perf_counter() - t0
        audio = audio_seconds(files)
        size = sum(f.stat().st_size for f in files)
        runs = _Runs(corpus, files, work / "out", jobs)
        variants = _variants(runs, jobs, lhotse_pool, stack)
        # Warm-up (untimed): imports, librosa's caches, the loky workers, the page cache.
        outs = {name: fn() for name, fn in variants.items()}
        max_diff = _max_db_difference(outs["ours_j1"], outs["naive"], corpus, files)
        # A rerun over a complete store decodes nothing: the driver's serial work (scan + hash).
        with CpuWindow() as serial:
            from specstore.pipeline.extract import extract

            extract(corpus, str(outs["ours_j1"]), features=("mel",), jobs=jobs, progress=False)
        for out in outs.values():
            if out is not None:
                shutil.rmtree(out, ignore_errors=True)

        times: dict[str, list[float]] = {k: [] for k in variants}
        own: dict[str, list[float]] = {k: [] for k in variants}
        foreign: dict[str, list[float]] = {k: [] for k in variants}
        pcpu: dict[str, list[float]] = {k: [] for k in variants}  # CPU s of the process running the variant
        for r in range(repeats):
            for name in rotated(list(variants), r):
                c0 = time.process_time()
                with CpuWindow() as w:
                    out = variants[name]()
                v = variants[name]
                pcpu[name].append(v.cpu if isinstance(v, Isolated) else time.process_time() - c0)
                times[name].append(w.wall)
                own[name].append(w.own_cores)
                foreign[name].append(w.foreign_cores)
                if out is not None:
                    shutil.rmtree(out, ignore_errors=True)
            log.info("extraction repeat %d/%d: %s", r + 1, repeats,
                     ", ".join(f"{k} {audio / times[k][-1]:.0f}x" for k in variants))

        figures, common, speed = _jobs1_figures(runs, files, times, own, foreign, audio, size, repeats, jobs,
                                                max_diff, serial.wall, gen_seconds, pcpu)
        figures += _peer_figures(times, pcpu, speed, jobs)
        profile = ""
        if jobs > 1:
            more, profile = _parallel_figures(runs, files, times, common, speed, jobs, repeats, serial.wall)
            figures += more
            if longer:
                figures.append(_longer_figure(work / "longer", longer * n_files, mean_seconds, jobs,
                                              max(1, min(3, repeats))))
        profile = _stage_text(corpus, files, work / "stages") + ("\n\n" + profile if profile else "")
        if not figures[0].met:
            profile += (
                "\n\njobs=1 missed its target; profile of one jobs=1 run (top by own time):\n\n"
                + _profile_extract(runs, 1)
            )
    method = (
        f"{len(files)} generated files ({audio / 60:.1f} min of audio, {size / 2**20:.0f} MiB: "
        f"wav/flac/ogg/mp3 x mono/stereo x 22.05/44.1 kHz), in the page cache (written just before). "
        f"Warm: every variant ran once untimed first, so imports, librosa's caches and the loky "
        f"worker pool ({jobs} workers, reused by joblib across calls) are warm; each single-process "
        f"variant (naive, ours_j1, floor, floor_load, melcqt_j1, lhotse_j1) runs in a warm child process of its "
        f"own, "
        f"so none inherits another's heap settings (what the naive loop's whole-file arrays make glibc "
        f"keep, or the extraction's own setting); each timed extraction writes a fresh store. "
        f"{repeats} interleaved repeats, variant order rotated."
    )
    return GroupResult("extraction speed", figures, method=method, profile=profile.strip())


def _variants(runs: _Runs, jobs: int, lhotse_pool: bool, stack: ExitStack) -> dict[str, Any]:
    """The timed variants by name: the single-process ones each in a warm child of its own (:class:`Isolated`:
    none inherits another's heap settings), closed with ``stack``; the jobs=N ones from here, on the shared
    loky pool (left out on one core, and lhotse's when ``lhotse_pool`` is False)."""
    isolated = [Isolated(runs, "naive", "naive"), Isolated(runs, "ours_j1", "ours", 1),
                Isolated(runs, "floor", "floor"), Isolated(runs, "floor_load", "floor_load"),
                Isolated(runs, "ours_j1_nosum", "ours", 1, checksums=False),
                Isolated(runs, "melcqt_j1", "ours", 1, features=("mel", "cqt")),
                Isolated(runs, "lhotse_j1", "lhotse", 1)]
    for v in isolated:
        stack.callback(v.close)
    variants: dict[str, Any] = {v.name: v for v in isolated}
    if jobs > 1:
        variants.update({"ours_jN": lambda: runs.ours(jobs), "naive_jN": runs.naive_parallel,
                         "melcqt_jN": lambda: runs.ours(jobs, features=("mel", "cqt"))})
        if lhotse_pool:
            variants["lhotse_jN"] = lambda: runs.lhotse(jobs)
    return variants


def _jobs1_figures(runs: _Runs, files: list[Path], times: Series, own: Series, foreign: Series, audio: float,
                   size: int, repeats: int, jobs: int, max_diff: float, serial_s: float,
                   gen_seconds: float, own_cpu: Series) -> tuple[list[Figure], dict[str, Any], dict[str, float]]:
    """The jobs=1 figures (time vs naive, checksum cost, decode floor), the details they share, and each
    variant's speed (x realtime); measures the checksum share with one more jobs=1 run."""
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
        "serial_rerun_seconds": round(serial_s, 3), "corpus_generation_seconds": round(gen_seconds, 1),
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
               "decode-only (soundfile's float32 read in the pipeline's block size, same files, one process) "
               "time / pipeline.extract(jobs=1) time: "
               "1.0 would mean features cost nothing beyond decoding",
               details={"speed_x_realtime": speed, "cpu_fraction": _cpu_ratio(own_cpu, "floor", "ours_j1")}),
    ]
    return figures, common, speed


def _cpu_ratio(cpu: Series, a: str, b: str) -> float:
    """Median per-repeat ratio of the CPU seconds of the process each jobs=1 variant runs in (all its work is
    there) in variants ``a`` and ``b``: on a shared machine steadier than the wall-time ratio."""
    return round(median([x / max(y, 1e-9) for x, y in zip(cpu[a], cpu[b], strict=False)]), 3)


def _peer_figures(times: Series, own_cpu: Series, speed: dict[str, float], jobs: int) -> list[Figure]:
    """mel + CQT (the default specs) against decode-only, and lhotse's log-mel beside ours (same run)."""
    def ratio(a: str, b: str) -> float:
        return round(median([x / y for x, y in zip(times[a], times[b], strict=False)]), 3)

    figs = [Figure("extract_melcqt_jobs1_vs_decode_floor",
                   "Extraction jobs=1, mel + CQT (default specs): speed as a fraction of decode-only",
                   ratio("floor", "melcqt_j1"), "fraction",
                   "decode-only time / pipeline.extract(jobs=1, features=(mel, cqt)) time, same files",
                   details={"speed_x_realtime": speed,
                            "cpu_fraction": _cpu_ratio(own_cpu, "floor", "melcqt_j1")}),
            Figure("extract_jobs1_vs_librosa_load",
                   "Extraction jobs=1, log-mel: speed as a fraction of loading the audio with librosa.load",
                   ratio("floor_load", "ours_j1"), "fraction",
                   "librosa.load(path, sr=22050, mono=True) of every file (decoding, downmix, soxr_hq "
                   "resampling; no feature) time / pipeline.extract(jobs=1, log-mel) time, same files. A looser "
                   "floor than decode-only (soundfile alone, above): the figure for mel + CQT is in the details",
                   details={"melcqt_fraction": ratio("floor_load", "melcqt_j1"),
                            "cpu_fraction": _cpu_ratio(own_cpu, "floor_load", "ours_j1"),
                            "load_over_decode_only": ratio("floor_load", "floor")}),
            Figure("extract_jobs1_vs_lhotse", "Extraction jobs=1, log-mel: speed vs lhotse's LibrosaFbank",
                   ratio("lhotse_j1", "ours_j1"), "x",
                   "lhotse CutSet.compute_and_store_features(LibrosaFbank(128 mels, n_fft 2048, hop 512, "
                   "22 050 Hz), num_jobs=1) time / pipeline.extract(jobs=1, log-mel) time, same files "
                   "(lhotse's manifest building included: it is part of its pipeline)",
                   details={"speed_x_realtime": speed})]
    if "lhotse_jN" in times:
        figs.append(Figure(f"extract_jobs{jobs}_vs_lhotse_jobs{jobs}",
                           f"Extraction jobs={jobs}, log-mel: speed vs lhotse's LibrosaFbank with {jobs} jobs",
                           ratio("lhotse_jN", "ours_jN"), "x",
                           f"lhotse compute_and_store_features(num_jobs={jobs}) time / "
                           f"pipeline.extract(jobs={jobs}) time (lhotse starts its own process pool per call)",
                           details={"speed_x_realtime": speed}))
    return figs


def _stage_text(corpus: Path, files: list[Path], work: Path) -> str:
    """The per-stage profile of one jobs=1 run, log-mel and mel + CQT, as a markdown table."""
    from .bench_extract_stages import stage_profile, stage_table

    profs = {"log-mel": stage_profile(corpus, files, work, ("mel",)),
             "mel+CQT": stage_profile(corpus, files, work, ("mel", "cqt"))}
    share = ", ".join(f"{k} {v['timed_share_of_run']:.0%} of a run's {v['run_cpu_s']:.2f} CPU s "
                      f"({v['run_wall_s']:.2f} s wall)" for k, v in profs.items())
    return ("Per stage, one jobs=1 run each (CPU ms per minute of audio, exclusive: a stage nested in "
            f"another is not counted twice; the stages cover {share}, the rest being the driver's scan, hash "
            "threads, store set-up and commits):\n\n" + stage_table(profs))


def _parallel_figures(runs: _Runs, files: list[Path], times: Series, common: dict[str, Any],
                      speed: dict[str, float], jobs: int, repeats: int, serial_s: float) -> tuple[list[Figure], str]:
    """The jobs=N figures (speed-up over jobs=1, vs the naive loop on joblib) and, when the speed-up misses its
    target, the profile text explaining where the time went (bare scaling and a task timeline, measured)."""
    figures: list[Figure] = []
    profile = ""
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
    bare = _bare_scaling(files, jobs, repeats=max(1, min(3, repeats)))
    fig.details["bare_work_scaling"] = bare
    scaled = Figure(f"extract_jobs{jobs}_vs_bare_scaling",
                    f"Extraction jobs={jobs}: speed-up as a fraction of the machine's bare scaling",
                    round(fig.value / bare["speedup"], 3), "fraction",
                    f"the jobs=1 -> jobs={jobs} speed-up above / the speed-up of the bare per-file work "
                    f"(decode + log-mel in {jobs} processes on groups of equal single-core time, no driver, "
                    f"no store), measured in the same run", target=0.95, op=">=", details=bare)
    figures.append(scaled)
    if not (fig.met and scaled.met):
        timeline = _timeline(runs, jobs)
        profile = (f"jobs={jobs} missed a target. The bare per-file work (decode + log-mel in "
                   f"{jobs} processes on groups of equal single-core time, no driver, no store) scales "
                   f"{bare['speedup']:.2f}x here: that is what these {jobs} cores give this workload. "
                   f"During the jobs={jobs} runs this process tree used "
                   f"{common['own_cores']['ours_jN']:.2f} cores (of {jobs}) while other processes "
                   f"used {common['foreign_cores']['ours_jN']:.2f}; the driver's serial part (scan + "
                   f"hash + commit, measured as a no-op rerun) takes {serial_s:.2f} s of the "
                   f"{median(times['ours_jN']):.2f} s run.\n\nTimeline of one more jobs={jobs} run "
                   f"(every task's start and end, wall clock):\n\n"
                   + "\n".join(f"  {k}: {v}" for k, v in timeline.items()))
        if timeline:
            profile += (
                "\n\nWhat the driver leaves on the table: "
                f"{timeline['before_first_task_s (scan, hash, plan)']} s "
                f"before the first task starts (the whole corpus is hashed, on every core, before any "
                f"decoding), {timeline['after_last_task_s (final commit)']} s after the last (the final "
                f"commit) and {timeline['worker_idle_in_tasks_phase_s']} s of worker idle time while the "
                f"last of {timeline['tasks']} tasks (shrinking towards the end) finish, out of a "
                f"{timeline['wall_s']} s run; each task also writes a shard of its own (zarr metadata, a "
                f"few ms)."
            )
    return figures, profile


def _longer_figure(work: Path, n_files: int, mean_seconds: float, jobs: int, repeats: int) -> Figure:
    """The jobs=N speed-up as a fraction of bare scaling again, on a corpus of ``n_files`` (its own run)."""
    res = scaling_on(work, n_files, mean_seconds, jobs, repeats)
    shutil.rmtree(work, ignore_errors=True)
    return Figure(f"extract_jobs{jobs}_vs_bare_scaling_longer",
                  f"Extraction jobs={jobs}: speed-up as a fraction of bare scaling, "
                  f"{res['audio_seconds'] / 60:.0f}-minute corpus",
                  res["fraction_of_bare"], "fraction",
                  f"as extract_jobs{jobs}_vs_bare_scaling, on a generated corpus of {res['files']} files (the same "
                  f"mix, {res['audio_seconds'] / 60:.0f} min of audio), jobs=1 and jobs={jobs} interleaved "
                  f"({repeats} each) and the bare work's scaling on the same files, all in this run: the driver's "
                  f"per-run costs (scan, hashing, store set-up, final commit) weigh less than on the corpus above",
                  target=0.95, op=">=", details=res)


def run_memory(work: Path, *, short_seconds: float, long_seconds: float, repeats: int) -> GroupResult:
    """Peak RSS (VmHWM) of a fresh process running the worker on one short and one long file."""
    from specstore.pipeline.testing import write_music_like

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

"""Figure 6: reading clips back: a raw store (mmap), a zstd store (zarr), one .npy file per clip.

The same synthetic float16 clips are written three ways.  A *read* is
getting one clip's values into a private ndarray: ``np.array(view.frames(i))``
for the raw store (the mmap view copied, so its pages are really touched),
``view.frames(i)`` for the zstd store (zarr decompresses into a new array),
``np.load(path)`` for the .npy files.  All three are in the page cache
(written just before, then read once untimed): these are warm-cache
figures; a cold read would be dominated by the disk.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .bench_common import Figure, GroupResult, log, median, rotated
from .bench_infer_data import make_store, synthetic_features
from .bench_plan import FPS


def _dir_bytes(p: Path) -> int:
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())


def run(work: Path, *, n_clips: int, n_reads: int, repeats: int) -> GroupResult:
    from specstore.store import open_store

    work.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(5)
    lengths = np.round(rng.uniform(15.0, 60.0, n_clips) * FPS).astype(np.int64)
    raw_path = make_store(work / "raw.zarr", lengths, seed=1, layout="raw")
    zstd_path = make_store(work / "zstd.zarr", lengths, seed=1, layout="zstd")
    npy_dir = work / "npy"
    npy_dir.mkdir()
    for s0 in range(0, n_clips, 64):
        for k, a in enumerate(synthetic_features(lengths[s0:s0 + 64], 128, 1 + s0)):
            np.save(npy_dir / f"{s0 + k:06d}.npy", a)
    raw, zstd = open_store(raw_path), open_store(zstd_path)
    raw_view, zstd_view = raw.feature("mel"), zstd.feature("mel")
    # Store rows are sorted by path; map clip k (write order) to its row in each store.
    row_raw = {h: i for i, h in enumerate(raw.hashes)}
    row_zstd = {h: i for i, h in enumerate(zstd.hashes)}
    order_raw = np.array([row_raw[f"h{k:07d}"] for k in range(n_clips)])
    order_zstd = np.array([row_zstd[f"h{k:07d}"] for k in range(n_clips)])
    npy_paths = [str(npy_dir / f"{k:06d}.npy") for k in range(n_clips)]

    readers: dict[str, Callable[[int], np.ndarray]] = {
        "raw": lambda k: np.array(raw_view.frames(int(order_raw[k]))),
        "zstd": lambda k: zstd_view.frames(int(order_zstd[k])),
        "npy": lambda k: np.load(npy_paths[k], allow_pickle=False),
    }
    # Same values three ways (and the warm-up pass that puts everything in the page cache).
    for k in range(n_clips):
        a, b, c = (readers[v](k) for v in ("raw", "zstd", "npy"))
        if not (np.array_equal(a, c) and np.array_equal(b, c)):
            raise RuntimeError(f"clip {k} differs between layouts")
    bytes_total = int(lengths.sum()) * 128 * 2

    ids = rng.integers(0, n_clips, n_reads)
    lat, scan = _time_reads(readers, ids, n_clips, repeats)
    p50 = {v: float(np.percentile(x, 50)) for v, x in lat.items()}
    p99 = {v: float(np.percentile(x, 99)) for v, x in lat.items()}
    mbps = {v: bytes_total / median(x) / 1e6 for v, x in scan.items()}
    sizes = {"raw": _dir_bytes(raw_path), "zstd": _dir_bytes(zstd_path), "npy": _dir_bytes(npy_dir)}
    details: dict[str, Any] = {
        "clips": n_clips, "clip_seconds": "15-60 (uniform)", "random_reads_per_variant": n_reads * repeats,
        "p50_ms": {v: round(x * 1e3, 4) for v, x in p50.items()},
        "p99_ms": {v: round(x * 1e3, 4) for v, x in p99.items()},
        "scan_mb_per_s": {v: round(x, 1) for v, x in mbps.items()},
        "bytes_on_disk": sizes, "feature_bytes": bytes_total,
        "zero_copy_view_p50_ms": None, "cache": "warm (page cache)",
    }
    t = []
    for k in ids[:2000].tolist():
        t0 = time.perf_counter()
        raw_view.frames(int(order_raw[k]))
        t.append(time.perf_counter() - t0)
    details["zero_copy_view_p50_ms"] = round(float(np.percentile(t, 50)) * 1e3, 4)
    details["zstd_one_frame_read_p50_ms"] = _zstd_one_frame_p50_ms(zstd_path, zstd, order_zstd, ids)
    for p in (raw_path, zstd_path, npy_dir):
        shutil.rmtree(p, ignore_errors=True)
    figures = _figures(p50, p99, mbps, sizes, details)
    method = (
        f"{n_clips} clips of 15-60 s (128 float16 bins; {bytes_total / 2**20:.0f} MiB of features) written as "
        f"a raw store, a zstd store (64 clips per shard) and one .npy per clip. Warm page cache. "
        f"{n_reads} random clips per repeat, the three readers taking turns on each; then a full scan of "
        f"each; {repeats} repeats. The raw store's reader itself returns a zero-copy view "
        f"(p50 {details['zero_copy_view_p50_ms']} ms); the figures copy it so every variant touches the data."
    )
    return GroupResult("store reads", figures, method=method)


def _time_reads(readers: dict[str, Callable[[int], np.ndarray]], ids: np.ndarray, n_clips: int,
                repeats: int) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Per reader: the latency (s) of every random read of clips ``ids``, and the time (s) of each full scan."""
    lat: dict[str, list[float]] = {v: [] for v in readers}
    scan: dict[str, list[float]] = {v: [] for v in readers}
    names = list(readers)
    for r in range(repeats):
        # Random reads: the variants take turns on the same clip, order rotating.
        for j, k in enumerate(ids.tolist()):
            for v in rotated(names, r + j):
                t0 = time.perf_counter()
                readers[v](k)
                lat[v].append(time.perf_counter() - t0)
        # Sequential scan of every clip, variants interleaved.
        for v in rotated(names, r):
            t0 = time.perf_counter()
            for k in range(n_clips):
                readers[v](k)
            scan[v].append(time.perf_counter() - t0)
        log.info("reads repeat %d/%d: p50 %s", r + 1, repeats,
                 ", ".join(f"{v} {np.percentile(lat[v], 50) * 1e3:.3f} ms" for v in names))
    return lat, scan


def _zstd_one_frame_p50_ms(zstd_path: Path, zstd: Any, order_zstd: np.ndarray, ids: np.ndarray) -> float:
    """Median time (ms) to read one frame of a zstd shard array, over up to 300 of the random clips."""
    # One frame of a zstd shard array: zarr decompresses its whole chunk all the same.
    import zarr

    from specstore.store.layout import shard_path

    group = zarr.open_group(str(zstd_path), mode="r")
    arrays = [group[shard_path(name, "mel")] for name in zstd.shards]
    t = []
    for k in ids[:300].tolist():
        arr = arrays[int(zstd._shard[order_zstd[k]])]
        o = int(zstd._offset[order_zstd[k]])
        t0 = time.perf_counter()
        arr[o:o + 1]  # type: ignore[index]
        t.append(time.perf_counter() - t0)
    return round(float(np.percentile(t, 50)) * 1e3, 4)


def _figures(p50: dict[str, float], p99: dict[str, float], mbps: dict[str, float], sizes: dict[str, int],
             details: dict[str, Any]) -> list[Figure]:
    """The six read figures from the latencies (s), scan speeds (MB/s) and sizes (bytes) of each layout."""
    return [
        Figure(
            "read_raw_p50_vs_npy",
            "Clip read p50: raw store (mmap) vs one .npy per clip",
            round(p50["npy"] / p50["raw"], 3),
            "x (>1: faster than npy)",
            "median latency of np.load(clip.npy) / median latency of copying a clip out of the raw store",
            target=1.0,
            op=">=",
            details=details,
        ),
        Figure(
            "read_raw_p99_vs_npy",
            "Clip read p99: raw store (mmap) vs one .npy per clip",
            round(p99["npy"] / p99["raw"], 3),
            "x (>1: faster than npy)",
            "99th-percentile latencies, same ratio",
            target=1.0,
            op=">=",
        ),
        Figure(
            "scan_raw_vs_npy",
            "Scan throughput: raw store vs one .npy per clip",
            round(mbps["raw"] / mbps["npy"], 3),
            "x (>1: faster than npy)",
            "MB/s reading every clip in order, raw / npy",
            target=1.0,
            op=">=",
        ),
        Figure(
            "read_zstd_p50_vs_npy",
            "Clip read p50: zstd store (zarr) vs one .npy per clip",
            round(p50["npy"] / p50["zstd"], 3),
            "x (>1: faster than npy)",
            "compressed layout (archives, object stores), read through zarr; reading a single frame costs "
            "about as much (zstd_one_frame_read_p50_ms in the details): the price is per chunk "
            "(4096 frames, decompressed whole), not per byte of the clip",
        ),
        Figure(
            "scan_zstd_vs_npy",
            "Scan throughput: zstd store vs one .npy per clip",
            round(mbps["zstd"] / mbps["npy"], 3),
            "x (>1: faster than npy)",
            "MB/s, zstd / npy",
        ),
        Figure(
            "size_zstd_vs_raw",
            "Store size: zstd vs raw",
            round(sizes["zstd"] / sizes["raw"], 3),
            "fraction",
            "bytes on disk (synthetic features compress less than real ones)",
        ),
    ]

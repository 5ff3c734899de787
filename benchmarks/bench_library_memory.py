"""Library figure 3, ``library_workers_anon_*``: the anonymous memory of DataLoader workers reading a store, each
case in a fresh interpreter (``python -m benchmarks.bench_library anon-probe``, which calls :func:`anon_probe`)."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from .bench_common import ROOT, Figure, log, median, rotated
from .bench_library_shared import _lognormal_frames
from .bench_plan import ALIGN, COST

__all__ = ["anon_probe", "workers_memory"]


def _smaps_kib(pid: int) -> dict[str, int]:
    """RssAnon (status) and Pss_Anon (smaps_rollup) of ``pid`` in KiB; {} if it is gone."""
    out: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    out["rss_anon"] = int(line.split()[1])
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss_Anon:"):
                    out["pss_anon"] = int(line.split()[1])
    except OSError:
        return {}
    return out


class _TreeSampler(threading.Thread):
    """Samples RssAnon and Pss_Anon of this process and its children (psutil) every ``period`` s."""

    def __init__(self, period: float = 0.01) -> None:
        super().__init__(daemon=True)
        import psutil

        self.me = psutil.Process()
        self.period = period
        self.peak = {"rss_anon": 0, "pss_anon": 0}
        self.first: dict[int, dict[str, int]] = {}
        self.worker_peak: dict[int, dict[str, int]] = {}
        self.samples = 0
        self._stop_event = threading.Event()

    def sample(self) -> dict[str, int]:
        import psutil

        total = {"rss_anon": 0, "pss_anon": 0}
        pids = [self.me.pid]
        try:
            pids += [c.pid for c in self.me.children(recursive=True)]
        except psutil.Error:
            pass
        for pid in pids:
            got = _smaps_kib(pid)
            if not got:
                continue
            for k in total:
                total[k] += got.get(k, got.get("rss_anon", 0))
            if pid != self.me.pid:
                self.first.setdefault(pid, dict(got))
                peak = self.worker_peak.setdefault(pid, dict(got))
                for k, v in got.items():
                    peak[k] = max(peak.get(k, 0), v)
        for k in total:
            self.peak[k] = max(self.peak[k], total[k])
        self.samples += 1
        return total

    def run(self) -> None:
        while not self._stop_event.is_set():
            self.sample()
            time.sleep(self.period)

    def stop(self) -> None:
        self._stop_event.set()
        self.join()
        self.sample()


def anon_probe(store: str, workers: int, budget_mb: float, epochs: int = 1) -> dict[str, Any]:
    """``epochs`` epochs of StoreDataset + BudgetBatchSampler + PadCollate over ``specstore.store`` with ``workers``
    workers.

    The workers persist across epochs.  Returns the anonymous memory (KiB) of this process and
    its workers before and at peak.
    """
    import torch
    from torch.utils.data import DataLoader

    from specstore.infer.batching.budget import CostModel
    from specstore.infer.data import BudgetBatchSampler, PadCollate, StoreDataset

    torch.set_num_threads(1)
    ds = StoreDataset(store, "mel")
    sampler = BudgetBatchSampler(ds, budget_mb=budget_mb, cost=CostModel(COST, 0), frame_align=ALIGN,
                                 shuffle=True, seed=0)
    loader = DataLoader(ds, batch_sampler=sampler, collate_fn=PadCollate(ALIGN), num_workers=workers,
                        persistent_workers=workers > 0)
    watch = _TreeSampler()
    base = watch.sample()
    watch.peak = dict(base)
    watch.start()
    t0 = time.perf_counter()
    frames = batches = 0
    largest = 0
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for batch in loader:
            frames += int(batch.lengths.sum())
            batches += 1
            largest = max(largest, batch.x.numel() * batch.x.element_size())
            float(batch.x[:, :, :, :8].sum())  # touch it
    wall = time.perf_counter() - t0
    watch.stop()
    return {"workers": workers, "epochs": epochs, "base_kib": base, "peak_kib": watch.peak, "samples": watch.samples,
            "worker_first_kib": list(watch.first.values()), "worker_peak_kib": list(watch.worker_peak.values()),
            "frames": frames, "batches": batches, "largest_batch_bytes": largest, "wall_seconds": wall}


def _run_anon_probe(store: Path, workers: int, budget_mb: float, epochs: int) -> dict[str, Any]:
    import subprocess

    cmd = [sys.executable, "-m", "benchmarks.bench_library", "anon-probe", str(store), str(workers), str(budget_mb),
           str(epochs)]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=ROOT, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"anon probe failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _store_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def workers_memory(work: Path, *, median_s: float, n_base: int, tiles: tuple[int, int], workers: int,
                   budget_mb: float, repeats: int, seed: int = 5) -> list[Figure]:
    """Anonymous memory (Pss_Anon summed over the process tree) of one epoch with ``workers`` workers and none.

    Both stores hold the same ``n_base`` log-normal clip lengths (median ``median_s``), repeated
    ``tiles[0]`` and ``tiles[1]`` times.  The small store is read for ``tiles[1] // tiles[0]``
    epochs by the same (persistent) workers, the large one for one: both runs process alike
    batches, equally many, so the allocator's warm-up and the batches in flight cancel and the
    difference is what grows with the store's size.  Each case runs ``repeats`` times (medians).
    """
    import psutil

    from .bench_infer_data import make_store

    base = _lognormal_frames(n_base, median_s, seed)
    stores = {"small": make_store(work / "anon-small.zarr", np.tile(base, tiles[0])),
              "large": make_store(work / "anon-large.zarr", np.tile(base, tiles[1]))}
    nbytes = {k: _store_bytes(v) for k, v in stores.items()}
    cases = [("large", 0), ("small", workers), ("large", workers)]
    runs: dict[tuple[str, int], list[dict[str, Any]]] = {c: [] for c in cases}
    for r in range(repeats):
        for key in rotated(cases, r):
            epochs = tiles[1] // tiles[0] if key[0] == "small" else 1
            res = _run_anon_probe(stores[key[0]], key[1], budget_mb, epochs)
            runs[key].append(res)
            log.info("anon probe %s store, %d workers: Pss_Anon %d -> %d MiB, RssAnon %d -> %d MiB", key[0], key[1],
                     res["base_kib"]["pss_anon"] >> 10, res["peak_kib"]["pss_anon"] >> 10,
                     res["base_kib"]["rss_anon"] >> 10, res["peak_kib"]["rss_anon"] >> 10)
    results = {k: v[0] for k, v in runs.items()}

    def growth(key: tuple[str, int], kind: str = "pss_anon") -> float:
        return 1024 * median([r["peak_kib"][kind] - r["base_kib"][kind] for r in runs[key]])

    def worker_rss_growth(key: tuple[str, int]) -> float:
        return 1024 * median([sum(p["rss_anon"] - f["rss_anon"] for f, p in
                                  zip(r["worker_first_kib"], r["worker_peak_kib"], strict=True)) for r in runs[key]])

    slope = (growth(("large", workers)) - growth(("small", workers))) / (nbytes["large"] - nbytes["small"])
    added = growth(("large", workers)) - growth(("large", 0))
    largest_batch = max(r["largest_batch_bytes"] for v in runs.values() for r in v)
    mib = 2**20
    details = {
        "store_mib": {k: round(v / mib, 1) for k, v in nbytes.items()},
        "tree_pss_anon_growth_mib": {f"{s} store, {w} workers": round(growth((s, w)) / mib, 1) for s, w in runs},
        "tree_rss_anon_growth_mib (counts shared copy-on-write pages once per process)": {
            f"{s} store, {w} workers": round(growth((s, w), "rss_anon") / mib, 1) for s, w in runs},
        "workers_rss_anon_growth_from_first_sample_mib": {f"{s} store": round(worker_rss_growth((s, w)) / mib, 1)
                                                          for s, w in runs if w},
        "workers_added_vs_no_workers_mib (large store)": round(added / mib, 1),
        "largest_batch_mib": round(largest_batch / mib, 1), "budget_mib": budget_mb,
        "epoch_seconds": {f"{s} store, {w} workers": round(median([r["wall_seconds"] for r in v]), 2)
                          for (s, w), v in runs.items()},
        "batches": {f"{s} store ({r['epochs']} epochs)": r["batches"] for (s, w), r in results.items() if w},
        "repeats": repeats,
        "psutil": psutil.__version__,
    }
    return [
        Figure("library_workers_anon_per_store_byte",
               f"DataLoader with {workers} workers: anonymous memory per byte of store",
               round(slope, 4), "bytes/byte",
               f"(peak - start) of Pss_Anon summed over the main process and its {workers} DataLoader workers (psutil "
               f"children, /proc/PID/smaps_rollup) while StoreDataset + BudgetBatchSampler + PadCollate read a "
               f"{nbytes['large'] / mib:.0f} MiB store once, minus the same while the same workers read a "
               f"{nbytes['small'] / mib:.0f} MiB store of the same clip lengths {tiles[1] // tiles[0]} times (as many "
               f"alike batches), divided by the difference in store bytes: the part of the workers' memory that "
               f"grows with the store (worker interpreters, allocator warm-up and {budget_mb:g} MiB-budget batches in "
               f"flight cancel); fresh interpreter each, median of {repeats}",
               target=0.10, op="<=", details=details),
        Figure("library_workers_anon_vs_store", f"DataLoader {workers} workers vs 0: added anonymous memory / store",
               round(added / nbytes["large"], 4), "fraction",
               f"Pss_Anon growth of the process tree with {workers} workers minus with 0, over one epoch of the "
               f"{nbytes['large'] / mib:.0f} MiB store, divided by the store's bytes ({added / mib:.0f} MiB: worker "
               "interpreters' private pages and prefetched batches, a fixed cost, not a copy of the store)"),
    ]

"""Memory probes, each run in a fresh interpreter by the benchmarks (never imported by them).

    python -m benchmarks.bench_probe extract-mem AUDIO_FILE WORKDIR
        Runs the pipeline's worker function (:func:`specstore.pipeline.tasks.run_task`,
        log-mel only) on one file into a new store; prints VmHWM before and after.
    python -m benchmarks.bench_probe decode-mem AUDIO_FILE BACKEND
        Decodes one file with :func:`specstore.pipeline.audio.stream_mono` (``backend``
        ``auto`` or ``pyav``, both decoders imported first); prints VmHWM
        before and after.
    python -m benchmarks.bench_probe predict-mem STORE CHECKPOINT CSV
        Runs :func:`specstore.infer.engine.predict.predict` on a store (CPU); prints the peak
        anonymous RSS (RssAnon) sampled every 2 ms by a thread, and predict's own.

The last stdout line is a JSON object.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path


def status_kib(field: str) -> int:
    """A ``/proc/self/status`` figure in KiB (VmHWM: the peak resident set, RssAnon); 0 where absent."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def extract_mem(audio: str, workdir: str) -> dict[str, object]:
    from specstore.pipeline.tasks import TaskItem, run_task
    from specstore.store import FeatureSpec, create_store

    spec = FeatureSpec.mel()
    store = str(Path(workdir) / "mem.zarr")
    create_store(store, {"mel": spec})
    before = status_kib("VmHWM")
    t0 = time.perf_counter()
    res = run_task(store, [TaskItem(audio, "probe")], {"mel": spec.to_dict()}, 60.0)
    wall = time.perf_counter() - t0
    if res.failed:
        raise SystemExit(f"extraction failed: {res.failed}")
    return {"hwm_before_kib": before, "hwm_kib": status_kib("VmHWM"), "audio_seconds": res.seconds,
            "wall_seconds": wall}


def decode_mem(audio: str, backend: str) -> dict[str, object]:
    import av  # noqa: F401  (imported before the baseline, as soundfile is by pipeline.audio)

    from specstore.pipeline.audio import stream_mono

    before = status_kib("VmHWM")
    t0 = time.perf_counter()
    n = sum(len(b) for b in stream_mono(audio, 22_050, backend=backend))
    return {"hwm_before_kib": before, "hwm_kib": status_kib("VmHWM"), "samples": n,
            "wall_seconds": time.perf_counter() - t0}


class _AnonSampler(threading.Thread):
    """Samples RssAnon every ``period`` seconds until stopped; keeps the maximum."""

    def __init__(self, period: float = 0.002) -> None:
        super().__init__(daemon=True)
        self.period = period
        self.peak = 0
        self.samples = 0
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            self.peak = max(self.peak, status_kib("RssAnon"))
            self.samples += 1
            time.sleep(self.period)

    def stop(self) -> None:
        self._stop_event.set()
        self.join()
        self.peak = max(self.peak, status_kib("RssAnon"))


def predict_mem(store: str, checkpoint: str, csv_out: str) -> dict[str, object]:
    from specstore.infer.engine.predict import predict

    base = status_kib("RssAnon")
    sampler = _AnonSampler()
    sampler.start()
    t0 = time.perf_counter()
    pred = predict(store, checkpoint, csv_out, device="cpu", progress=False)
    wall = time.perf_counter() - t0
    sampler.stop()
    return {"rss_anon_base_kib": base, "rss_anon_peak_kib": sampler.peak, "samples": sampler.samples,
            "predict_peak_kib": pred.stats.peak_bytes // 1024, "clips": pred.stats.clips,
            "batches": pred.stats.batches, "wall_seconds": wall,
            "vm_hwm_kib": status_kib("VmHWM")}


def main(argv: list[str]) -> int:
    mode, *args = argv
    if mode == "extract-mem":
        out = extract_mem(*args)
    elif mode == "decode-mem":
        out = decode_mem(*args)
    elif mode == "predict-mem":
        out = predict_mem(*args)
    else:
        raise SystemExit(f"unknown probe {mode!r}")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

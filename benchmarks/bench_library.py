"""Library figures: specstore's data pieces in the user's own PyTorch loop, side by side with the alternatives.

1. **Training throughput** (``library_train_vs_plain``): one epoch of the same model, whole
   clips, through ``StoreDataset`` + ``BudgetBatchSampler(shuffle=True)`` + ``PadCollate`` in a
   ``DataLoader``, against a plain ``DataLoader(dataset, shuffle=True, batch_size=B,
   collate_fn=pad to longest)``.  Both stay within one memory budget: ``B`` is 16, or the
   largest batch size whose worst batch (B clips padded to the longest clip) fits the budget
   when 16 does not (the figure's details say which).
2. **Sampler padding efficiency vs lhotse** (``library_sampler_vs_lhotse``): our
   ``BudgetBatchSampler(shuffle=True)`` against lhotse's own ``DynamicBucketingSampler`` (10
   buckets, shuffled) over dummy cuts of the same lengths, its ``max_duration`` the same
   budget in seconds of padded audio; plus the batches over the budget (ours must be 0).
3. **Anonymous memory of DataLoader workers** (``library_workers_anon_per_store_byte``):
   RssAnon/Pss_Anon of the main process and its workers (psutil), iterating a store with 4
   workers and with none, on a small and a large store, each in a fresh interpreter.
4. **Reader thread vs DataLoader workers** (``library_prefetch_vs_workers1/2``): the same
   inference pass fed by :func:`specstore.infer.data.prefetch` (the built-in commands' loader) and by a
   ``DataLoader`` with 1 and 2 worker processes (information: it backs the default).

Each figure has its module: ``bench_library_train`` (1), ``bench_library_sampler`` (2),
``bench_library_memory`` (3), ``bench_library_loader`` (4); ``bench_library_shared`` holds what they share.
This module runs the group.

The memory probe runs in a fresh interpreter:

    python -m benchmarks.bench_library anon-probe STORE WORKERS BUDGET_MB EPOCHS

Its last stdout line is a JSON object.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from .bench_common import GroupResult
from .bench_library_loader import prefetch_vs_workers
from .bench_library_memory import anon_probe, workers_memory
from .bench_library_sampler import sampler_vs_lhotse
from .bench_library_shared import PLAN_MEDIAN_S
from .bench_library_train import train_throughput

__all__ = ["anon_probe", "main", "prefetch_vs_workers", "run", "sampler_vs_lhotse", "train_throughput",
           "workers_memory"]


def run(work: Path, *, train: dict[str, Any], sampler: dict[str, Any], memory: dict[str, Any],
        loader: dict[str, Any]) -> GroupResult:
    work.mkdir(parents=True, exist_ok=True)
    figures = train_throughput(work, **train)
    figures += sampler_vs_lhotse(**sampler)
    figures += workers_memory(work, **memory)
    figures += prefetch_vs_workers(work, **loader)
    method = (
        "The data pieces of infer.data in a user's own loop. Training: synthetic float16 128-bin stores (no audio), "
        f"clip lengths a stratified log-normal sample (sigma 0.9) at median {train['median_s']:g} s, whole clips, "
        f"{train['repeats']} interleaved repeats of one epoch per variant from the same initial weights. Plans "
        "scale with lengths and budget together, so a median of 60 s under a budget "
        f"{PLAN_MEDIAN_S / train['median_s']:g}x larger gives the same batch shapes; the smaller scale keeps an "
        "epoch of the CNN within the benchmark's time on 2 cores. Sampler: bench_plan's 2 GiB budget at 33 KiB per "
        "padded frame, lhotse's real DynamicBucketingSampler over dummy cuts (no audio). Memory: each case in a "
        "fresh interpreter (python -m benchmarks.bench_library anon-probe), a thread summing Pss_Anon (the "
        "proportional share of anonymous pages, so copy-on-write pages a worker shares with its parent count once) "
        "and RssAnon over the process and its workers every 10 ms; file-backed pages of the memory-mapped store "
        "are not anonymous and are not counted. Loader: the same planned inference batches fed by the reader "
        "thread or by DataLoader workers.")
    return GroupResult("library (users' own PyTorch code)", figures, method=method)


def main(argv: list[str]) -> int:
    if len(argv) == 5 and argv[0] == "anon-probe":
        print(json.dumps(anon_probe(argv[1], int(argv[2]), float(argv[3]), int(argv[4]))))
        return 0
    print("usage: python -m benchmarks.bench_library anon-probe STORE WORKERS BUDGET_MB EPOCHS", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

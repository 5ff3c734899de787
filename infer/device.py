"""Device choice, memory budgets and memory readings for the inference side."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

__all__ = ["Budget", "DeviceError", "anon_rss_bytes", "choose_device", "memory_budget", "set_cpu_threads"]

_MIB = 1 << 20
#: Memory kept free on a GPU beyond the budget (the seed keeps 1.5 GB).
DEFAULT_CUDA_MARGIN = 1536 * _MIB
#: Budget for one batch's activations on CPU unless configured.
DEFAULT_CPU_BUDGET = 2048 * _MIB


class DeviceError(Exception):
    """The requested device is not available; one-line message."""


def choose_device(name: str = "auto") -> torch.device:
    """``auto`` -> CUDA when available, else CPU; ``cpu``/``cuda``/``cuda:N`` as given."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise DeviceError(f"unknown device {name!r}; use auto, cpu or cuda[:N]") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise DeviceError("DEVICE=cuda was asked for but no CUDA GPU is available (use DEVICE=cpu or auto)")
    if dev.type not in ("cpu", "cuda"):
        raise DeviceError(f"device {name!r} is not supported; use auto, cpu or cuda[:N]")
    return dev


@dataclass(frozen=True)
class Budget:
    """Bytes one batch may use on ``device``, and where the figure came from."""

    bytes: int
    source: str


def memory_budget(device: torch.device, budget_mb: float | None = None,
                  margin_mb: float | None = None) -> Budget:
    """The per-batch memory budget.

    CUDA: ``torch.cuda.mem_get_info()`` free bytes minus a safety margin
    (default 1.5 GiB), capped by ``budget_mb`` when given.  CPU: ``budget_mb``
    (default 2048 MiB), a RAM figure the user configures.
    """
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        margin = DEFAULT_CUDA_MARGIN if margin_mb is None else int(margin_mb * _MIB)
        avail = max(free - margin, 64 * _MIB)
        if budget_mb is not None:
            return Budget(min(avail, int(budget_mb * _MIB)), f"min(BUDGET_MB, free GPU memory - {margin // _MIB} MiB)")
        return Budget(avail, f"free GPU memory - {margin // _MIB} MiB margin")
    if budget_mb is not None:
        if budget_mb <= 0:
            raise DeviceError(f"BUDGET_MB must be positive, got {budget_mb}")
        return Budget(int(budget_mb * _MIB), "BUDGET_MB")
    return Budget(DEFAULT_CPU_BUDGET, "default CPU budget")


def set_cpu_threads(threads: int | None) -> int:
    """Use ``threads`` intra-op threads (default: the cores this process may run on)."""
    if threads is None:
        threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    n = threads
    torch.set_num_threads(max(1, int(n)))
    return torch.get_num_threads()


def anon_rss_bytes() -> int:
    """Anonymous resident memory of this process (bytes): heap and tensors, not file-backed page cache.

    Memory-mapped store reads are file-backed and not counted, which is the
    point: they are cache the kernel can drop.  0 where /proc is unavailable.
    """
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0

"""Device, precision and memory: the low-level facts the engine (:mod:`specstore.infer.engine.runtime`) builds on.

* :func:`choose_device`: ``auto``/``cpu``/``cuda[:N]`` to a ``torch.device``;
* :func:`autocast_dtype` and :func:`amp`: the one place that turns a
  ``precision`` setting into an autocast dtype and an autocast context;
* :func:`memory_bytes`: the bytes one batch may use (free GPU memory minus a
  margin, or a configured RAM figure on CPU), and where that figure came from;
* :func:`set_cpu_threads`, :func:`anon_rss_bytes`.
"""

from __future__ import annotations

import contextlib
import math
import os
from typing import Any

import torch

from specstore.common import ConfigError
from specstore.infer.errors import DeviceError
from specstore.infer.options import defaults

__all__ = [
    "DEFAULT_CPU_BUDGET_MB", "DEFAULT_CUDA_MARGIN_MB", "PRECISIONS", "DeviceError", "amp", "anon_rss_bytes",
    "autocast_dtype", "choose_device", "memory_bytes", "set_cpu_threads",
]

_MIB = 1 << 20
DEFAULT_CUDA_MARGIN_MB = defaults.CUDA_MARGIN_MB
"""GPU memory (MiB) kept free beyond the budget (:data:`specstore.infer.options.defaults.CUDA_MARGIN_MB`)."""
DEFAULT_CPU_BUDGET_MB = defaults.CPU_BUDGET_MB
"""Memory (MiB) one batch may use on CPU unless configured (:data:`specstore.infer.options.defaults.CPU_BUDGET_MB`)."""
PRECISIONS = defaults.PRECISIONS
"""``precision`` settings: auto = bf16 autocast on CUDA where supported (else fp16), fp32 on CPU."""


def choose_device(name: str = defaults.DEVICE) -> torch.device:
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


def _positive_mb(value: float | None, name: str) -> float | None:
    if value is None:
        return None
    try:
        mb = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be a number of MiB, got {value!r}") from None
    if not math.isfinite(mb) or mb <= 0:
        raise ConfigError(f"{name} must be a positive, finite number of MiB, got {value!r}")
    return mb


def memory_bytes(device: torch.device, budget_mb: float | None = None,
                 margin_mb: float | None = None) -> tuple[int, str]:
    """Bytes one batch may use on ``device``, and a few words on where the figure came from.

    CUDA: ``torch.cuda.mem_get_info()`` free bytes minus ``margin_mb``
    (default :data:`DEFAULT_CUDA_MARGIN_MB`), capped by ``budget_mb`` when
    given.  CPU: ``budget_mb`` (default :data:`DEFAULT_CPU_BUDGET_MB`), a RAM
    figure the user configures.  Raises :class:`~specstore.common.ConfigError` for a
    budget or margin that is not a positive finite number.
    """
    budget = _positive_mb(budget_mb, "BUDGET_MB (--budget-mb)")
    margin_given = margin_mb is not None
    if margin_given and (not math.isfinite(float(margin_mb)) or float(margin_mb) < 0):  # type: ignore[arg-type]
        raise ConfigError(f"--margin-mb must be a finite number of MiB >= 0, got {margin_mb!r}")
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        margin = int((DEFAULT_CUDA_MARGIN_MB if margin_mb is None else float(margin_mb)) * _MIB)
        avail = max(free - margin, 64 * _MIB)
        if budget is not None:
            return min(avail, int(budget * _MIB)), f"min(BUDGET_MB, free GPU memory - {margin // _MIB} MiB)"
        return avail, f"free GPU memory - {margin // _MIB} MiB margin"
    if budget is not None:
        return int(budget * _MIB), "BUDGET_MB"
    return int(DEFAULT_CPU_BUDGET_MB * _MIB), "default CPU budget"


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype ``precision`` means on ``device`` (None = plain fp32).

    ``auto``: bf16 on CUDA where supported, else fp16; fp32 on CPU.  ``fp16``
    needs CUDA (:class:`~specstore.common.ConfigError` otherwise).
    """
    if precision not in PRECISIONS:
        raise ConfigError(f"precision must be one of {', '.join(PRECISIONS)}, not {precision!r}")
    if precision == "fp32" or (precision == "auto" and device.type == "cpu"):
        return None
    if precision == "fp16":
        if device.type != "cuda":
            raise ConfigError("fp16 autocast needs a CUDA device; use bf16 or fp32 on CPU")
        return torch.float16
    if precision == "auto":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.bfloat16


def amp(device_type: str, dtype: torch.dtype | None) -> contextlib.AbstractContextManager[Any]:
    """``torch.autocast`` to ``dtype`` on ``device_type``, or a no-op context for None (fp32)."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device_type, dtype=dtype)


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

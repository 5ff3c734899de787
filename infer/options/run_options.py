"""What a user chooses about running a model: :class:`RunOptions`, checked without torch.

The options (device, precision, memory budget and margin, batch size and
its price, threads, loader workers) and their bounds live here, apart from the engine
that resolves them (:mod:`specstore.infer.engine.runtime`, which re-exports them), so that a
command refuses a bad value in one line before torch is imported.  Pure: no
torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specstore.common import ConfigError
from specstore.common.limits import bounded, check_fields, field_limit, usable_cores
from specstore.common.options import described, option
from specstore.infer.options import defaults
from specstore.infer.options.defaults import PRECISIONS

__all__ = ["RunOptions", "check_run_option", "optional_mb"]


def optional_mb(text: str) -> float | None:
    """``--budget-mb``: MiB, or none/auto (None: the device's own default, :mod:`specstore.infer.options.defaults`)."""
    return None if text.strip().lower() in ("", "none", "auto") else float(text)


@dataclass(frozen=True)
class RunOptions:
    """How to run a model: chosen by the user, resolved by :class:`~specstore.infer.engine.runtime.Engine`.

    ``device``: ``auto`` (CUDA if available), ``cpu``, ``cuda``, ``cuda:N``.
    ``precision``: ``auto`` (bf16 autocast on CUDA where supported, else
    fp16; fp32 on CPU), ``fp32``, ``bf16`` or ``fp16`` (CUDA only).
    ``budget_mb``: MiB one batch may use (CPU default 2048; on CUDA the free
    memory minus ``margin_mb``, default 1536, capped by ``budget_mb``).
    ``max_batch``: most clips in one batch (default 16).  ``batch_overhead_frames``: the
    planner's price of one more batch, in padded frames (None: the device's
    own, 64 on a CPU, 1024 elsewhere).  Defaults come from
    :mod:`specstore.infer.options.defaults`.  ``threads``: CPU threads (default, and at
    most, the cores this process may use).  ``channels_last``: None = on for
    CPU, where it is faster for these convolutions.  ``loader_workers``:
    batches are read and padded by one prefetch thread (0, the default:
    fastest for mmap-backed stores on a few cores) or by that many
    DataLoader worker processes (for a GPU that one thread cannot keep
    busy).  ``progress``: tqdm bars.
    Every number is bounded (the :class:`~specstore.common.limits.Limit` beside it, the
    reason with it) and checked when the options are made, so every command
    that runs a model refuses a value out of range in one line.
    """

    device: str = option(defaults.DEVICE, "auto (CUDA if available), cpu, cuda, cuda:N")
    precision: str = option(defaults.PRECISION, "auto: bf16/fp16 autocast on CUDA, fp32 on CPU",
                            choices=defaults.PRECISIONS)
    budget_mb: float | None = described(
        bounded(None, 0.0, defaults.MAX_BUDGET_MB, "MiB one batch may use; the planner's byte arithmetic holds up "
                "to 1 TiB", kind=float, low_open=True, optional=True, spelled="BUDGET_MB, --budget-mb"),
        f"memory for one batch, MiB (CPU default {defaults.CPU_BUDGET_MB:g}; CUDA: free memory minus a "
        f"{defaults.CUDA_MARGIN_MB:g} MiB margin)", parse=optional_mb, metavar="MIB")
    margin_mb: float | None = described(
        bounded(None, 0.0, defaults.MAX_BUDGET_MB, "GPU MiB kept free, at most the largest budget", kind=float,
                optional=True, spelled="--margin-mb"),
        "GPU memory kept free, MiB", shown=f"{defaults.CUDA_MARGIN_MB:g}")
    max_batch: int = described(bounded(defaults.MAX_BATCH, 1, defaults.MAX_BATCH_LIMIT, "the planner tries every batch "
                                       "size up to it for every clip", spelled="MAX_BATCH, --max-batch"),
                               "most clips in one batch")
    threads: int | None = described(bounded(None, 1, usable_cores, "the CPU cores this process may use; more threads "
                                            "only compete for them", kind=int, optional=True, spelled="--threads"),
                                    "CPU threads", shown="all cores")
    batch_overhead_frames: float | None = described(
        bounded(None, 0.0, defaults.MAX_BATCH_OVERHEAD_FRAMES, "padded frames; 2**30 frames (290 days at 43 "
                "frames/s) outweighs any batch's padding, so more would act as the same: the fewest batches",
                kind=float, optional=True),
        "the planner's price of one more batch, padded frames",
        shown=f"{defaults.CPU_BATCH_OVERHEAD_FRAMES:g} on a CPU, where batches cost little and may split to save "
              f"padding; {defaults.DEFAULT_BATCH_OVERHEAD_FRAMES:g} on a GPU")
    channels_last: bool | None = None
    loader_workers: int = described(bounded(0, 0, defaults.MAX_LOADER_WORKERS, "DataLoader worker processes, each "
                                            "with its own reader of the store", spelled="--loader-workers"),
                                    "batches are read by a prefetch thread (0) or by this many DataLoader worker "
                                    "processes")
    progress: bool = True

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise ConfigError(f"precision must be one of {', '.join(PRECISIONS)}, not {self.precision!r}")
        check_fields(self)  # budget_mb and margin_mb too: finite, within (0, 1 TiB] and [0, 1 TiB]


def check_run_option(name: str, value: Any, error: type[ConfigError] = ConfigError) -> None:
    """Check a copy of the :class:`RunOptions` setting ``name`` (e.g. the training config's ``max_batch``)
    against that setting's bound, as :class:`RunOptions` would; ``error`` if it is out of bounds."""
    field_limit(RunOptions, name).check(name, value, error)

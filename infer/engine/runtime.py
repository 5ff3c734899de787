"""The engine that prediction, evaluation and training share: device, precision, budget, plan, batch loop.

:class:`RunOptions` (:mod:`specstore.infer.options.run_options`) is what a user chooses (device,
precision, memory budget, batch size, threads); :class:`Engine` is those options resolved on this
machine: the ``torch.device``, the autocast dtype, the memory layout, and
the methods every command calls:

* :meth:`Engine.prepare` puts a model on the device in the chosen layout;
* :meth:`Engine.budget` measures the model's memory cost per padded
  clip-frame (:mod:`specstore.infer.engine.cost`) and returns the :class:`~specstore.infer.batching.budget.Budget`
  that charges its batches (free GPU memory minus a margin, or a RAM figure);
  :meth:`Engine.live_budget` is that budget now (on CUDA, the free memory
  read again), the one a long-running server plans its next batch under;
* :attr:`Engine.batch_overhead_frames` is the planner's price of one more
  batch: the options' or the device's own (:func:`batch_overhead_for`);
* :meth:`Engine.plan` plans length-sorted batches under that budget, at that price;
* :meth:`Engine.logits` and :meth:`Engine.clip_logits` are the one prediction loop: distinct contents once,
  batches read and padded ahead of the model (planned here, or a plan the caller made, run as it is), clips
  too long for any batch run in windows (:mod:`specstore.infer.engine.windows`), a CUDA out-of-memory split
  and retried; they return the logits with the run's figures (:class:`RowLogits`, a :class:`RunStats` with
  logits).

``make infer``, ``make eval``, training's validation and ``make plan`` all go
through here, so a rule about devices, precision or budgets has one home.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, cast

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

from specstore.common import ConfigError
from specstore.infer.batching.budget import CPU_BATCH_OVERHEAD_FRAMES, DEFAULT_BATCH_OVERHEAD_FRAMES, Budget, PlanError
from specstore.infer.batching.constraints import BatchConstraint, BudgetBatches
from specstore.infer.batching.planner import Plan, plan_batches
from specstore.infer.data.clip_source import ClipSource
from specstore.infer.data.collate import PadCollate
from specstore.infer.data.readahead import prefetch
from specstore.infer.data.store_dataset import StoreDataset
from specstore.infer.engine.cost import measure_cost_per_frame
from specstore.infer.engine.device import (
    amp,
    anon_rss_bytes,
    autocast_dtype,
    choose_device,
    memory_bytes,
    set_cpu_threads,
)
from specstore.infer.engine.windows import TiledClips, mean_of_windows, run_windowed
from specstore.infer.models import MaskedClassifier
from specstore.infer.models.contract import exact_windows, masks_padding, time_stride, window_frames
from specstore.infer.options.run_options import RunOptions, check_run_option
from specstore.store import Store

__all__ = ["Engine", "RowLogits", "RunOptions", "RunStats", "batch_overhead_for", "check_run_option", "distinct_rows"]

log = logging.getLogger(__name__)


def batch_overhead_for(device: torch.device) -> float:
    """The planner's price of one more batch on ``device``, padded frames, when the options set none:
    :data:`~specstore.infer.options.defaults.CPU_BATCH_OVERHEAD_FRAMES` on a CPU (a batch costs little beyond
    its frames, so batches may split to save padding), else
    :data:`~specstore.infer.options.defaults.DEFAULT_BATCH_OVERHEAD_FRAMES` (full batches, as a GPU wants)."""
    return CPU_BATCH_OVERHEAD_FRAMES if device.type == "cpu" else DEFAULT_BATCH_OVERHEAD_FRAMES


def distinct_rows(rows: np.ndarray, hashes: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """For store ``rows``: the first row of each distinct content hash, and each row's content id.

    ``hashes`` are the store's content hashes, indexed by row.  Duplicate
    files are run once and their result given to every path.
    """
    ids: dict[str, int] = {}
    content = np.fromiter((ids.setdefault(hashes[int(r)], len(ids)) for r in rows), dtype=np.int64, count=len(rows))
    _, first = np.unique(content, return_index=True)  # content ids are 0..n-1 in first-seen order
    return rows[first], content


@dataclass
class RunStats:
    """The figures of one run of the engine's loop.

    ``distinct``: clips run (distinct contents); ``batches``: batches the
    model ran (a windowed clip's windows not counted); ``real_frames`` and
    ``computed_frames``: frames of the batched clips without and with
    padding (for a model that does not mask padding: the clips' frames, and
    tiles x window); ``windowed``: clips too long for a batch of one, run in
    windows; ``oom_retries``: batches split in halves after a CUDA
    out-of-memory; ``peak_bytes``: the highest anonymous RSS seen (CPU) or
    GPU memory allocated (CUDA) during the loop; ``budget_bytes``: the
    memory budget batches were planned under.
    """

    distinct: int = 0
    batches: int = 0
    real_frames: int = 0
    computed_frames: int = 0
    windowed: int = 0
    oom_retries: int = 0
    peak_bytes: int = 0
    budget_bytes: int = 0

    @property
    def efficiency(self) -> float:
        """``real_frames / computed_frames`` (1.0 = no padding; 1.0 when nothing was batched)."""
        return min(1.0, self.real_frames / self.computed_frames) if self.computed_frames else 1.0


@dataclass
class RowLogits(RunStats):
    """Logits ``(len(rows), n_classes)`` float32 in the order of the requested rows, with the figures of the
    run that computed them (:class:`RunStats`)."""

    logits: np.ndarray = field(kw_only=True)

    def run_stats(self) -> RunStats:
        """The run's figures alone, without the logits."""
        return RunStats(**{f.name: getattr(self, f.name) for f in fields(RunStats)})


class Engine:
    """:class:`RunOptions` resolved on this machine; see the module docstring.

    Choosing the device may raise :class:`~specstore.infer.engine.device.DeviceError`; bad
    options raise :class:`~specstore.common.ConfigError`.  Sets the process's CPU
    thread count when running on CPU.  :attr:`batch_overhead_frames`: the
    planner's price of one more batch in padded frames, the options' or this
    device's own (:func:`batch_overhead_for`); every plan the engine makes uses it.
    """

    def __init__(self, options: RunOptions | None = None) -> None:
        self.options = options or RunOptions()
        self.device = choose_device(self.options.device)
        if self.device.type == "cpu":
            set_cpu_threads(self.options.threads)
        self.autocast = autocast_dtype(self.options.precision, self.device)
        cl = self.options.channels_last
        self.channels_last = cl if cl is not None else self.device.type == "cpu"
        price = self.options.batch_overhead_frames
        self.batch_overhead_frames = float(price) if price is not None else batch_overhead_for(self.device)
        self.oom_retries = 0

    def __repr__(self) -> str:
        dtype = "fp32" if self.autocast is None else str(self.autocast).removeprefix("torch.")
        return f"Engine({self.device}, {dtype}, channels_last={self.channels_last})"

    # -- set-up --------------------------------------------------------------------------------
    def amp(self) -> Any:
        """The autocast context of this engine (a no-op in fp32)."""
        return amp(self.device.type, self.autocast)

    def prepare(self, model: nn.Module, *, train: bool = False) -> nn.Module:
        """``model`` on the device, in the engine's memory layout, in eval (or train) mode."""
        model = model.to(self.device)
        if self.channels_last:
            model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
        return model.train(train)

    def layout(self, x: torch.Tensor) -> torch.Tensor:
        """An input batch in the engine's memory layout: channels-last on CPU by default, where these
        convolutions run faster (forward and backward); the values are the same."""
        return x.contiguous(memory_format=torch.channels_last) if self.channels_last else x

    def memory(self) -> tuple[int, str]:
        """Bytes one batch may use now, and where the figure comes from (see
        :func:`specstore.infer.engine.device.memory_bytes`)."""
        return memory_bytes(self.device, self.options.budget_mb, self.options.margin_mb)

    def budget(self, model: nn.Module, n_bins: int, *, training: bool = False) -> Budget:
        """The :class:`~specstore.infer.batching.budget.Budget` for ``model`` on inputs of ``n_bins`` rows.

        Measures the model's bytes per padded clip-frame on a copy (forward,
        plus backward when ``training``), so the model's own state is not
        touched.  On CUDA the budget is the free memory after the model is
        loaded, minus the margin.
        """
        probe = copy.deepcopy(model).train(training)
        cost = measure_cost_per_frame(probe, n_bins, device=self.device, autocast=self.autocast, training=training)
        del probe
        limit, source = self.memory()
        return Budget.for_cost(limit, cost, max_batch=self.options.max_batch, frame_align=time_stride(model),
                               source=source)

    def live_budget(self, budget: Budget) -> Budget:
        """``budget`` now: on CUDA its byte figure is the free memory now (minus the margin, capped by the
        options' budget), else ``budget`` itself.

        The cost per padded frame stays the one :meth:`budget` measured; only
        the byte figure follows the device's free memory, so a server plans
        each batch under what is free when it closes.  Free memory below one
        frame's batch keeps ``budget`` (logged).
        """
        if self.device.type != "cuda":
            return budget
        limit, source = self.memory()
        try:
            return dataclasses.replace(budget, budget_bytes=limit, source=source)
        except PlanError:
            log.warning("free GPU memory (%d MiB) is below one frame's batch; keeping the start-up budget",
                        limit >> 20)
            return budget

    def plan(self, model: nn.Module, lengths: np.ndarray, n_bins: int, budget: Budget | None = None) -> Plan:
        """Length-sorted batches of ``lengths`` (frames) for ``model``, under ``budget`` (measured if None), at
        the engine's price of a batch (:attr:`batch_overhead_frames`): the plan :meth:`logits` runs."""
        return plan_batches(lengths, budget or self.budget(model, n_bins),
                            batch_overhead_frames=self.batch_overhead_frames)

    # -- the prediction loop ---------------------------------------------------------------------
    def _forward(self, model: nn.Module, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Logits of one batch; on a CUDA out-of-memory, split it in halves and retry (counted)."""
        try:
            x = self.layout(x)
            with torch.inference_mode(), self.amp():
                return model(x, lengths).float()
        except torch.cuda.OutOfMemoryError:
            if x.shape[0] == 1:
                raise
            self.oom_retries += 1
            torch.cuda.empty_cache()
            half = x.shape[0] // 2
            log.warning("CUDA out of memory on a batch of %d x %d frames; retrying as two halves",
                        x.shape[0], x.shape[-1])
            return torch.cat([self._forward(model, x[:half], lengths[:half]),
                              self._forward(model, x[half:], lengths[half:])])

    def _peak(self) -> int:
        if self.device.type == "cuda":
            return int(torch.cuda.max_memory_allocated(self.device))
        return anon_rss_bytes()

    def logits(
        self,
        model: nn.Module,
        store: Store,
        rows: np.ndarray,
        *,
        feature: str | None = None,
        budget: Budget | None = None,
        dedupe: bool = True,
        batch_overhead_frames: float | None = None,
        desc: str = "predicting",
    ) -> RowLogits:
        """Run ``model`` on store ``rows`` (of ``feature``) as whole clips; logits in row order.

        The one prediction loop over a store.  With ``dedupe`` each distinct
        content runs once; the distinct clips then go through
        :meth:`clip_logits` as a :class:`~specstore.infer.data.store_dataset.StoreDataset`
        (``batch_overhead_frames``: this run's price of a batch, as there).
        """
        rows = np.asarray(rows, dtype=np.int64)
        distinct, content = (distinct_rows(rows, store.hashes) if dedupe
                             else (rows, np.arange(len(rows), dtype=np.int64)))
        if not len(rows):
            return RowLogits(logits=np.zeros((0, 0), dtype=np.float32))
        out = self.clip_logits(model, StoreDataset(store, feature, rows=distinct), budget=budget,
                               batch_overhead_frames=batch_overhead_frames, desc=desc)
        out.logits = out.logits[content]
        return out

    def clip_logits(
        self,
        model: nn.Module,
        dataset: ClipSource,
        *,
        budget: Budget | None = None,
        constraint: BatchConstraint | None = None,
        plan: Plan | None = None,
        batches: Sequence[Sequence[int]] | None = None,
        batch_overhead_frames: float | None = None,
        desc: str = "predicting",
        progress: bool | None = None,
    ) -> RowLogits:
        """Run ``model`` on every clip of ``dataset`` as a whole clip; logits ``(len(dataset), C)`` in its order.

        ``dataset`` is any :class:`~specstore.infer.data.clip_source.ClipSource`: a store's
        :class:`~specstore.infer.data.store_dataset.StoreDataset` (what :meth:`logits`
        passes) or clips held in memory
        (:class:`~specstore.infer.data.clip_source.ArrayDataset`, what ``specstore
        classify`` and the server pass).  Batches are cut by ``constraint``
        (:mod:`specstore.infer.batching.constraints`; default ``budget``, measured for
        ``model`` if None), read and padded ahead by
        :func:`~specstore.infer.data.readahead.prefetch`.  A model that masks padding runs
        whole clips; clips too long for a batch of one run in windows
        (:mod:`specstore.infer.engine.windows`: exactly, when the model exposes
        ``pooled_sum``).  A model that does not mask padding runs every clip
        as equal tiles (:class:`~specstore.infer.engine.windows.TiledClips`), cut into batches by
        ``constraint``.  ``plan`` (a :class:`~specstore.infer.batching.planner.Plan` of the
        dataset's clips, e.g. the online batcher's, whose budget is the
        default ``budget``) is run as it is for a masking model: its batches,
        and its clips too long for any batch in windows; ``batches`` (lists of
        dataset indices) likewise, with no clip left for windows, unchecked
        against the budget.  ``batch_overhead_frames``: this run's price of one
        more batch in padded frames (default :attr:`batch_overhead_frames`).
        ``progress`` overrides the options' tqdm setting.  The model must
        already be on the device (:meth:`prepare`); it runs in eval mode and
        its mode is restored.
        """
        if not len(dataset):
            return RowLogits(logits=np.zeros((0, 0), dtype=np.float32))
        was_training = model.training
        model.eval()
        retries_before = self.oom_retries
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        stats = RunStats(distinct=len(dataset), peak_bytes=self._peak())
        show = self.options.progress if progress is None else progress
        try:
            budget = budget or (plan.budget if plan is not None else None) or self.budget(model, dataset.n_bins)
            stats.budget_bytes = budget.budget_bytes  # (measured after the reset: its peak counts)
            price = self.batch_overhead_frames if batch_overhead_frames is None else batch_overhead_frames
            cut = _Cut(constraint or BudgetBatches(budget), price, plan, batches)
            with tqdm(total=len(dataset), unit="clip", desc=desc, disable=not show, leave=False) as bar:
                run = self._run_masked if masks_padding(model) else self._run_unmasked
                logits = run(model, dataset, budget, cut, _Progress(self, bar, stats))
            stats.oom_retries = self.oom_retries - retries_before
        finally:
            model.train(was_training)
        return RowLogits(logits=logits, **vars(stats))

    def _run_masked(self, model: nn.Module, dataset: ClipSource, budget: Budget, cut: _Cut,
                    progress: _Progress) -> np.ndarray:
        """Whole clips in the constraint's batches (or the given ones); clips too long for any batch in windows."""
        plan = cut.plan(np.asarray(dataset.lengths, dtype=np.int64), budget)
        progress.stats.real_frames, progress.stats.computed_frames = plan.real_frames, plan.computed_frames
        progress.stats.batches, progress.stats.windowed = plan.n_batches, len(plan.too_long)
        parts: list[tuple[np.ndarray, np.ndarray]] = []
        for batch in self._batches(dataset, [b.tolist() for b in plan.batches], PadCollate(budget.frame_align)):
            b = batch.to(self.device, non_blocking=True) if self.device.type != "cpu" else batch
            parts.append((batch.ids, self._forward(model, b.x, b.lengths).cpu().numpy()))
            progress.done(len(batch))
        exact = exact_windows(model)
        for index in plan.too_long.tolist():
            x = dataset.window(index, 0, int(dataset.lengths[index]))
            with torch.inference_mode():
                if exact:
                    logit = run_windowed(cast(MaskedClassifier, model), x, budget.max_window, device=self.device,
                                         autocast=self.autocast)
                else:
                    logit = mean_of_windows(functools.partial(self._forward, model), x, budget.max_window,
                                            align=time_stride(model), device=self.device)
            parts.append((np.array([index]), logit.float().cpu().numpy()[None]))
            progress.done(1)
        return _assemble(parts, len(dataset))

    def _batches(self, dataset: Any, batches: list[list[int]], collate_fn: PadCollate) -> Iterator[Any]:
        """Collated batches, read ahead by the prefetch thread or by DataLoader workers (``loader_workers``)."""
        pin = self.device.type == "cuda"
        if not self.options.loader_workers:
            yield from prefetch(dataset, batches, collate_fn, pin=pin)
            return
        yield from DataLoader(dataset, batch_sampler=batches, collate_fn=collate_fn,
                              num_workers=self.options.loader_workers, pin_memory=pin)

    def _run_unmasked(self, model: nn.Module, dataset: ClipSource, budget: Budget, cut: _Cut,
                      progress: _Progress) -> np.ndarray:
        """A model that does not mask padding: every clip as equal tiles, logits averaged per clip."""
        w = window_frames(model)
        tiles = TiledClips(dataset, w)
        if not budget.fits(1, w):
            raise ConfigError(f"one window of {w} frames does not fit the memory budget "
                              f"({budget.budget_bytes / 2**20:.0f} MiB); raise the budget or lower window_frames")
        plan = cut.constraint.plan(np.full(len(tiles), w, dtype=np.int64))
        sums = np.zeros((len(dataset), 0), dtype=np.float64)
        counts = np.bincount(tiles.owner, minlength=len(dataset)).astype(np.float64)
        for batch in self._batches(tiles, [b.tolist() for b in plan.batches], PadCollate(budget.frame_align, pad_to=w)):
            b = batch.to(self.device, non_blocking=True) if self.device.type != "cpu" else batch
            values = self._forward(model, b.x, b.lengths).cpu().numpy().astype(np.float64)
            if sums.shape[1] == 0:
                sums = np.zeros((len(dataset), values.shape[1]), dtype=np.float64)
            np.add.at(sums, tiles.owner[batch.ids], values)
            progress.done(int(np.count_nonzero(tiles.last[batch.ids])))
        progress.stats.batches = plan.n_batches
        progress.stats.real_frames = int(np.asarray(dataset.lengths).sum())
        progress.stats.computed_frames = len(tiles) * w
        return (sums / counts[:, None]).astype(np.float32)


@dataclass
class _Cut:
    """How a run cuts its clips into batches: the constraint and the planner's price of a batch, or a plan (or
    batches) given to run as they are."""

    constraint: BatchConstraint
    batch_overhead_frames: float
    given_plan: Plan | None = None
    given: Sequence[Sequence[int]] | None = None

    def plan(self, lengths: np.ndarray, budget: Budget) -> Plan:
        """The given plan (its clips must be these), the given batches as a plan (nothing left for windows), or
        the constraint's plan of ``lengths``."""
        if self.given_plan is not None:
            if not np.array_equal(self.given_plan.lengths, lengths):
                raise ConfigError(f"the plan given is of other clips ({len(self.given_plan.lengths)} clips) than "
                                  f"the {len(lengths)} to run")
            return self.given_plan
        if self.given is not None:
            return Plan(lengths, [np.asarray(b, dtype=np.int64) for b in self.given], np.zeros(0, dtype=np.int64),
                        budget)
        return self.constraint.plan(lengths, batch_overhead_frames=self.batch_overhead_frames)


class _Progress:
    """A run's progress bar and its peak memory, updated after each batch."""

    def __init__(self, engine: Engine, bar: Any, stats: RunStats) -> None:
        self.engine, self.bar, self.stats = engine, bar, stats

    def done(self, clips: int) -> None:
        """``clips`` more clips are finished: advance the bar and take the memory peak."""
        self.bar.update(clips)
        self.stats.peak_bytes = max(self.stats.peak_bytes, self.engine._peak())


def _assemble(parts: list[tuple[np.ndarray, np.ndarray]], n: int) -> np.ndarray:
    width = parts[0][1].shape[1] if parts else 0
    out = np.zeros((n, width), dtype=np.float32)
    for ids, values in parts:
        out[ids] = values
    return out

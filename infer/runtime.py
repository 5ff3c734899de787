"""The engine that prediction, evaluation and training share: device, precision, budget, plan, batch loop.

:class:`RunOptions` (:mod:`infer.run_options`) is what a user chooses (device,
precision, memory budget, batch size, threads); :class:`Engine` is those options resolved on this
machine: the ``torch.device``, the autocast dtype, the memory layout, and
the methods every command calls:

* :meth:`Engine.prepare` puts a model on the device in the chosen layout;
* :meth:`Engine.budget` measures the model's memory cost per padded
  clip-frame (:mod:`infer.cost`) and returns the :class:`~infer.budget.Budget`
  that charges its batches (free GPU memory minus a margin, or a RAM figure);
* :meth:`Engine.plan` plans length-sorted batches under that budget;
* :meth:`Engine.logits` is the one prediction loop: distinct contents once,
  batches read and padded ahead of the model, clips too long for any batch
  run in windows, a CUDA out-of-memory split and retried.

``make infer``, ``make eval``, training's validation and ``make plan`` all go
through here, so a rule about devices, precision or budgets has one home.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

from store import ConfigError, Store

from .budget import Budget
from .collate import collate
from .contract import exact_windows, masks_padding, time_stride, window_frames
from .cost import measure_cost_per_frame
from .data import BudgetBatchSampler, ClipSource, Item, PadCollate, StoreDataset, prefetch
from .device import amp, anon_rss_bytes, autocast_dtype, choose_device, memory_bytes, set_cpu_threads
from .models import MaskedClassifier
from .planner import DEFAULT_BATCH_OVERHEAD_FRAMES, Plan, plan_batches
from .run_options import RunOptions, check_run_option
from .windows import run_windowed

__all__ = ["Engine", "RowLogits", "RunOptions", "check_run_option", "distinct_rows"]

log = logging.getLogger(__name__)


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
class RowLogits:
    """Logits ``(len(rows), n_classes)`` float32 in the order of the requested rows, and run figures.

    ``efficiency``: real / computed frames of the batched clips; ``windowed``:
    clips too long for a batch of one; ``peak_bytes``: the highest anonymous
    RSS seen (CPU) or GPU memory allocated (CUDA) during the loop;
    ``budget_bytes``: the memory budget batches were planned under.
    """

    logits: np.ndarray
    distinct: int = 0
    batches: int = 0
    efficiency: float = 1.0
    windowed: int = 0
    oom_retries: int = 0
    peak_bytes: int = 0
    budget_bytes: int = 0


class Engine:
    """:class:`RunOptions` resolved on this machine; see the module docstring.

    Choosing the device may raise :class:`~infer.device.DeviceError`; bad
    options raise :class:`~store.ConfigError`.  Sets the process's CPU
    thread count when running on CPU.
    """

    def __init__(self, options: RunOptions | None = None) -> None:
        self.options = options or RunOptions()
        self.device = choose_device(self.options.device)
        if self.device.type == "cpu":
            set_cpu_threads(self.options.threads)
        self.autocast = autocast_dtype(self.options.precision, self.device)
        cl = self.options.channels_last
        self.channels_last = cl if cl is not None else self.device.type == "cpu"
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
        """Bytes one batch may use now, and where the figure comes from (see :func:`infer.device.memory_bytes`)."""
        return memory_bytes(self.device, self.options.budget_mb, self.options.margin_mb)

    def budget(self, model: nn.Module, n_bins: int, *, training: bool = False) -> Budget:
        """The :class:`~infer.budget.Budget` for ``model`` on inputs of ``n_bins`` rows.

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

    def plan(self, model: nn.Module, lengths: np.ndarray, n_bins: int, budget: Budget | None = None) -> Plan:
        """Length-sorted batches of ``lengths`` (frames) for ``model``, under ``budget`` (measured if None)."""
        return plan_batches(lengths, budget or self.budget(model, n_bins))

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
        desc: str = "predicting",
    ) -> RowLogits:
        """Run ``model`` on store ``rows`` (of ``feature``) as whole clips; logits in row order.

        The one prediction loop over a store.  With ``dedupe`` each distinct
        content runs once; the distinct clips then go through
        :meth:`clip_logits` as a :class:`~infer.data.StoreDataset`.
        """
        rows = np.asarray(rows, dtype=np.int64)
        distinct, content = (distinct_rows(rows, store.hashes) if dedupe
                             else (rows, np.arange(len(rows), dtype=np.int64)))
        if not len(rows):
            return RowLogits(np.zeros((0, 0), dtype=np.float32), distinct=0)
        out = self.clip_logits(model, StoreDataset(store, feature, rows=distinct), budget=budget, desc=desc)
        out.logits = out.logits[content]
        return out

    def clip_logits(
        self,
        model: nn.Module,
        dataset: ClipSource,
        *,
        budget: Budget | None = None,
        batches: Sequence[Sequence[int]] | None = None,
        batch_overhead_frames: float | None = None,
        desc: str = "predicting",
        progress: bool | None = None,
    ) -> RowLogits:
        """Run ``model`` on every clip of ``dataset`` as a whole clip; logits ``(len(dataset), C)`` in its order.

        ``dataset`` is any :class:`~infer.data.ClipSource`: a store's
        :class:`~infer.data.StoreDataset` (what :meth:`logits` passes) or
        clips held in memory (:class:`~infer.data.ArrayDataset`, what
        ``specstore classify`` and the server pass).  A model that masks
        padding runs on the planner's batches
        (:class:`~infer.data.BudgetBatchSampler` under ``budget``, measured
        for ``model`` if None), read and padded ahead by
        :func:`~infer.data.prefetch`; clips too long for a batch of one run
        in windows (exactly, when the model exposes ``pooled_sum``).  A model
        that does not mask padding runs on equal windows
        (:mod:`infer.contract`).  ``batches`` (lists of dataset indices)
        replaces the planner's batches for a masking model, for a caller
        that compares another batching rule (a fixed batch size); they are
        run as given, unchecked against the budget.  ``batch_overhead_frames``:
        the planner's price of one more batch in padded frames (default
        :data:`~infer.planner.DEFAULT_BATCH_OVERHEAD_FRAMES`; a CPU, with
        little cost per batch, can split more and pad less).  ``progress`` overrides
        the options' tqdm setting.  The model must already be on the device
        (:meth:`prepare`); it runs in eval mode and its mode is restored.
        """
        out = RowLogits(np.zeros((len(dataset), 0), dtype=np.float32), distinct=len(dataset))
        if not len(dataset):
            return out
        was_training = model.training
        model.eval()
        retries_before = self.oom_retries
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        peak = self._peak()
        show = self.options.progress if progress is None else progress
        try:
            with tqdm(total=len(dataset), unit="clip", desc=desc, disable=not show, leave=False) as bar:
                if masks_padding(model):
                    result, peak = self._masked(model, dataset, budget, bar, peak, batches, batch_overhead_frames)
                else:
                    result, peak = self._windowed(model, dataset, budget, bar, peak)
            out.oom_retries, out.peak_bytes = self.oom_retries - retries_before, peak
        finally:
            model.train(was_training)
        out.logits, out.batches, out.efficiency, out.windowed, out.budget_bytes = result
        return out

    def _masked(self, model: nn.Module, dataset: ClipSource, budget: Budget | None, bar: Any, peak: int,
                given: Sequence[Sequence[int]] | None = None, batch_overhead_frames: float | None = None,
                ) -> tuple[tuple[np.ndarray, int, float, int, int], int]:
        """Whole clips in length-binned batches (or the ``given`` ones); over-long clips in windows."""
        budget = budget or self.budget(model, dataset.n_bins)
        if given is None:
            overhead = DEFAULT_BATCH_OVERHEAD_FRAMES if batch_overhead_frames is None else batch_overhead_frames
            sampler = BudgetBatchSampler(np.asarray(dataset.lengths), budget, too_long="leave",
                                         batch_overhead_frames=overhead)
            batches = list(sampler)
            plan = sampler.plan
        else:
            batches = [[int(i) for i in b] for b in given]
            plan = Plan(np.asarray(dataset.lengths, dtype=np.int64), [np.asarray(b, dtype=np.int64) for b in batches],
                        np.zeros(0, dtype=np.int64), budget)
        parts: list[tuple[np.ndarray, np.ndarray]] = []
        for batch in self._batches(dataset, batches, PadCollate(budget.frame_align)):
            b = batch.to(self.device, non_blocking=True) if self.device.type != "cpu" else batch
            parts.append((batch.ids, self._forward(model, b.x, b.lengths).cpu().numpy()))
            bar.update(len(batch))
            peak = max(peak, self._peak())
        exact = exact_windows(model)
        for index in plan.too_long.tolist():
            x = dataset.window(index, 0, int(dataset.lengths[index]))
            with torch.inference_mode():
                if exact:
                    logit = run_windowed(cast(MaskedClassifier, model), x, budget.max_window, device=self.device,
                                         autocast=self.autocast)
                else:
                    logit = self._mean_of_windows(model, x, budget.max_window, time_stride(model))
            parts.append((np.array([index]), logit.float().cpu().numpy()[None]))
            bar.update(1)
            peak = max(peak, self._peak())
        return (_assemble(parts, len(dataset)), len(batches), plan.efficiency, len(plan.too_long),
                budget.budget_bytes), peak

    def _batches(self, dataset: Any, batches: list[list[int]], collate_fn: PadCollate) -> Iterator[Any]:
        """Collated batches, read ahead by the prefetch thread or by DataLoader workers (``loader_workers``)."""
        pin = self.device.type == "cuda"
        if not self.options.loader_workers:
            yield from prefetch(dataset, batches, collate_fn, pin=pin)
            return
        yield from DataLoader(dataset, batch_sampler=batches, collate_fn=collate_fn,
                              num_workers=self.options.loader_workers, pin_memory=pin)

    def _mean_of_windows(self, model: nn.Module, x: np.ndarray, window: int, align: int) -> torch.Tensor:
        """Mean logits over consecutive windows of ``window`` frames, each run alone."""
        from .windows import windows_for

        outs = []
        for start, stop in windows_for(x.shape[1], window, align=align):
            b = collate([x[:, start:stop]], multiple_of=align).to(self.device)
            outs.append(self._forward(model, b.x, b.lengths)[0])
        return torch.stack(outs).mean(dim=0)

    def _windowed(self, model: nn.Module, dataset: ClipSource, budget: Budget | None, bar: Any,
                  peak: int) -> tuple[tuple[np.ndarray, int, float, int, int], int]:
        """A model that does not mask padding: every clip as equal windows, logits averaged per clip."""
        w = window_frames(model)
        windows = _Windows(dataset, w)
        budget = budget or self.budget(model, dataset.n_bins)
        if not budget.fits(1, w):
            raise ConfigError(f"one window of {w} frames does not fit the memory budget "
                              f"({budget.budget_bytes / 2**20:.0f} MiB); raise the budget or lower window_frames")
        sampler = BudgetBatchSampler(np.full(len(windows), w, dtype=np.int64), budget)
        batches = list(sampler)
        sums = np.zeros((len(dataset), 0), dtype=np.float64)
        counts = np.bincount(windows.owner, minlength=len(dataset)).astype(np.float64)
        for batch in self._batches(windows, batches, PadCollate(budget.frame_align, pad_to=w)):
            b = batch.to(self.device, non_blocking=True) if self.device.type != "cpu" else batch
            values = self._forward(model, b.x, b.lengths).cpu().numpy().astype(np.float64)
            if sums.shape[1] == 0:
                sums = np.zeros((len(dataset), values.shape[1]), dtype=np.float64)
            np.add.at(sums, windows.owner[batch.ids], values)
            bar.update(int(np.count_nonzero(windows.last[batch.ids])))
            peak = max(peak, self._peak())
        real = int(np.minimum(dataset.lengths, w).sum() + np.maximum(dataset.lengths - w, 0).sum())
        computed = len(windows) * w
        logits = (sums / counts[:, None]).astype(np.float32)
        return (logits, len(batches), min(1.0, real / computed), 0, budget.budget_bytes), peak


class _Windows:
    """Equal windows of ``w`` frames over every item of a dataset, as a dataset of their own.

    Windows start every ``w`` frames; the last one of a clip ends at the
    clip's end (overlapping the one before) so every window is whole; a clip
    shorter than ``w`` is one window, padded by the collate.  ``owner[k]`` is
    window ``k``'s item, ``last[k]`` whether it is its item's last window.
    """

    def __init__(self, dataset: ClipSource, w: int) -> None:
        self.dataset = dataset
        spans: list[tuple[int, int]] = []
        owner: list[int] = []
        last: list[bool] = []
        for i, n in enumerate(dataset.lengths.tolist()):
            starts = list(range(0, max(n - w, 0) + 1, w))
            if n > w and starts[-1] + w < n:
                starts.append(n - w)
            for k, start in enumerate(starts):
                spans.append((start, min(start + w, n)))
                owner.append(i)
                last.append(k == len(starts) - 1)
        self.spans = spans
        self.owner = np.array(owner, dtype=np.int64)
        self.last = np.array(last, dtype=bool)

    def __len__(self) -> int:
        return len(self.spans)

    def __getitem__(self, k: int) -> Item:
        start, stop = self.spans[k]
        i = int(self.owner[k])
        return Item(self.dataset.window(i, start, stop), int(self.dataset.labels[i]), k, int(self.dataset.rows[i]))


def _assemble(parts: list[tuple[np.ndarray, np.ndarray]], n: int) -> np.ndarray:
    width = parts[0][1].shape[1] if parts else 0
    out = np.zeros((n, width), dtype=np.float32)
    for ids, values in parts:
        out[ids] = values
    return out

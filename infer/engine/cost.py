"""Memory cost of a model per padded clip-frame, measured rather than assumed.

The planner charges a batch ``B * T * bytes_per_frame + fixed_bytes``.  This
module derives the two numbers for a given model, device and precision by
running probe batches of the same batch size and two or three lengths ``T``
(multiples of the model's time stride) and fitting the line
``bytes = fixed + per_frame * B * T``:

* **CUDA**: the peak of ``torch.cuda.max_memory_allocated`` during the probe
  forward (and backward, for training), over what was allocated before the
  probe input existed.  The budget there is free memory
  (``torch.cuda.mem_get_info``), which already excludes the loaded weights,
  so ``fixed_bytes`` is only the fitted intercept (workspaces), clamped >= 0.
* **CPU** (torch keeps no peak statistics for host memory, and tracemalloc
  does not see torch's allocator): :func:`activation_peak_bytes` watches
  every aten op through a ``TorchDispatchMode`` and keeps a running total of
  the bytes of live tensor storages the forward creates (released when their
  last tensor dies), plus the caller's input batch; its maximum is the peak
  of tensor memory during the forward.  Tensors led by the batch dimension
  or a multiple of it (activations) and the rest (weight-shaped temporaries:
  folded or autocast copies of weights) are tracked apart: the slope is fitted on the former,
  the latter go into ``fixed_bytes``.  Library scratch space inside an op
  (oneDNN reorders, im2col) is not seen.  For training the forward is run
  with every tensor autograd saves held alive and the largest single op is
  added for the backward's transients (an estimate).  ``fixed_bytes`` adds
  the parameters and buffers (twice for training: weights and gradients;
  optimiser state is not counted).

The fit is exact on CPU for lengths that are multiples of the time stride
(every activation is then proportional to ``B * T``), which is why the
planner takes ``frame_align=model.time_stride``.  The upper envelope of the
probes is used for the intercept, so every probe lies on or under the line.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from specstore.infer.batching.budget import CostModel
from specstore.infer.engine.device import amp

__all__ = ["CostModel", "LiveBytes", "activation_peak_bytes", "live_bytes", "measure_cost_per_frame"]


@dataclass(frozen=True)
class LiveBytes:
    """Peak live tensor bytes during a forward, split by kind.

    ``activations``: tensors whose leading dimension is a multiple of the batch (they grow
    with ``B * T``), the input batch included; ``other``: everything else the
    forward creates (weight-shaped temporaries such as folded or autocast
    copies of weights; constant in ``B * T``).
    """

    activations: int
    other: int


class _LiveTensorBytes(TorchDispatchMode):
    """Tracks bytes of live tensor storages created by aten ops, and their peaks.

    Every op's floating-point outputs are registered by storage; a weak
    reference per output tensor releases the storage's bytes when the last
    Python tensor on it is gone (CPython frees at once, and torch's CPU
    allocator returns memory at once).  Storages in ``external`` (the input
    batch, parameters, buffers) are not counted.  Tensors whose leading
    dimension is a multiple of ``batch_size`` count as activations (clips,
    or pieces of clips stacked on the batch dimension), others as "other".
    ``largest_op`` is the largest ``inputs + outputs`` (activations) of one op.
    """

    def __init__(self, external: set[int], batch_size: int) -> None:
        super().__init__()
        self.external = external
        self.batch_size = batch_size
        self.entries: dict[int, list[int]] = {}  # storage ptr -> [bytes, live tensors, is activation]
        self.current = [0, 0]  # other, activations
        self.peak = [0, 0]
        self.largest_op = 0

    def _is_activation(self, t: Tensor) -> bool:
        # A multiple of the batch, not only the batch: a model that stacks pieces of each clip on the batch
        # dimension (musicnn's 3 s patches) grows them with B * T too.  A constant tensor taken for an
        # activation only moves into the fitted intercept; the other way round, it would hide the slope.
        return t.dim() >= 1 and t.shape[0] >= self.batch_size and t.shape[0] % self.batch_size == 0

    def _release(self, ptr: int) -> None:
        entry = self.entries.get(ptr)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            del self.entries[ptr]
            self.current[entry[2]] -= entry[0]

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        op_storages: dict[int, int] = {}
        for t in tree_leaves((args, kwargs, out)):
            if isinstance(t, Tensor) and t.is_floating_point() and self._is_activation(t):
                storage = t.untyped_storage()
                op_storages[storage.data_ptr()] = storage.nbytes()
        self.largest_op = max(self.largest_op, sum(n for p, n in op_storages.items() if p not in self.external))
        for t in tree_leaves(out):
            if not (isinstance(t, Tensor) and t.is_floating_point()):
                continue
            storage = t.untyped_storage()
            ptr = storage.data_ptr()
            if ptr == 0 or ptr in self.external:
                continue
            entry = self.entries.get(ptr)
            if entry is None:
                kind = int(self._is_activation(t))
                entry = self.entries[ptr] = [storage.nbytes(), 0, kind]
                self.current[kind] += entry[0]
                self.peak[kind] = max(self.peak[kind], self.current[kind])
            entry[1] += 1
            weakref.finalize(t, self._release, ptr)
        return out


def live_bytes(
    model: nn.Module,
    x: Tensor,
    lengths: Tensor,
    *,
    autocast: torch.dtype | None = None,
    training: bool = False,
) -> LiveBytes:
    """Peak live tensor bytes of one forward (and backward) of ``model`` on ``x``, parameters excluded.

    Inference: the input batch plus the peak of live activation storages
    (:class:`_LiveTensorBytes`).  Training: the forward peak with every
    tensor autograd saves held alive, plus the largest single op (inputs +
    outputs) for the backward's transients: an estimate, see the module
    docstring.  The model's train/eval mode is left as it is;
    ``training=True`` runs backward and clears parameter gradients.
    """
    external = {t.untyped_storage().data_ptr() for t in [x, *model.parameters(), *model.buffers()]}
    tracker = _LiveTensorBytes(external, batch_size=int(x.shape[0]))
    saved: list[Tensor] = []

    def pack(t: Tensor) -> Tensor:
        saved.append(t)  # keep saved tensors visible as live until the end of the forward
        return t

    if training:
        with tracker:
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), amp(x.device.type, autocast):
                out = model(x, lengths)
        held = tracker.current[1]  # what the forward leaves for backward
        activations = tracker.peak[1]
        if getattr(model, "grad_checkpoint", False):  # backward re-runs one segment at a time on top of it
            activations = max(activations, held + _largest_segment_saved(model, x, lengths, autocast))
        activations += tracker.largest_op
        saved.clear()
        out.float().sum().backward()
        model.zero_grad(set_to_none=True)
    else:
        with tracker, torch.no_grad(), amp(x.device.type, autocast):
            model(x, lengths)
        activations = tracker.peak[1]
    return LiveBytes(activations=x.numel() * x.element_size() + activations, other=tracker.peak[0])


def _segments(model: nn.Module) -> list[nn.Module]:
    """What gradient checkpointing recomputes one at a time: ``model.checkpoint_segments()``, else its children."""
    segments = getattr(model, "checkpoint_segments", None)
    return list(segments()) if callable(segments) else list(model.children())


def _largest_segment_saved(model: nn.Module, x: Tensor, lengths: Tensor, autocast: torch.dtype | None) -> int:
    """Bytes autograd saves inside the largest checkpoint segment: what backward recomputes at once.

    With gradient checkpointing the forward keeps only the segments' inputs;
    backward re-runs one segment at a time and holds what it saves.  Measured
    with checkpointing off, by attributing each saved tensor to the segment
    running when it was saved.
    """
    per_segment: dict[int, int] = {}
    current: list[int] = []
    seen: set[int] = set()

    def pack(t: Tensor) -> Tensor:
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if current and ptr not in seen and t.dim() >= 1 and t.shape[0] == x.shape[0]:
            seen.add(ptr)
            per_segment[current[-1]] = per_segment.get(current[-1], 0) + storage.nbytes()
        return t

    def enter(k: int) -> Any:
        def hook(_module: nn.Module, _args: Any) -> None:
            current.append(k)
        return hook

    def leave(_module: nn.Module, _args: Any, _out: Any) -> None:
        current.pop()

    handles = []
    for k, seg in enumerate(_segments(model)):
        handles.append(seg.register_forward_pre_hook(enter(k)))
        handles.append(seg.register_forward_hook(leave))
    flag = getattr(model, "grad_checkpoint", False)
    setattr(model, "grad_checkpoint", False)  # noqa: B010 - a plain attribute of any model, see infer.contract
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), amp(x.device.type, autocast):
            out = model(x, lengths)
        del out
    finally:
        setattr(model, "grad_checkpoint", flag)  # noqa: B010
        for h in handles:
            h.remove()
    return max(per_segment.values(), default=0)


def activation_peak_bytes(
    model: nn.Module,
    x: Tensor,
    lengths: Tensor,
    *,
    autocast: torch.dtype | None = None,
    training: bool = False,
) -> int:
    """Peak bytes of live tensors during one forward (and backward), parameters excluded.

    The sum of :func:`live_bytes`' two parts (a slight over-estimate: the
    two peaks need not coincide).
    """
    peaks = live_bytes(model, x, lengths, autocast=autocast, training=training)
    return peaks.activations + peaks.other


def _param_bytes(model: nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])


_CPU_PROBE_FRAMES = 256
"""On CPU the shortest probe is 4 time strides, or fewer whole strides when 4 would pass this many frames."""


def _probe_frames(model: nn.Module, probe_frames: tuple[int, ...] | None, device: torch.device) -> tuple[int, ...]:
    stride = int(getattr(model, "time_stride", 1))
    if probe_frames is None:
        # Small on CPU (tensor sizes are exact there): 4 strides, fewer when a
        # stride is long (musicnn's 187-frame patch: one patch per clip is as
        # exact and 4x cheaper); larger on CUDA so the allocator's rounding is
        # small against the activations.
        scale = 32 if device.type == "cuda" else max(1, min(4, _CPU_PROBE_FRAMES // stride))
        probe_frames = (scale * stride, 2 * scale * stride, 3 * scale * stride)
    frames = tuple(sorted({int(t) for t in probe_frames}))
    if len(frames) < 2 or frames[0] < 1:
        raise ValueError("need at least two distinct positive probe lengths (frames)")
    if any(t % stride for t in frames):
        raise ValueError(f"probe lengths must be multiples of the model's time stride ({stride} frames)")
    return frames


def _fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Slope through the extreme probes; intercept raised so all probes lie on or under the line."""
    (x0, y0), (x1, y1) = points[0], points[-1]
    slope = (y1 - y0) / (x1 - x0)
    intercept = max(y - slope * x for x, y in points)
    return slope, intercept


def measure_cost_per_frame(
    model: nn.Module,
    n_bins: int,
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    autocast: torch.dtype | None = None,
    training: bool = False,
    probe_batch: int = 3,
    probe_frames: tuple[int, ...] | None = None,
) -> CostModel:
    """Fit ``bytes = fixed + per_frame * B * T`` for ``model`` on ``device``.

    ``dtype`` is the input batch's dtype, ``autocast`` an optional autocast
    dtype (e.g. ``torch.bfloat16``); ``training`` includes backward.
    ``probe_frames`` default to 4, 8 and 12 times the model's time stride on
    CPU (1, 2, 3 times a stride over 128 frames, 2, 4, 6 times one over 64;
    32, 64, 96 times on CUDA).  On CPU the slope is fitted on the activation
    peaks (tensors led by the batch dimension, exactly proportional to
    ``B * T`` for aligned ``T``) and ``fixed_bytes`` is the intercept plus the
    largest peak of other temporaries plus the parameters.
    On CUDA a first, discarded pass at the shortest probe length takes the
    one-time allocations (library workspaces) out of the fit: measured on an
    H200, they made the first probe's peak 7x the next one's and the slope
    negative.  The model is moved to ``device`` (as ``.to`` does) and its
    train/eval mode is kept; inputs are random dB-like values with full
    lengths.
    Raises ``ValueError`` if the fitted per-frame cost is not positive.
    """
    device = torch.device(device)
    model = model.to(device)
    frames = _probe_frames(model, probe_frames, device)
    generator = torch.Generator().manual_seed(0)
    points: list[tuple[int, float]] = []
    other = 0
    if device.type == "cuda":  # a discarded first pass: cuBLAS/cuDNN workspaces and lazy state are one-time
        x_host = torch.randn(probe_batch, 1, n_bins, frames[0], generator=generator) * 20.0 - 40.0
        _cuda_peak(model, x_host, torch.full((probe_batch,), frames[0], dtype=torch.int64), device, dtype,
                   autocast, training)
    for t in frames:
        x_host = torch.randn(probe_batch, 1, n_bins, t, generator=generator) * 20.0 - 40.0
        lengths = torch.full((probe_batch,), t, dtype=torch.int64)
        if device.type == "cuda":
            peak = _cuda_peak(model, x_host, lengths, device, dtype, autocast, training)
            points.append((probe_batch * t, float(peak)))
        else:
            x = x_host.to(device=device, dtype=dtype)
            peaks = live_bytes(model, x, lengths.to(device), autocast=autocast, training=training)
            points.append((probe_batch * t, float(peaks.activations)))
            other = max(other, peaks.other)
    slope, intercept = _fit(points)
    if not slope > 0:
        raise ValueError(f"measured per-frame cost is not positive ({slope:.3g} bytes); probes {points}")
    if device.type == "cuda":
        fixed = max(0.0, intercept)
        method = "cuda-peak"
    else:
        fixed = max(0.0, intercept) + other + _param_bytes(model) * (2 if training else 1)
        method = "cpu-live-tensors"
    return CostModel(bytes_per_frame=float(slope), fixed_bytes=int(round(fixed)), method=method, training=training)


def _cuda_peak(
    model: nn.Module,
    x_host: Tensor,
    lengths: Tensor,
    device: torch.device,
    dtype: torch.dtype,
    autocast: torch.dtype | None,
    training: bool,
) -> int:
    """Peak bytes allocated on ``device`` by one probe batch, its input included."""
    torch.cuda.synchronize(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    x = x_host.to(device=device, dtype=dtype)
    lengths_d = lengths.to(device)
    if training:
        with amp("cuda", autocast):
            out = model(x, lengths_d)
        out.float().sum().backward()
        model.zero_grad(set_to_none=True)
    else:
        with torch.no_grad(), amp("cuda", autocast):
            model(x, lengths_d)
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - base
    del x, lengths_d
    return int(peak)

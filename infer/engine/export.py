"""Export a checkpoint's model to ONNX or TorchScript, for use outside this package (``specstore export``).

The exported model is the checkpoint's :meth:`forward` as it is: it takes
``x`` (``batch x 1 x n_bins x frames`` float32, dB values zero-padded in time
to the longest clip) and ``lengths`` (``batch`` int64, real frames per clip)
and returns ``logits`` (``batch x n_classes`` float32), masked exactly as the
PyTorch model masks them: a clip's logits in a padded batch equal its logits
alone, for any batch size and any number of frames (both axes are dynamic).
A long clip needs no windowing: its logits on the whole clip equal what
``make infer`` computes window by window.

* ONNX: ``torch.onnx.export(dynamo=True)`` (``torch.export`` with dynamic
  batch and frames axes, then onnxscript's translation; the ``export`` extra
  installs onnx and onnxscript).
* TorchScript: ``torch.jit.trace``.  Tracing records the ops one example
  runs; the models never branch on the lengths' values or on the frame
  count while traced or exported (:func:`specstore.infer.models.masking.exporting`),
  so the trace holds for every input.

Either way the written file is run once more on a batch of another size
and length (onnxruntime for ONNX when it is installed, ``torch.jit.load``
for TorchScript) and its logits compared with the checkpoint's; a
difference is an :class:`ExportError` (and the file is removed), never a silently wrong file.

Beside the model file goes a JSON sidecar (:func:`sidecar`,
:func:`~specstore.infer.options.export_options.sidecar_path`): the labels, the features (every
:class:`~specstore.store.FeatureSpec` field and how the values are computed), the input
layout, how logits become probabilities (the checkpoint's temperature, when
it has one) and the specstore version.  A feature's ``values`` are its kind's recipe
(:attr:`specstore.store.kinds.FeatureKind.recipe`, librosa code over the spec's fields;
:mod:`specstore.pipeline.features` is the contract).  What the exported graph does not do:
check its input (the PyTorch model refuses lengths outside ``[1, frames]``;
the exported one computes nonsense for them).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import logging
import os
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from specstore.common import ConfigError, atomic_path, write_atomic
from specstore.infer.errors import ExportError
from specstore.infer.models.calibration import calibration_fields
from specstore.infer.models.checkpoint import Checkpoint
from specstore.infer.models.contract import masks_padding
from specstore.infer.models.trust import Trust
from specstore.infer.options.export_options import FORMATS, export_path, sidecar_path

__all__ = ["ExportError", "ExportResult", "export_model", "sidecar"]

log = logging.getLogger(__name__)

TOLERANCE = 1e-4
"""Largest difference allowed between the exported model's logits and the checkpoint's, relative to the
logits' scale (the largest absolute logit, at least 1): float32 ops reordered by another runtime differ by
about 1e-6."""

EXTERNAL_DATA_BYTES = 1 << 30
"""Weights above this many bytes go to an ONNX external data file (``MODEL.onnx.data``): a single ONNX file
holds at most 2 GiB."""

@dataclass(frozen=True)
class ExportResult:
    """What :func:`export_model` wrote: ``path`` (the model file), ``sidecar`` (its JSON), ``max_difference``
    (the largest absolute logit difference from the checkpoint on the check batch, or score difference for a
    tagger, whose scores are the sigmoids of its logits; None when not checked)."""

    path: Path
    sidecar: Path
    format: str
    max_difference: float | None
    compared: str = "logits"
    """What ``max_difference`` compares: ``logits``, or ``scores`` (sigmoids) for a tagger."""


def _version() -> str:
    try:
        return importlib.metadata.version("specstore")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def sidecar(ckpt: Checkpoint, fmt: str, model_file: str) -> dict[str, Any]:
    """The JSON sidecar of an export of ``ckpt``: what a user of ``model_file`` needs outside this package.

    ``scores`` says how logits become scores; a single-label model's sidecar also has ``temperature`` (the
    checkpoint's, :attr:`~specstore.infer.models.checkpoint.Checkpoint.calibration`; null: uncalibrated) and
    ``calibration`` (``temperature`` or ``uncalibrated``), as ``specstore classify --json`` does; a tagger's has
    neither (its independent sigmoid scores take no temperature).
    """
    tags = ckpt.outputs == "tags"
    temperature = ckpt.calibration.temperature  # None for a tagger, whatever its extra says
    cal = calibration_fields(temperature, ckpt.outputs)
    frame = ckpt.spec.frame_seconds
    return {
        "format": fmt, "file": model_file, "specstore_version": _version(),
        "model": ckpt.model.target, "labels": list(ckpt.label_names),
        "inputs": {
            "x": {"shape": ["batch", 1, ckpt.n_bins, "frames"], "dtype": "float32",
                  "values": "the feature's dB values, (frames, bins) transposed to (bins, frames); several parts "
                            "are stacked along bins in the order of `features`; frames beyond a clip's length "
                            "are zeros"},
            "lengths": {"shape": ["batch"], "dtype": "int64",
                        "values": "real frames of each clip, 1 <= length <= frames (not checked by the model)"},
        },
        "outputs": {"logits": {"shape": ["batch", len(ckpt.label_names)], "dtype": "float32"}},
        "scores": ("sigmoid(logits): each label's own score (a multi-label tagger)" if tags else
                   f"softmax(logits / {temperature})" if temperature is not None else "softmax(logits)"),
        **cal,
        "frame_seconds": frame, "frames_per_second": 1.0 / frame,
        "feature": ckpt.feature,
        "features": {name: {**spec.to_dict(), "values": spec.kind_info.recipe or spec.kind,
                            "frames": "1 + len(y) // hop_length",
                            "rounding": f"specstore stores {spec.dtype}: round to it and back to float32 to get "
                                        "exactly the values `make infer` and `specstore classify` use"}
                     for name, spec in ckpt.specs.items()},
    }


def _example(model: nn.Module, n_bins: int, clips: int, extra_frames: int) -> tuple[Tensor, Tensor]:
    """A padded batch: ``clips`` clips of different lengths (the shortest 1 frame), every clip's padding zeros;
    its frame count is not a multiple of the model's window or stride, so the padding to them is exercised."""
    align = max(int(getattr(model, "window_align", 1)), int(getattr(model, "time_stride", 1)), 1)
    frames = 2 * align + 3 + extra_frames
    gen = torch.Generator().manual_seed(clips + extra_frames)
    lengths = torch.linspace(frames, 1, clips).round().long()
    lengths[-1] = 1
    x = torch.randn(clips, 1, n_bins, frames, generator=gen) * 12.0 - 45.0
    x = x * (torch.arange(frames)[None, None, None, :] < lengths[:, None, None, None])
    return x, lengths


def _trace(model: nn.Module, example: tuple[Tensor, Tensor], path: Path) -> None:
    with warnings.catch_warnings():  # the tracer's warnings are about branches the models skip while traced
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(model, example, check_trace=False)
        with atomic_path(path) as tmp:  # (torch 2.13 calls TorchScript deprecated, in favour of torch.export)
            torch.jit.save(traced, str(tmp))


def _onnx(model: nn.Module, example: tuple[Tensor, Tensor], path: Path) -> None:
    missing = [m for m in ("onnx", "onnxscript") if importlib.util.find_spec(m) is None]
    if missing:
        raise ExportError(f"ONNX export needs {' and '.join(missing)}: pip install 'specstore[export]'")
    batch, frames = torch.export.Dim("batch", min=1), torch.export.Dim("frames", min=2)
    n_bytes = sum(p.numel() * p.element_size() for p in model.state_dict().values())
    quiet = logging.getLogger("torch.onnx")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # the exporter logs each step and every library it does not find
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            program = torch.onnx.export(model, example, input_names=["x", "lengths"], output_names=["logits"],
                                        dynamic_shapes=({0: batch, 3: frames}, {0: batch}), dynamo=True,
                                        verbose=False, external_data=n_bytes > EXTERNAL_DATA_BYTES)
    finally:
        quiet.setLevel(level)
    assert program is not None
    if n_bytes > EXTERNAL_DATA_BYTES:  # the .onnx file names its data file: written in place, not renamed
        program.save(str(path), external_data=True)
        return
    with atomic_path(path) as tmp:
        program.save(str(tmp), external_data=False)


def _run_exported(fmt: str, path: Path, x: Tensor, lengths: Tensor) -> Tensor | None:
    """The written file's logits on ``(x, lengths)``; None when no runtime to check it is installed."""
    if fmt == "torchscript":
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            return torch.jit.load(str(path))(x.clone(), lengths)
    if importlib.util.find_spec("onnxruntime") is None:
        log.warning("onnxruntime is not installed: %s was not run to check its logits", path)
        return None
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return torch.from_numpy(session.run(["logits"], {"x": x.numpy(), "lengths": lengths.numpy()})[0])


def _build(ckpt: Checkpoint, trust_model_code: Trust) -> nn.Module:
    model = ckpt.build("cpu", trust_model_code=trust_model_code).float().eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def export_model(checkpoint: str | os.PathLike[str] | Checkpoint, path: str | os.PathLike[str] | None = None, *,
                 format: str = "onnx", trust_model_code: Trust = False) -> ExportResult:
    """Export ``checkpoint``'s model to ``format`` (:data:`~specstore.infer.options.export_options.FORMATS`) at ``path``
    (default: beside the checkpoint, :func:`~specstore.infer.options.export_options.export_path`), with its JSON
    sidecar.

    The file is checked against the checkpoint on a batch of another size and
    length than the export's example (see the module docstring).  One-line
    :class:`ExportError` / :class:`~specstore.infer.models.checkpoint.CheckpointError` for a
    missing or unreadable checkpoint, an unknown format, a model that does
    not export.
    """
    if format not in FORMATS:
        raise ConfigError(f"unknown export format {format!r}; expected one of {', '.join(FORMATS)}")
    from specstore.infer.models.shipped import resolve_checkpoint

    ckpt = checkpoint if isinstance(checkpoint, Checkpoint) else resolve_checkpoint(checkpoint)
    source = ckpt.source or "checkpoint.pt"
    out = export_path(source, format, path) if path is not None or ckpt.source else None
    if out is None:
        raise ConfigError("an in-memory checkpoint needs a path to export to")
    out.parent.mkdir(parents=True, exist_ok=True)
    model = _build(ckpt, trust_model_code)
    name = ckpt.model.target
    if not masks_padding(model):
        raise ExportError(f"the {name} model of {source} does not mask its padding (masks_padding = False): specstore "
                          "runs it on equal windows, which an exported forward would not do; not exported")
    example = _example(model, ckpt.n_bins, 2, 0)
    try:
        with torch.no_grad():
            (_trace if format == "torchscript" else _onnx)(model, example, out)
    except ExportError:
        raise
    except Exception as e:  # the exporters raise many kinds; the first line says which op or guard failed
        first = (re.sub(r"\x1b\[[0-9;]*m", "", str(e)).strip().splitlines() or [type(e).__name__])[0]
        raise ExportError(f"cannot export the {name} model of {source} to {format}: {first}") from None
    # Checked on a batch of another size and more strides than the example: a graph that froze a shape
    # derived from the example's lengths (a count of windows or patches) gives other logits here.
    align = max(int(getattr(model, "window_align", 1)), int(getattr(model, "time_stride", 1)), 1)
    check = _example(model, ckpt.n_bins, 3, 2 * align + 5)
    with torch.no_grad():
        expected = model(check[0].clone(), check[1])
    got = _run_exported(format, out, *check)
    tags = ckpt.outputs == "tags"
    if tags and got is not None:  # a tagger's logits are logit(mean of patch scores): compared as scores,
        got, expected = torch.sigmoid(got.float()), torch.sigmoid(expected)  # ill-conditioned near 0 and 1
    what = "scores" if tags else "logits"
    diff = None if got is None else float((got.float() - expected).abs().max())
    scale = max(1.0, float(expected.abs().max()))
    if diff is not None and not diff <= TOLERANCE * scale:
        Path(os.path.realpath(out)).unlink(missing_ok=True)  # the file written: a link's target, not the link
        raise ExportError(f"the {format} export of {source} gives {what} {diff:.3g} away from the checkpoint's "
                          f"(allowed {TOLERANCE * scale:.3g}); not written")
    side = sidecar_path(out)
    write_atomic(side, json.dumps(sidecar(ckpt, format, out.name), indent=1) + "\n")
    log.info("exported %s to %s (max %s difference %s)", source, out, what, diff)
    return ExportResult(out, side, format, diff, what)

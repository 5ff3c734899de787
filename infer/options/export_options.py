"""``specstore export``'s options and file names, without torch (so ``--help`` and bad options answer at once).

An export writes the model file (:data:`SUFFIXES`: ``MODEL.onnx`` or
``MODEL.torchscript.pt`` beside the checkpoint unless ``out`` says where) and
a JSON sidecar beside it, the model file's name plus ``.json``
(:func:`sidecar_path`), with what a user of the file needs outside this
package: the labels, the features, the input layout, the temperature.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from specstore.common import ConfigError, check_output_path
from specstore.common.options import option

__all__ = ["FORMATS", "SUFFIXES", "ExportOptions", "export_path", "sidecar_path"]

FORMATS = ("onnx", "torchscript")
"""What a checkpoint exports to: ONNX (``torch.onnx.export``, the dynamo exporter; read by onnxruntime and
others) or TorchScript (``torch.jit.trace``; read by ``torch.jit.load`` in Python or libtorch in C++)."""

SUFFIXES = {"onnx": ".onnx", "torchscript": ".torchscript.pt"}
"""The model file's suffix per format (``.torchscript.pt``: never the checkpoint's own ``.pt`` name)."""


@dataclass(frozen=True)
class ExportOptions:
    """``specstore export``: the format and where the model file goes (its sidecar goes beside it)."""

    format: str = option("onnx", "onnx (onnxruntime, any ONNX runtime; needs the `export` extra) or torchscript "
                                 "(torch.jit.load, libtorch)", choices=FORMATS)
    out: str | None = option(None, "the model file to write; its JSON sidecar is this name plus .json",
                             metavar="PATH", shown="MODEL's name with .onnx or .torchscript.pt, beside it")


def export_path(checkpoint: str | os.PathLike[str], fmt: str, out: str | os.PathLike[str] | None = None) -> Path:
    """Where an export of ``checkpoint`` to ``fmt`` goes: ``out``, or the checkpoint's name with the format's
    suffix (:data:`SUFFIXES`) beside it.  Refuses an unknown format, the checkpoint's own path and, in one line
    before any work, a path that cannot be written as a regular file (a FIFO or ``/dev/stdout`` included: the file is
    read back to check it and its sidecar goes beside it; :func:`specstore.common.check_output_path`)."""
    if fmt not in FORMATS:
        raise ConfigError(f"unknown export format {fmt!r}; expected one of {', '.join(FORMATS)}")
    src = Path(checkpoint)
    path = Path(out) if out is not None else src.with_name(src.name.removesuffix(".pt") + SUFFIXES[fmt])
    if path.resolve() == src.resolve():
        raise ConfigError(f"the export would overwrite the checkpoint {src}; give another --out")
    check_output_path(path, what="export", stream=False)
    return path


def sidecar_path(model_file: str | os.PathLike[str]) -> Path:
    """The JSON sidecar of an exported model file: its name plus ``.json`` (``genre.onnx.json``)."""
    p = Path(model_file)
    return p.with_name(p.name + ".json")

"""Loading the shipped musicnn tensors into :class:`~specstore.infer.models.musicnn.MusiCNN`, checksum first.

The npz holds the TF1 checkpoint's variables as they were (``conv2d.kernel`` is
TensorFlow's ``[frames, bands, in, out]``); :data:`_LAYERS` maps each TensorFlow
layer to the PyTorch module it becomes, and :func:`_convert` transposes kernels to
PyTorch's layout.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from specstore.infer.errors import PretrainedError
from specstore.store import FeatureSpec

if TYPE_CHECKING:
    import torch

    from specstore.infer.models.musicnn import MusiCNN

__all__ = ["MUSICNN_MODELS", "PRETRAINED_DIR", "PretrainedError", "load_musicnn", "musicnn_info"]

PRETRAINED_DIR = Path(__file__).resolve().parent / "musicnn"
"""Where the converted tensors, ``models.json``, the licence and the attribution lie (package data)."""
MUSICNN_MODELS = ("musicnn-msd", "musicnn-mtt")
"""The shipped models' names: trained on the Million Song Dataset's and MagnaTagATune's 50 top tags."""

_LAYERS: dict[str, tuple[str, str]] = {
    # TensorFlow layer -> (PyTorch module, kind), in the order musicnn's graph creates them
    "batch_normalization": ("input_bn", "bn"),
    "conv2d": ("timbral.0.conv", "conv2d"), "batch_normalization_1": ("timbral.0.bn", "bn"),
    "conv2d_1": ("timbral.1.conv", "conv2d"), "batch_normalization_2": ("timbral.1.bn", "bn"),
    "conv2d_2": ("temporal.0.conv", "conv2d"), "batch_normalization_3": ("temporal.0.bn", "bn"),
    "conv2d_3": ("temporal.1.conv", "conv2d"), "batch_normalization_4": ("temporal.1.bn", "bn"),
    "conv2d_4": ("temporal.2.conv", "conv2d"), "batch_normalization_5": ("temporal.2.bn", "bn"),
    "conv2d_5": ("mid.0.conv", "conv1d"), "batch_normalization_6": ("mid.0.bn", "bn"),
    "conv2d_6": ("mid.1.conv", "conv1d"), "batch_normalization_7": ("mid.1.bn", "bn"),
    "conv2d_7": ("mid.2.conv", "conv1d"), "batch_normalization_8": ("mid.2.bn", "bn"),
    "batch_normalization_9": ("pool_bn", "bn"),
    "dense": ("dense", "dense"), "batch_normalization_10": ("dense_bn", "bn"),
    "dense_1": ("out", "dense"),
}
_BN = {"gamma": "weight", "beta": "bias", "moving_mean": "running_mean", "moving_variance": "running_var"}


def musicnn_info(name: str, folder: Path | None = None) -> dict[str, Any]:
    """``models.json``'s entry for ``name``: file, sha256, tags, origin (one-line error for an unknown name)."""
    if name not in MUSICNN_MODELS:
        raise PretrainedError(f"unknown pretrained model {name!r}; shipped: {', '.join(MUSICNN_MODELS)}")
    index = (folder or PRETRAINED_DIR) / "models.json"
    try:
        entry: dict[str, Any] = json.loads(index.read_text(encoding="utf-8"))[name]
    except (OSError, KeyError, ValueError) as e:
        raise PretrainedError(f"cannot read {name!r} from {index}: {e}; reinstall specstore") from None
    return entry


def _convert(kind: str, field: str, value: np.ndarray) -> tuple[str, np.ndarray]:
    """A TensorFlow tensor -> (PyTorch parameter name, array in PyTorch's layout)."""
    if kind == "bn":
        return _BN[field], value
    if field == "bias":
        return "bias", value
    if kind == "conv2d":  # [frames, bands, in, out] -> (out, in, frames, bands)
        return "weight", value.transpose(3, 2, 0, 1)
    if kind == "conv1d":  # [frames, channels, 1, out] -> (out, channels, frames)
        return "weight", value[:, :, 0, :].transpose(2, 1, 0)
    return "weight", value.T  # dense: [in, out] -> (out, in)


def state_dict_from_tensorflow(tensors: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    """The PyTorch state dict of the checkpoint's tensors (keys ``layer.field``, as the npz holds them)."""
    import torch

    out: dict[str, torch.Tensor] = {}
    for key, value in tensors.items():
        layer, _, field = key.rpartition(".")
        if layer not in _LAYERS:
            raise PretrainedError(f"unexpected tensor {key!r} in the musicnn weights")
        module, kind = _LAYERS[layer]
        param, array = _convert(kind, field, value)
        out[f"{module}.{param}"] = torch.from_numpy(np.ascontiguousarray(array, dtype=np.float32))
    return out


def load_musicnn(name: str, folder: Path | None = None) -> tuple[MusiCNN, list[str], FeatureSpec]:
    """The shipped model ``name`` (``"musicnn-msd"`` or ``"musicnn-mtt"``): ``(model in eval mode, its tag
    vocabulary, the FeatureSpec of its input)``; the file's sha256 is checked against ``models.json`` first.
    ``folder``: another copy of ``infer/models/pretrained/musicnn`` (tests)."""
    from specstore.infer.models.musicnn import MusiCNN

    entry = musicnn_info(name, folder)
    path = (folder or PRETRAINED_DIR) / entry["file"]
    try:
        data = path.read_bytes()
    except OSError as e:
        raise PretrainedError(f"cannot read the {name} weights {path}: {e.strerror or e}") from None
    digest = hashlib.sha256(data).hexdigest()
    if digest != entry["sha256"]:
        raise PretrainedError(f"{path}: sha256 {digest[:16]}... does not match the recorded "
                              f"{entry['sha256'][:16]}...; the file is damaged or replaced (reinstall specstore)")
    with np.load(path, allow_pickle=False) as npz:
        tensors = {k: npz[k] for k in npz.files}
    tags = [str(t) for t in entry["tags"]]
    model = MusiCNN(len(tags))
    model.load_state_dict(state_dict_from_tensorflow(tensors), strict=True)
    return model.eval(), tags, FeatureSpec.of_kind("musicnn")

"""Checkpoints: weights plus everything needed to use them, in a pickle-free format.

A checkpoint is a ``torch.save`` file of plain containers: the model as a
:class:`~specstore.infer.models.contract.ModelSpec` (an architecture's name with its
config, :mod:`specstore.infer.models.registry`, or an import path
``package.module:Class`` with JSON keyword arguments), the
label names, the feature name and its full :class:`specstore.store.FeatureSpec`, the
``state_dict`` tensors and a small JSON-able ``extra`` dict (training
history, ...).  It is loaded with ``torch.load(weights_only=True)``, which
refuses arbitrary Python objects, so opening a checkpoint runs no code.
Building a built-in model runs none either; building a user model imports
the module its import path names (or, for an architecture registered from
user code and not registered in this process, its recorded builder's
module), which runs that module's code, so :meth:`Checkpoint.build` does it
only when trusted (``trust_model_code``, or the ``SPECSTORE_TRUSTED_MODULES``
allow-list; :mod:`specstore.infer.models.trust`).
"""

from __future__ import annotations

import os
import pickle
import zipfile
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from specstore.common import ConfigError, atomic_path
from specstore.infer.errors import CheckpointError, ModelConfigError, UntrustedModelError
from specstore.infer.models import ARCHS, ModelConfig
from specstore.infer.models.calibration import Calibration
from specstore.infer.models.contract import ModelSpec, spec_of
from specstore.infer.models.trust import Trust, check_import_path
from specstore.store import FeatureSpec, Store, spec_differences
from specstore.store.spec_command import extraction_command

__all__ = ["Checkpoint", "CheckpointError", "check_store_matches", "load_checkpoint", "read_torch_file",
           "save_checkpoint", "save_torch_file"]

FORMAT = "specstore-checkpoint"
VERSION = 2
"""Version 2 records the model as a ModelSpec; version 1 (a built-in model's config) is still read."""


@dataclass
class Checkpoint:
    """A trained (or freshly initialised) model and what it was trained on.

    ``source``: where it was read from (for messages; not saved).
    """

    model: ModelSpec
    label_names: list[str]
    feature: str
    specs: dict[str, FeatureSpec]
    state_dict: dict[str, torch.Tensor]
    extra: dict[str, Any] = field(default_factory=dict)
    source: str = field(default="", compare=False)

    @property
    def spec(self) -> FeatureSpec:
        """The spec of the (first) feature; :attr:`specs` has every part of a ``"mel+cqt"`` feature."""
        return next(iter(self.specs.values()))

    @property
    def outputs(self) -> str:
        """How the logits read: ``"tags"`` (independent sigmoid scores, a multi-label tagger such as a shipped
        musicnn, :mod:`specstore.infer.models.shipped`) or ``"classes"`` (one softmax over the labels, every
        trained model)."""
        return "tags" if self.extra.get("outputs") == "tags" else "classes"

    @property
    def n_bins(self) -> int:
        """Rows of the model's input: the bins of every part of the feature."""
        return sum(s.n_bins for s in self.specs.values())

    @property
    def config(self) -> ModelConfig | None:
        """The architecture's config (None for an import-path model, or an architecture not registered yet)."""
        return self.model.config

    @property
    def calibration(self) -> Calibration:
        """How its logits become probabilities: the temperature fitted on the validation clips after training
        (``extra["calibration"]``), or uncalibrated (:mod:`specstore.infer.models.calibration`); always
        uncalibrated for a tagger (``outputs == "tags"``: independent sigmoid scores take no temperature)."""
        return Calibration.of(self.extra, self.outputs)

    def build(self, device: torch.device | str = "cpu", *, trust_model_code: Trust = False) -> nn.Module:
        """The model with these weights, in eval mode on ``device``.

        A user model (an import path) is built only when ``trust_model_code``
        (True, or the trusted import paths / modules) or the allow-list trusts
        it; otherwise :class:`~specstore.infer.models.trust.UntrustedModelError`, before its
        module is imported.
        """
        try:
            model = self.model.build(trust_model_code, source=f"checkpoint {self.source}" if self.source else
                                     "the checkpoint")
        except UntrustedModelError:
            raise
        except ConfigError as e:
            raise CheckpointError(f"cannot build the checkpoint's model: {e}") from None
        rows = getattr(model, "n_bins", None)  # (a shipped model class states its input rows here)
        if isinstance(rows, int) and not isinstance(rows, bool) and rows != self.n_bins:
            raise CheckpointError(f"{self.source or 'the checkpoint'}: its model reads {rows} input rows, but its "
                                  f"feature {self.feature!r} has {self.n_bins} bins")
        try:
            model.load_state_dict(self.state_dict)
        except RuntimeError as e:
            raise CheckpointError(f"checkpoint weights do not fit its model: {str(e).splitlines()[0]}") from None
        return model.to(device).eval()

    @classmethod
    def from_model(cls, model: nn.Module, label_names: list[str], feature: str,
                   spec: FeatureSpec | Mapping[str, FeatureSpec], extra: dict[str, Any] | None = None, *,
                   model_spec: ModelSpec | None = None) -> Checkpoint:
        """A checkpoint of ``model``'s current weights; ``spec``: the feature's spec (or every part's, for a
        ``"mel+cqt"`` feature); ``model_spec`` says how to rebuild a user model (default:
        :func:`specstore.infer.models.contract.spec_of`)."""
        state = {k: v.detach().cpu().clone(memory_format=torch.contiguous_format)
                 for k, v in model.state_dict().items()}
        specs = {feature: spec} if isinstance(spec, FeatureSpec) else dict(spec)
        if list(specs) != feature.split("+"):
            raise ConfigError(f"feature {feature!r} needs the specs of {feature.split('+')}, got {list(specs)}")
        return cls(model_spec or spec_of(model), list(label_names), feature, specs, state, dict(extra or {}))


def save_torch_file(payload: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """``torch.save`` of plain containers and tensors, atomically (temporary file, then rename)."""
    with atomic_path(path) as tmp:
        torch.save(payload, tmp)
    return Path(path)


def read_torch_file(path: str | os.PathLike[str], what: str = "checkpoint") -> dict[str, Any]:
    """Load a ``torch.save`` file of plain containers safely (``weights_only=True``); one-line errors.

    A file holding Python objects (which a safe load refuses) is reported as
    not a specstore file that may be unsafe, never with advice to load it
    unsafely.
    """
    p = Path(path)
    if not p.is_file():
        raise CheckpointError(f"no {what} at {p}" + (" (train one with `make train`)" if what == "checkpoint" else ""))
    try:
        raw = torch.load(p, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, zipfile.BadZipFile, RuntimeError, EOFError, ValueError, OSError, KeyError,
            IndexError) as e:  # (garbage read as a legacy pickle fails on its memo: KeyError, IndexError)
        if isinstance(e, pickle.UnpicklingError) and "unsupported global" in str(e).lower():
            raise CheckpointError(f"{p} is not a specstore {what}: it holds Python objects that a safe load "
                                  "refuses, and it may be unsafe to open") from None
        raise CheckpointError(f"{p} is not a readable {what} (truncated, or not a file torch wrote)") from None
    if not isinstance(raw, dict):
        raise CheckpointError(f"{p} is not a specstore {what}")
    return raw


def save_checkpoint(ckpt: Checkpoint, path: str | os.PathLike[str]) -> Path:
    """Write ``ckpt`` atomically (temporary file, then rename) and return the path."""
    payload = {
        "format": FORMAT, "version": VERSION,
        "model": ckpt.model.to_dict(), "label_names": list(ckpt.label_names),
        "feature": ckpt.feature, "feature_specs": {k: v.to_dict() for k, v in ckpt.specs.items()},
        "state_dict": ckpt.state_dict, "extra": ckpt.extra,
    }
    return save_torch_file(payload, path)


def load_checkpoint(path: str | os.PathLike[str]) -> Checkpoint:
    """Read a checkpoint safely (``weights_only=True``); :class:`CheckpointError` on any problem."""
    p = Path(path)
    raw = read_torch_file(p)
    if raw.get("format") != FORMAT:
        raise CheckpointError(f"{p} is not a specstore checkpoint")
    version = raw.get("version")
    if version not in (1, VERSION):
        raise CheckpointError(f"{p} has checkpoint version {version}; this specstore reads 1 and {VERSION}")
    try:
        if version == 1:  # an architecture's config (checked below)
            config = dict(raw["model"])
            arch = config.pop("arch", ModelConfig.arch)
            if arch not in ARCHS:
                raise ModelConfigError(f"unknown arch {arch!r}; expected one of {ARCHS}")
            model = ModelSpec(arch, config)
        else:
            model = ModelSpec.from_dict(raw["model"])
    except (KeyError, TypeError, ValueError, ModelConfigError, ConfigError) as e:
        raise CheckpointError(f"{p} has unreadable checkpoint metadata: {e}") from None
    _check_model_config(model, p)
    try:
        Calibration.from_extra(raw.get("extra"))  # a bad temperature is refused here, not at the first softmax
    except ConfigError as e:
        raise CheckpointError(f"{p} has a bad calibration: {e}") from None
    try:
        specs = ({k: FeatureSpec.from_dict(v) for k, v in raw["feature_specs"].items()} if "feature_specs" in raw
                 else {str(raw["feature"]): FeatureSpec.from_dict(raw["feature_spec"])})
    except ConfigError as e:
        raise CheckpointError(f"{p} has a bad feature spec: {e}") from None
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise CheckpointError(f"{p} has unreadable checkpoint metadata: {e}") from None
    try:
        ckpt = Checkpoint(model=model, label_names=_label_names(raw["label_names"], p), feature=str(raw["feature"]),
                          specs=specs, state_dict=dict(raw["state_dict"]), extra=dict(raw.get("extra") or {}),
                          source=str(p))
    except (KeyError, TypeError, ValueError, ModelConfigError, ConfigError) as e:
        raise CheckpointError(f"{p} has unreadable checkpoint metadata: {e}") from None
    _check_model_input(ckpt, p)
    return ckpt


def _label_names(names: Any, path: Path) -> list[str]:
    """A checkpoint's label names: a non-empty list of distinct strings (one line naming the file otherwise)."""
    if not isinstance(names, (list, tuple)) or not names or not all(isinstance(n, str) for n in names):
        raise CheckpointError(f"{path}: its label names must be a non-empty list of names")
    twice = sorted(n for n, k in Counter(names).items() if k > 1)
    if twice:
        raise CheckpointError(f"{path}: its label names hold {', '.join(map(repr, twice[:5]))} more than once; each "
                              "label is one output of the model, named once")
    return list(names)


def _check_model_input(ckpt: Checkpoint, path: Path) -> None:
    """The model's input rows and outputs, as its config or keyword arguments state them, against the features'
    bins and the labels: a mismatch is one line when the checkpoint is read, not a traceback at the first batch.
    (A model that states neither is checked when it is built, :meth:`Checkpoint.build`.)"""
    config = ckpt.config
    stated = config.to_dict() if config is not None else ckpt.model.kwargs
    rows, outputs = stated.get("n_bins"), stated.get("n_classes")
    if isinstance(rows, int) and rows != ckpt.n_bins:
        raise CheckpointError(f"{path}: its model reads {rows} input rows, but its feature {ckpt.feature!r} has "
                              f"{ckpt.n_bins} bins; the file is damaged or was put together by hand")
    if isinstance(outputs, int) and outputs != len(ckpt.label_names):
        raise CheckpointError(f"{path}: its model gives {outputs} outputs, but it names {len(ckpt.label_names)} "
                              "labels; the file is damaged or was put together by hand")


def _check_model_config(model: ModelSpec, path: Path) -> None:
    """An architecture's config, checked against its bounds (:class:`~specstore.infer.models.ModelConfig`: every
    field, the time stride and the parameter count) when the checkpoint is read, before any tensor of the
    model is allocated; one line naming the field, the value and the bound.  (An architecture registered from
    user code that this process has not registered is checked when it is built, after its module is trusted
    and imported; a shipped model class counts its own parameters when it is built, before it allocates.)"""
    if not model.builtin:  # an import path: a class named directly, no attribute chain (checked again, with
        try:  # the class's own module, when it is built)
            check_import_path(model.target, source=f"checkpoint {path}")
        except ConfigError as e:
            raise CheckpointError(str(e)) from None
        return
    try:
        model.config  # noqa: B018 -- constructing the config is the check
    except (TypeError, ValueError, ConfigError) as e:
        raise CheckpointError(f"{path} has a bad {model.target} model config: {e}") from None


def check_store_matches(ckpt: Checkpoint, store: Store) -> None:
    """Refuse a store whose features differ from the ones the checkpoint was trained on: one line naming every
    difference (a feature the store lacks, every field that differs) and the ``make features`` line that extracts
    the model's features, with its settings, into a new store
    (:func:`specstore.store.spec_command.extraction_command`)."""
    problems = []
    for name, spec in ckpt.specs.items():
        have = store.specs.get(name)
        if have is None:
            problems.append(f"{name}: not in the store (it holds {', '.join(store.specs) or 'none'})")
        else:
            problems += [f"{name}.{d}" for d in spec_differences(spec, have)]
    if not problems:
        return
    corpora = store.metadata.commit.corpora
    command = extraction_command(ckpt.specs, corpus=corpora[0].root if corpora else None,
                                 store=_new_store(str(store.location), ckpt.source))
    raise CheckpointError(f"the model{' ' + ckpt.source if ckpt.source else ''} needs feature {ckpt.feature!r} as it "
                          f"was trained on it, and store {store.location} differs (model != store): "
                          f"{'; '.join(problems)}; extract a new store with the model's settings: `{command}`")


def _new_store(location: str, model: str) -> str | None:
    """A path for a new store beside a local ``location``, named for ``model`` (None for a remote store)."""
    if "://" in location:
        return None
    base = location.rstrip("/")
    base = base[:-len(".zarr")] if base.endswith(".zarr") else base
    return f"{base}-{Path(model).stem if model else 'model'}.zarr"

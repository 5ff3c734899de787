"""The model contract: what any ``torch.nn.Module`` needs to be trained, run, evaluated and saved here.

**Required.** ``forward(x, lengths) -> logits``: ``x`` is ``(B, 1, n_bins, T)``
float (dB values, zero beyond each clip's length), ``lengths`` is ``(B,)``
int64 real frames, ``logits`` is ``(B, n_classes)``.

**Optional attributes** (defaults in brackets):

* ``time_stride`` [1]: input frames per output frame.  Batches are padded to
  a multiple of it and the planner charges for that.
* ``masks_padding`` [True]: the model ignores frames beyond ``lengths``
  (re-masks after every layer, pools over real frames), so a clip's logits
  do not depend on its batch.  A model that pools over padding sets it to
  False: it then runs on equal-length windows of ``window_frames`` frames
  (clips shorter than a window are padded to it, always alike), its logits
  for a clip are the mean over the clip's windows, and it trains on crops
  of that length, so a clip's result still does not depend on its batch.
* ``window_frames`` [431, about 10 s at 22 050 Hz / hop 512]: see above.
* ``pooled_sum(x, lengths, pool_start, pool_stop)`` and ``classify(sums,
  counts)``: exact windowing of clips too long for the memory budget (the
  built-in :class:`~specstore.infer.models.MaskedClassifier` has them).  Without them
  such a clip's logits are the mean of its windows' logits.
* ``grad_checkpoint`` [absent]: a bool the trainer sets for
  ``--grad-checkpoint``; a model that supports gradient checkpointing
  recomputes activations in backward when it is True.

**Saving.** A checkpoint records the model as a :class:`ModelSpec`: an import
path ``package.module:Class`` (or an architecture's name,
:mod:`specstore.infer.models.registry`) and JSON keyword arguments, never a pickled
object.  Loading imports the module,
which runs its code, so an import path loads only when trusted
(:mod:`specstore.infer.models.trust`: ``trust_model_code`` / ``--trust-model-code``, or the
``SPECSTORE_TRUSTED_MODULES`` allow-list), and anything that is not an
``nn.Module`` subclass is refused.  The module is found as any Python import:
in the folder a ``python -m``/``make`` command runs from, on ``PYTHONPATH``,
or in an installed package.  When the constructor accepts ``n_bins``, ``n_classes``,
``input_mean`` or ``input_std`` and the keyword arguments do not give them,
the trainer passes the store's feature bins, label count and the training
frames' mean and standard deviation (dB).

An architecture registered from user code (``docs/architectures.md``) is
recorded by its name with its builder's import path.  Registering is naming
the code yourself, so in a process that registered it the model builds as the
built-ins do; elsewhere the checkpoint's builder module is imported (which
registers it) only when trusted, as an import path is, and a builder that
differs from the registered one is refused.

The memory cost probe (:func:`specstore.infer.engine.cost.measure_cost_per_frame`) runs any
such module as it is, so budgets hold for user models too.
"""

from __future__ import annotations

import importlib
import inspect
import json
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from specstore.common import ConfigError
from specstore.infer.models import ARCHS, MaskedClassifier, ModelConfig, build_model
from specstore.infer.models.registry import ARCH_REGISTRY
from specstore.infer.models.renamed import current_import_path
from specstore.infer.models.trust import Trust, check_defined, check_trusted

__all__ = [
    "DEFAULT_WINDOW_FRAMES", "ModelSpec", "exact_windows", "masks_padding", "resolve_class", "spec_of",
    "time_stride", "window_align", "window_frames",
]

DEFAULT_WINDOW_FRAMES = 431
"""Window (frames) of a model that does not mask padding, unless it says otherwise (10 s at 43.07 frames/s)."""


def time_stride(model: nn.Module) -> int:
    """Input frames per output frame of ``model`` (its ``time_stride``; 1 if it has none)."""
    stride = getattr(model, "time_stride", 1)
    if not isinstance(stride, int) or isinstance(stride, bool) or stride < 1:
        raise ConfigError(f"{type(model).__name__}.time_stride must be a positive integer, got {stride!r}")
    return stride


def masks_padding(model: nn.Module) -> bool:
    """Whether ``model`` ignores padded frames (its ``masks_padding``; True if it does not say)."""
    return bool(getattr(model, "masks_padding", True))


def window_align(model: nn.Module) -> int:
    """Frames a long clip's windows start and split on (:mod:`specstore.infer.engine.windows`): the model's
    ``window_align`` (its time stride or pooling window), else its ``time_stride`` (musicnn: its 187-frame patch)."""
    return int(getattr(model, "window_align", getattr(model, "time_stride", 1)))


def window_frames(model: nn.Module) -> int:
    """The equal windows (frames, a multiple of the stride) a non-masking model runs on."""
    frames = int(getattr(model, "window_frames", DEFAULT_WINDOW_FRAMES))
    stride = time_stride(model)
    if frames < stride:
        raise ConfigError(f"{type(model).__name__}.window_frames must be >= its time stride ({stride})")
    return frames // stride * stride


def exact_windows(model: nn.Module) -> bool:
    """Whether over-long clips can be windowed exactly (the model exposes ``pooled_sum`` and ``classify``)."""
    return masks_padding(model) and callable(getattr(model, "pooled_sum", None)) and callable(
        getattr(model, "classify", None))


def _import_error(module_name: str, target: str, e: ImportError) -> ConfigError:
    """A one-line error for a model module that cannot be imported, naming the fix."""
    missing = e.name if isinstance(e, ModuleNotFoundError) else None
    if missing and (module_name == missing or module_name.startswith(missing + ".")):
        return ConfigError(
            f"cannot import {module_name!r} for model {target!r}: no module {missing!r} on Python's import path; "
            "run the command from the folder that holds it (python -m specstore.infer, make), add that folder to "
            "PYTHONPATH (e.g. PYTHONPATH=. specstore-train ...), or pip install the package that provides it")
    return ConfigError(f"cannot import {module_name!r} for model {target!r}: {type(e).__name__}: {e}")


def resolve_class(target: str, trust_model_code: Trust = False, *, source: str = "") -> type[nn.Module]:
    """The ``nn.Module`` subclass an import path ``package.module:Class`` names (one-line errors).

    The module is imported only if ``trust_model_code`` (or the allow-list)
    trusts it (:func:`specstore.infer.models.trust.check_trusted`; ``source`` names the file
    that asked for it in the error).
    """
    module_name, sep, qualname = target.partition(":")
    if not sep or not module_name or not qualname:
        raise ConfigError(f"a model is named by an import path 'package.module:Class' (or {', '.join(ARCHS)}), "
                          f"not {target!r}")
    check_trusted(target, trust_model_code, source=source)  # (an attribute chain is refused here, trusted or not)
    try:
        module: Any = importlib.import_module(module_name)
    except ImportError as e:
        raise _import_error(module_name, target, e) from None
    obj = getattr(module, qualname, None)
    if obj is None:
        raise ConfigError(f"{module_name!r} has no {qualname!r} (model {target!r})")
    if not (inspect.isclass(obj) and issubclass(obj, nn.Module)):
        raise ConfigError(f"{target!r} is not a torch.nn.Module subclass; refusing to build it")
    check_defined(target, obj)
    return obj


@dataclass(frozen=True)
class ModelSpec:
    """How to rebuild a model: ``target`` (an architecture's name, or ``package.module:Class``) and JSON kwargs.

    For an architecture the kwargs are a :class:`~specstore.infer.models.ModelConfig`'s
    fields; ``builder`` is the import path of a user-registered
    architecture's builder (filled from the registry; empty for the built-ins
    and import paths).  Checkpoints hold :meth:`to_dict`.
    """

    target: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    builder: str = ""

    def __post_init__(self) -> None:
        try:
            json.dumps(self.kwargs)
        except TypeError as e:
            raise ConfigError(f"model keyword arguments must be JSON values: {e}") from None
        if not self.builder and self.target in ARCHS and not ARCH_REGISTRY.get(self.target).builtin:
            object.__setattr__(self, "builder", ARCH_REGISTRY.get(self.target).builder)

    @property
    def builtin(self) -> bool:
        """An architecture of the registry (built from a :class:`ModelConfig`), not an import-path model."""
        return self.target in ARCHS or bool(self.builder)

    @property
    def config(self) -> ModelConfig | None:
        """The architecture's config (None for an import-path model, or an architecture not registered yet)."""
        return ModelConfig.from_dict({**self.kwargs, "arch": self.target}) if self.target in ARCHS else None

    def build(self, trust_model_code: Trust = False, *, source: str = "") -> nn.Module:
        """A fresh model (random weights); code not registered or named by the caller only when trusted
        (:mod:`specstore.infer.models.trust`)."""
        if self.builtin:
            self._register(trust_model_code, source)
            config = self.config
            assert config is not None
            return build_model(config)
        cls = resolve_class(self.target, trust_model_code, source=source)
        try:
            return cls(**self.kwargs)
        except TypeError as e:
            raise ConfigError(f"cannot build {self.target} with {self.kwargs}: {e}") from None

    def _register(self, trust_model_code: Trust, source: str) -> None:
        """Make sure :attr:`target` is registered, by :attr:`builder`: a recorded builder's module is imported
        (its import registers the architecture) only when trusted."""
        if self.target not in ARCHS:
            check_trusted(self.builder, trust_model_code, source=source)
            module_name = self.builder.partition(":")[0]
            try:
                importlib.import_module(module_name)
            except ImportError as e:
                raise _import_error(module_name, self.builder, e) from None
            if self.target not in ARCHS:
                raise ConfigError(f"importing {module_name!r} registers no architecture {self.target!r}")
        registered = ARCH_REGISTRY.get(self.target).builder
        if self.builder and registered != self.builder:
            raise ConfigError(f"architecture {self.target!r} was built by {self.builder!r} when saved; this process "
                              f"registers it as {registered!r}")

    def to_dict(self) -> dict[str, Any]:
        return {"target": self.target, "kwargs": dict(self.kwargs), **({"builder": self.builder} if self.builder
                                                                         else {})}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelSpec:
        """Inverse of :meth:`to_dict`; an import path recorded before the ``specstore`` namespace is read as the
        path that names it today (:mod:`specstore.infer.models.renamed`)."""
        return cls(current_import_path(str(data["target"])), dict(data.get("kwargs") or {}),
                   current_import_path(str(data.get("builder") or "")))

    @classmethod
    def for_class(cls, target: str, kwargs: dict[str, Any] | None = None, *, trust_model_code: Trust = False,
                  source: str = "", **available: Any) -> ModelSpec:
        """A spec for ``target`` whose kwargs are ``kwargs`` plus those of ``available`` (e.g. ``n_bins``,
        ``n_classes``, ``input_mean``) that the constructor accepts and ``kwargs`` does not set.  Reading the
        constructor imports a user model's module: ``trust_model_code`` as in :meth:`build`."""
        given = dict(kwargs or {})
        if target in ARCHS:
            return cls(target, {**available, **given})
        params = inspect.signature(resolve_class(target, trust_model_code, source=source).__init__).parameters
        takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        extra = {k: v for k, v in available.items() if k not in given and (takes_any or k in params)}
        return cls(target, {**extra, **given})


def spec_of(model: nn.Module, kwargs: dict[str, Any] | None = None) -> ModelSpec:
    """The :class:`ModelSpec` that rebuilds ``model``'s architecture.

    Models of a registered architecture know their config; for another module the spec is its
    class's import path with ``kwargs`` (the constructor arguments), or the
    module's ``init_kwargs`` attribute when it keeps them.
    """
    if isinstance(model, MaskedClassifier) and kwargs is None:
        config = model.config.to_dict()
        arch = config.pop("arch")
        return ModelSpec(arch, config)
    cls = type(model)
    if not cls.__qualname__.isidentifier():  # (a class inside a function or a class: no import path names it)
        raise ConfigError(f"{cls.__qualname__} is defined inside a function or a class; a checkpoint needs an "
                          "importable class (define it at module level)")
    return ModelSpec(f"{cls.__module__}:{cls.__qualname__}", dict(kwargs if kwargs is not None
                                                                   else getattr(model, "init_kwargs", {}) or {}))

"""The registries of model parts: architectures, time poolings and frequency poolings (no torch).

Each registry is the one list its part is read from: the command lines'
choices, :class:`~specstore.infer.models.config.ModelConfig`'s check and parameter
count, the checkpoint loader (:mod:`specstore.infer.models.contract`) and the documents
(``docs/architectures.md``).  An entry names its part, says what the part
costs in parameters from the config alone (so ``--help``, a bad option or a
checkpoint's bounds are answered before torch is imported), and names the
code that builds it by an import path ``package.module:attribute``, imported
on first use.

Adding a part is one entry: :func:`register_arch` (a
:class:`~specstore.infer.models.classifier.MaskedClassifier` subclass from user code
included), :func:`register_pooling`, :func:`register_freq_pooling`.  The
built-in entries (builders under ``specstore.infer.models.``) build freely; a model of
any other entry, read from a file, is built only when its module is trusted
(:mod:`specstore.infer.models.trust`), as an import-path model is.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar, overload

from specstore.infer.errors import RegistryError

from . import sizes

if TYPE_CHECKING:
    from specstore.infer.models.config import ModelConfig

__all__ = [
    "ARCH_REGISTRY", "Arch", "BUILTIN_PREFIX", "FREQ_POOLING_REGISTRY", "FreqPoolingEntry", "Names", "POOLING_REGISTRY",
    "PoolingEntry", "Registry", "RegistryError", "load_object", "register_arch", "register_freq_pooling",
    "register_pooling",
]

BUILTIN_PREFIX = "specstore.infer.models."
"""Builders under this package ship with specstore: their models build without trust."""


def load_object(path: str) -> Any:
    """The object an import path ``package.module:attribute`` names (its module is imported: runs its code)."""
    module_name, sep, qualname = path.partition(":")
    if not sep or not module_name or not qualname:
        raise RegistryError(f"a builder is named by an import path 'package.module:attribute', not {path!r}")
    obj: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


class _Entry(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def builder(self) -> str: ...


@dataclass(frozen=True)
class Arch:
    """An architecture: ``name`` (:attr:`ModelConfig.arch`), ``builder`` (import path of a callable taking a
    :class:`ModelConfig` and returning a :class:`~specstore.infer.models.classifier.MaskedClassifier`),
    ``n_parameters`` (the backbone's parameters, from the config) and ``last_activations`` (``(channels,
    frequency rows)`` of the backbone's output, which size the pooling and the head)."""

    name: str
    builder: str
    n_parameters: Callable[[ModelConfig], int]
    last_activations: Callable[[ModelConfig], tuple[int, int]] = sizes.last_activations

    @property
    def builtin(self) -> bool:
        """Ships with specstore (its builder is under :data:`BUILTIN_PREFIX`): builds without trust."""
        return self.builder.startswith(BUILTIN_PREFIX)


def _same(features: int) -> int:
    return features


def _none(features: int) -> int:
    return 0


@dataclass(frozen=True)
class PoolingEntry:
    """A time pooling: ``builder`` names a :class:`~specstore.infer.models.pooling.TimePooling` class (built with the
    feature count); ``head_inputs(features)``: what the head reads; ``n_parameters(features)``: its own."""

    name: str
    builder: str
    head_inputs: Callable[[int], int] = _same
    n_parameters: Callable[[int], int] = _none


@dataclass(frozen=True)
class FreqPoolingEntry:
    """A frequency pooling: ``builder`` names a :class:`~specstore.infer.models.pooling.FreqPooling` class;
    ``kept_rows(rows)``: the frequency rows each channel keeps as features of their own."""

    name: str
    builder: str
    kept_rows: Callable[[int], int]


E = TypeVar("E", bound=_Entry)


class Names(Sequence[str]):
    """A live, read-only view of a registry's names: ``in``, iteration and ``len`` see later entries (so
    command-line choices and config checks include parts registered from user code)."""

    def __init__(self, entries: dict[str, Any]) -> None:
        self._entries = entries

    @overload
    def __getitem__(self, index: int) -> str: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[str]: ...

    def __getitem__(self, index: int | slice) -> str | Sequence[str]:
        return tuple(self._entries)[index]

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(tuple(self._entries))

    def __repr__(self) -> str:
        return repr(tuple(self._entries))


class Registry(Generic[E]):
    """Named entries of one kind of part, in registration order (the one list of that part)."""

    def __init__(self, what: str) -> None:
        self.what = what
        self._entries: dict[str, E] = {}
        self.names = Names(self._entries)
        """The entries' names, a live view."""

    def register(self, entry: E) -> E:
        """Add ``entry``; registering a name again with the same builder replaces it (a module imported
        twice), with another builder raises :class:`RegistryError`."""
        old = self._entries.get(entry.name)
        if old is not None and old.builder != entry.builder:
            raise RegistryError(f"{self.what} {entry.name!r} is already registered, built by {old.builder!r}; "
                                f"pick another name for {entry.builder!r}")
        if not entry.name or not entry.name.isidentifier():
            raise RegistryError(f"a {self.what} name is a Python identifier, not {entry.name!r}")
        self._entries[entry.name] = entry
        return entry

    def get(self, name: str) -> E:
        """The entry named ``name`` (:class:`RegistryError` naming the known ones)."""
        try:
            return self._entries[name]
        except KeyError:
            raise RegistryError(f"unknown {self.what} {name!r}; expected one of {tuple(self._entries)}") from None

    def build(self, name: str, *args: Any) -> Any:
        """The part ``name`` built from ``args`` (its builder's module imported on first use)."""
        return load_object(self.get(name).builder)(*args)


ARCH_REGISTRY: Registry[Arch] = Registry("arch")
POOLING_REGISTRY: Registry[PoolingEntry] = Registry("pooling")
FREQ_POOLING_REGISTRY: Registry[FreqPoolingEntry] = Registry("freq_pooling")


def register_arch(arch: Arch) -> Arch:
    """Make ``arch`` a value of :attr:`ModelConfig.arch` (and of ``--arch``) in this process."""
    return ARCH_REGISTRY.register(arch)


def register_pooling(pooling: PoolingEntry) -> PoolingEntry:
    """Make ``pooling`` a value of :attr:`ModelConfig.pooling` in this process."""
    return POOLING_REGISTRY.register(pooling)


def register_freq_pooling(pooling: FreqPoolingEntry) -> FreqPoolingEntry:
    """Make ``pooling`` a value of :attr:`ModelConfig.freq_pooling` in this process."""
    return FREQ_POOLING_REGISTRY.register(pooling)


def _double(features: int) -> int:
    return 2 * features


def _score(features: int) -> int:
    return features + 1


def _one(rows: int) -> int:
    return 1


def _all(rows: int) -> int:
    return rows


register_arch(Arch("cnn", "specstore.infer.models.cnn:SpectrogramCNN", sizes.cnn_parameters))
register_arch(Arch("resnet", "specstore.infer.models.resnet:SpectrogramResNet", sizes.resnet_parameters))
register_arch(Arch("musicnn", "specstore.infer.models.musicnn:build_musicnn", sizes.musicnn_parameters,
                   sizes.musicnn_activations))
register_pooling(PoolingEntry("mean", "specstore.infer.models.pooling:MeanPooling"))
register_pooling(PoolingEntry("meanstd", "specstore.infer.models.pooling:MeanStdPooling", head_inputs=_double))
register_pooling(PoolingEntry("attention", "specstore.infer.models.pooling:AttentionPooling", n_parameters=_score))
register_freq_pooling(FreqPoolingEntry("mean", "specstore.infer.models.pooling:FreqMean", kept_rows=_one))
register_freq_pooling(FreqPoolingEntry("keep", "specstore.infer.models.pooling:FreqKeep", kept_rows=_all))

"""How each feature kind is computed: the pipeline's half of the registry of kinds (:mod:`specstore.store.kinds`).

A computation turns a :class:`~specstore.store.FeatureSpec` into a :class:`FeaturePlan`
(the spec's constants, built once: filter banks, windows) whose
:meth:`~FeaturePlan.stream` computes the feature's rows from decoded audio
fed a block at a time (:func:`specstore.pipeline.features.compute_features` feeds
every feature of a file from one decode).  The kinds registered here are the
ones :mod:`specstore.store.kinds` knows, one computation per kind name; a kind added
from user code registers its entry there and its computation here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import numpy as np
import numpy.typing as npt

from specstore.common import ConfigError
from specstore.store.kinds import CQT, MEL, MUSICNN
from specstore.store.spec import FeatureSpec

from .cqt import cqt_plan
from .mel import mel_plan, musicnn_plan

__all__ = [
    "FeaturePlan",
    "FeatureStream",
    "computation_names",
    "plan_for",
    "register_computation",
    "unregister_computation",
]


class FeatureStream(Protocol):
    """One feature of one file being computed: fed decoded blocks in order, then finished."""

    def feed(self, x: np.ndarray) -> None:
        """Take the next block of samples (float32 mono at the spec's rate); compute the frames now complete."""

    def finish(self, n: int, n_frames: int) -> np.ndarray:
        """Compute the last frames of a signal of ``n`` samples; the ``(n_frames, n_bins)`` rows not yet sunk."""
        ...


class FeaturePlan(Protocol):
    """A spec's constants for streaming: the fewest samples one frame needs, and a stream maker."""

    @property
    def min_samples(self) -> int:
        """Fewest decoded samples (at the spec's rate) for one whole frame."""
        ...

    def stream(self, frames_hint: int, dtype: npt.DTypeLike = np.float32,
               sink: Callable[[np.ndarray], None] | None = None) -> FeatureStream:
        """A stream whose rows come back in ``dtype`` (or go to ``sink`` in order, a block at a time).

        ``frames_hint`` is the expected frame count (from the file's header;
        0 with a sink), so the output is allocated once.
        """
        ...


Computation = Callable[[FeatureSpec], FeaturePlan]
"""A spec -> its plan; raises ConfigError for a spec the kind cannot compute."""

_COMPUTATIONS: dict[str, Computation] = {}
"""kind name -> computation (the one explicit registry of computations)."""


def register_computation(kind: str, computation: Computation) -> None:
    """Register how kind ``kind`` is computed (a kind already registered here is an error)."""
    if kind in _COMPUTATIONS:
        raise ConfigError(f"feature kind {kind!r} already has a computation")
    _COMPUTATIONS[kind] = computation


def unregister_computation(kind: str) -> None:
    """Remove a computation registered from user or test code (a no-op for a kind not registered)."""
    _COMPUTATIONS.pop(kind, None)


def computation_names() -> tuple[str, ...]:
    """The kinds with a registered computation, in registration order."""
    return tuple(_COMPUTATIONS)


def plan_for(spec: FeatureSpec) -> FeaturePlan:
    """The streaming plan of ``spec`` by its kind; ConfigError for a kind without a computation."""
    try:
        computation = _COMPUTATIONS[spec.kind]
    except KeyError:
        raise ConfigError(f"no computation registered for feature kind {spec.kind!r}; "
                          f"known: {', '.join(computation_names())}") from None
    return computation(spec)


register_computation(MEL.name, mel_plan)
register_computation(CQT.name, cqt_plan)
register_computation(MUSICNN.name, musicnn_plan)

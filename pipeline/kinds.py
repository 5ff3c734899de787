"""How each feature kind is computed: the pipeline's half of a kind (:mod:`specstore.store.kinds` holds the rest).

A computation turns a spec of its kind (an instance of the kind's parameters class) into a :class:`FeaturePlan`
(the spec's constants, built once: filter banks, windows) whose
:meth:`~FeaturePlan.stream` computes the feature's rows from decoded audio
fed a block at a time (:func:`specstore.pipeline.features.compute_features` feeds
every feature of a file from one decode).  The kinds registered here are the
ones :mod:`specstore.store.kinds` knows, one computation per kind name; a kind added
from user code registers its object there and its computation here (one call each).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import numpy as np
import numpy.typing as npt

from specstore.common import ConfigError
from specstore.store.kinds import CQT, MEL, MUSICNN
from specstore.store.spec import FeatureSpec

from .cqt import cqt_plan
from .mel import mel_plan, musicnn_plan
from .streaming import Output

__all__ = [
    "FeaturePlan",
    "FeatureStream",
    "WholeSignal",
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


S = TypeVar("S", bound=FeatureSpec)

Computation = Callable[[S], FeaturePlan]
"""A spec of the kind (its parameters class) -> its plan; raises ConfigError for a spec the kind cannot compute."""

_COMPUTATIONS: dict[str, Computation[Any]] = {}
"""kind name -> computation (the one explicit registry of computations)."""


def register_computation(kind: str, computation: Computation[S]) -> None:
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


@dataclass(frozen=True)
class WholeSignal(Generic[S]):
    """A plan that computes a feature from a file's whole decoded signal, once it has all of it.

    ``compute(y, spec)`` takes the float32 mono samples at the spec's rate and gives ``(1 + len(y) //
    hop_length, n_bins)`` values (librosa's centred frames); ``min_samples``: the fewest samples one frame
    needs (an FFT size).  The stream holds the file's samples until it is finished (a minute at 22 050 Hz is
    5 MiB), so this suits a new kind's first computation and short clips; the built-in kinds stream in
    constant memory instead.  ``register_computation("mfcc", lambda spec: WholeSignal(spec, mfcc, spec.n_fft))``.
    """

    spec: S
    compute: Callable[[np.ndarray, S], np.ndarray]
    min_samples: int = 1

    def stream(self, frames_hint: int, dtype: npt.DTypeLike = np.float32,
               sink: Callable[[np.ndarray], None] | None = None) -> FeatureStream:
        return _WholeSignalStream(self, Output(self.spec.n_bins, frames_hint, dtype, sink))


class _WholeSignalStream:
    def __init__(self, plan: WholeSignal[Any], out: Output) -> None:
        self.plan, self.out = plan, out
        self.parts: list[np.ndarray] = []

    def feed(self, x: np.ndarray) -> None:
        self.parts.append(np.array(x, dtype=np.float32))

    def finish(self, n: int, n_frames: int) -> np.ndarray:
        y = np.concatenate(self.parts)[:n] if self.parts else np.zeros(0, np.float32)
        values = np.asarray(self.plan.compute(y, self.plan.spec))
        want = (n_frames, self.plan.spec.n_bins)
        if values.shape != want:
            raise ValueError(f"the {self.plan.spec.kind} computation gave values of shape {values.shape}, not "
                             f"(frames, n_bins) = {want}")
        self.out.rows(0, n_frames)[...] = values
        return self.out.finish(n_frames)


register_computation(MEL.name, mel_plan)
register_computation(CQT.name, cqt_plan)
register_computation(MUSICNN.name, musicnn_plan)

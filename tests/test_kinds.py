"""The registry of feature kinds: one entry per kind in store/ (spec defaults, display) and pipeline/ (computation).

Adding a kind is one entry on each side plus its tests: the toy linear-frequency
STFT below is registered from test code, extracted into a store with
``specstore.pipeline.extract`` and read back, with no other module edited.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import librosa
import numpy as np
import numpy.typing as npt
import pytest

from specstore.common import ConfigError
from specstore.pipeline import extract  # make features' Python API
from specstore.pipeline.features import compute_features
from specstore.pipeline.kinds import computation_names, plan_for, register_computation, unregister_computation
from specstore.pipeline.streaming import Output
from specstore.pipeline.testing import write_music_like
from specstore.store import FeatureSpec, default_specs, open_store
from specstore.store.kinds import (
    DEFAULT_KINDS,
    FeatureKind,
    db_limits,
    feature_kind,
    kind_names,
    picture_feature,
    register_kind,
    unregister_kind,
)


def test_every_kind_has_a_computation_and_every_computation_a_kind() -> None:
    assert kind_names() == computation_names()
    assert set(DEFAULT_KINDS) <= set(kind_names())


def test_the_built_in_defaults_are_unchanged() -> None:
    """The registry's defaults are the specs stores and checkpoints were written with."""
    assert FeatureSpec.mel() == FeatureSpec(kind="mel")
    assert FeatureSpec.cqt() == FeatureSpec(kind="cqt", n_bins=84, n_fft=None, fmin=32.70319566257483, fmax=None,
                                            bins_per_octave=12, power=1.0, amin=1e-5)
    assert FeatureSpec.cqt(n_bins=24) == FeatureSpec.of_kind("cqt", n_bins=24)
    assert default_specs() == {"mel": FeatureSpec.mel(), "cqt": FeatureSpec.cqt()}
    assert dict(db_limits) == {"mel": (-60.0, 40.0), "cqt": (-80.0, 20.0), "musicnn": (0.0, 5.0)}


def test_unknown_kinds_are_refused_with_the_known_ones() -> None:
    known = r"\('mel', 'cqt', 'musicnn'\)"
    with pytest.raises(ConfigError, match=rf"unknown feature kind 'chroma'; expected one of {known}"):
        FeatureSpec(kind="chroma")
    with pytest.raises(ConfigError, match=r"unknown feature 'chroma'; choose from \['cqt', 'mel', 'musicnn'\]"):
        default_specs(["chroma"])
    with pytest.raises(ConfigError, match="already registered"):
        register_kind(feature_kind("mel"))
    with pytest.raises(ConfigError, match="already has a computation"):
        register_computation("mel", lambda spec: plan_for(spec))


def test_the_picture_is_the_preferred_kind_else_the_first_feature() -> None:
    mel, cqt = FeatureSpec.mel(), FeatureSpec.cqt()
    assert picture_feature({"c": cqt, "m": mel}) == "m"
    assert picture_feature({"c": cqt, "d": cqt}) == "c"
    assert feature_kind("cqt").log_frequency and not feature_kind("mel").log_frequency


# -- a third kind, registered from user code ----------------------------------------------------------

@dataclass(frozen=True)
class _LinearPlan:
    """A toy kind: |STFT| in dB on a linear frequency axis, computed at the end (fine for short clips)."""

    spec: FeatureSpec

    @property
    def min_samples(self) -> int:
        return int(self.spec.n_fft or 0)

    def stream(self, frames_hint: int, dtype: npt.DTypeLike = np.float32,
               sink: Callable[[np.ndarray], None] | None = None) -> _LinearStream:
        return _LinearStream(self.spec, Output(self.spec.n_bins, frames_hint, dtype, sink))


class _LinearStream:
    def __init__(self, spec: FeatureSpec, out: Output) -> None:
        self.spec, self.out, self.parts = spec, out, []  # type: list[np.ndarray]

    def feed(self, x: np.ndarray) -> None:
        self.parts.append(x.copy())

    def finish(self, n: int, n_frames: int) -> np.ndarray:
        self.out.rows(0, n_frames)[...] = linear_db(np.concatenate(self.parts)[:n], self.spec)
        return self.out.finish(n_frames)


def linear_db(y: np.ndarray, spec: FeatureSpec) -> np.ndarray:
    """The toy kind's values: ``(n_frames, n_bins)`` float32 magnitude dB."""
    mag = np.abs(librosa.stft(y, n_fft=spec.n_fft, hop_length=spec.hop_length))
    return librosa.amplitude_to_db(mag, ref=spec.db_ref, amin=spec.amin, top_db=None).T.astype(np.float32)


def _linear_axis(spec: FeatureSpec) -> dict[str, Any]:
    return {"y_axis": "linear", "n_fft": spec.n_fft}


@pytest.fixture
def linear_kind() -> Iterator[FeatureKind]:
    kind = register_kind(FeatureKind(name="linear", db_limits=(-80.0, 30.0), axis=_linear_axis,
                                     defaults={"n_fft": 256, "n_bins": 129, "fmax": None, "power": 1.0}))
    register_computation("linear", _LinearPlan)
    try:
        yield kind
    finally:
        unregister_computation("linear")
        unregister_kind("linear")


def test_a_kind_registered_from_user_code_is_extracted_and_read_back(tmp_path: Path,
                                                                     linear_kind: FeatureKind) -> None:
    assert kind_names() == computation_names() == (*DEFAULT_KINDS, "musicnn", "linear")
    corpus = tmp_path / "corpus"
    files = [write_music_like(corpus / label / f"{label}.wav", 0.6 + 0.2 * k, seed=k)
             for k, label in enumerate(("rock", "jazz"))]
    specs = {"mel": FeatureSpec.mel(n_bins=16), "linear": FeatureSpec.of_kind("linear")}
    summary = extract(corpus, tmp_path / "s.zarr", specs=specs, jobs=1, backend="threading",
                              progress=False)
    assert summary.indexed == 2 and not summary.errors
    store = open_store(tmp_path / "s.zarr")
    assert store.specs["linear"] == specs["linear"] and db_limits["linear"] == (-80.0, 30.0)
    for path in files:
        i = list(store.paths).index(f"{path.parent.name}/{path.name}")
        y, _ = librosa.load(path, sr=22050, mono=True)
        expected = linear_db(y, specs["linear"]).astype(np.float16)
        np.testing.assert_array_equal(np.asarray(store.feature("linear").frames(i)), expected)
        mel = compute_features(path, {"mel": specs["mel"]}, out_dtypes={"mel": "float16"}).arrays["mel"]
        np.testing.assert_array_equal(np.asarray(store.feature("mel").frames(i)), mel)
    assert picture_feature(store.specs) == "mel"

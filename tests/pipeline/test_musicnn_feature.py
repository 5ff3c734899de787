"""The ``musicnn`` feature kind: musicnn's input, stored in float32, equal to its plain librosa formula."""

from __future__ import annotations

from pathlib import Path

import librosa
import numpy as np
import pytest

from specstore.common import ConfigError
from specstore.pipeline import extract
from specstore.pipeline.features import compute_features
from specstore.pipeline.spec_options import specs_from_options
from specstore.pipeline.testing import write_music_like
from specstore.store import FeatureSpec, open_store


def musicnn_reference(y: np.ndarray) -> np.ndarray:
    """The original extractor's formula (musicnn 0.1.0 ``batch_data``) without its float16 cast:
    ``(n_frames, 96)`` float32 ``log10(1 + 10000 * mel power)``."""
    power = librosa.feature.melspectrogram(y=y, sr=16000, hop_length=256, n_fft=512, n_mels=96).T
    return np.log10(10000 * power.astype(np.float32) + 1).astype(np.float32)


def test_the_musicnn_spec_is_the_pretrained_input() -> None:
    spec = FeatureSpec.of_kind("musicnn")
    assert (spec.sample_rate, spec.hop_length, spec.n_fft, spec.n_bins, spec.dtype) == (16000, 256, 512, 96,
                                                                                         "float32")
    # beside it, the other features follow its frame grid (a store has one)
    specs = specs_from_options(["mel", "musicnn"])
    assert {(s.sample_rate, s.hop_length) for s in specs.values()} == {(16000, 256)}
    assert specs_from_options(["mel"])["mel"].sample_rate == 22050
    with pytest.raises(ConfigError, match="pretrained model's input: its sample_rate is 16000, not 22050"):
        specs_from_options(["musicnn"], sample_rate=22050)
    with pytest.raises(ConfigError, match="power 2"):
        compute_features(Path("unused.wav"), {"musicnn": FeatureSpec.of_kind("musicnn", power=1.0)})


def test_the_musicnn_feature_equals_its_reference_and_is_stored_in_float32(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    files = [write_music_like(corpus / label / f"{label}.wav", 1.5 + k, seed=k) for k, label in
             enumerate(("rock", "jazz"))]
    specs = specs_from_options(["musicnn", "mel"], n_mels=16)
    summary = extract(corpus, tmp_path / "s.zarr", specs=specs, jobs=1, backend="threading", progress=False)
    assert summary.indexed == 2 and not summary.errors
    store = open_store(tmp_path / "s.zarr")
    for path in files:
        i = list(store.paths).index(f"{path.parent.name}/{path.name}")
        y, _ = librosa.load(path, sr=16000, mono=True)
        got = np.asarray(store.feature("musicnn").frames(i))
        expected = musicnn_reference(y)
        assert got.dtype == np.float32 and got.shape == expected.shape
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5 * float(np.abs(expected).max()))
        # float16 storage would move it by about 1e-3 relative: the test can tell them apart
        assert np.abs(expected.astype(np.float16).astype(np.float32) - expected).max() > 1e-4

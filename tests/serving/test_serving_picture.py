"""The upload page's picture axes (:mod:`specstore.serving.picture`): ticks at the right seconds, Hz and dB."""

from __future__ import annotations

import io

import librosa
import numpy as np
import pytest
from matplotlib import colormaps, colors, image

from specstore.serving.clips import mel_picture
from specstore.serving.picture import PictureScale, frequency_ticks, picture_frames, time_ticks
from specstore.store import FeatureSpec


@pytest.mark.parametrize("n", [1, 87, 640, 641, 1300, 5000])
def test_the_time_axis_spans_the_pictures_columns(n: int) -> None:
    png = image.imread(io.BytesIO(mel_picture(np.zeros((4, n), np.float32), (-60.0, 40.0))))
    cols = png.shape[1]
    assert picture_frames(n) % cols == 0 and picture_frames(n) // cols * (cols - 1) < n <= picture_frames(n)
    ticks = time_ticks(n, 512 / 22050)
    span = picture_frames(n) * 512 / 22050
    for t in ticks:
        assert abs(t["at"] * span - float(t["label"].removesuffix(" s"))) < 1e-9 and 0 <= t["at"] <= 1
    assert ticks[0]["label"] == "0 s" and len(ticks) <= 8


@pytest.mark.parametrize("spec", [FeatureSpec.mel(), FeatureSpec.mel(n_bins=16), FeatureSpec.mel(fmin=50.0, fmax=None),
                                  FeatureSpec.cqt()])
def test_frequency_ticks_sit_on_the_bins_centre_frequencies(spec: FeatureSpec) -> None:
    """Row k (centre at (k + 0.5) / n of the height) is bin k's centre: librosa's mel or CQT frequencies."""
    n = spec.n_bins
    if spec.kind == "mel":
        fmax = spec.fmax if spec.fmax is not None else spec.sample_rate / 2
        centres, scale = librosa.mel_frequencies(n + 2, fmin=spec.fmin, fmax=fmax)[1:-1], librosa.hz_to_mel
    else:
        centres, scale = librosa.cqt_frequencies(n, fmin=spec.fmin, bins_per_octave=12), np.log2
    ticks = frequency_ticks(spec)
    assert len(ticks) >= 3
    for t in ticks:
        hz = float(t["label"].removesuffix(" Hz"))
        b = t["at"] * n - 0.5  # fractional bin; centres are evenly spaced on the scale
        k = int(np.clip(np.floor(b), 0, n - 2))
        on_scale = scale(centres[k]) + (b - k) * (scale(centres[k + 1]) - scale(centres[k]))
        assert abs(on_scale - scale(hz)) < 1e-6 * max(1.0, abs(scale(hz)))
    assert [t["at"] for t in ticks] == sorted(t["at"] for t in ticks)


def test_the_colour_bar_is_the_pictures_colour_map() -> None:
    scale = PictureScale.of(FeatureSpec.mel(n_bins=4), (-60.0, 40.0))
    png = image.imread(io.BytesIO(mel_picture(np.array([[-60.0, 40.0]] * 4, np.float32), (-60.0, 40.0))))
    assert scale.colours[0] == colors.to_hex(colormaps["magma"](0.0))
    for pixel, colour in ((png[0, 0, :3], scale.colours[0]), (png[0, 1, :3], scale.colours[-1])):
        np.testing.assert_allclose(pixel, colors.to_rgb(colour), atol=1.01 / 255)  # 8-bit pixels
    assert [t["label"] for t in scale.db] == ["-60 dB", "-40 dB", "-20 dB", "0 dB", "20 dB", "40 dB"]
    assert scale.db[0]["at"] == 0.0 and scale.db[-1]["at"] == 1.0

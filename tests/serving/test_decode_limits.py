"""Decode work is bounded from the header before any decoding.

A FLAC of 599 s at 655 350 Hz x 8 channels is 3.4 MB and passes a limit on
seconds alone, yet costs a minute of decode.  ``decode_file`` /
``decode_bytes`` check the header's sample rate, channels and duration each
against its limit and refuse with one line naming the limit, before the
decoder runs.  Small files of the same kind stand in for the attack file.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

import specstore.serving.clips as clips
from specstore.serving.clips import ClipError, decode_bytes, decode_file
from specstore.store import FeatureSpec

SPECS = {"mel": FeatureSpec.mel(n_bins=16)}
#: The server's limits: clips.DEFAULT_MAX_SAMPLE_RATE and clips.DEFAULT_MAX_CHANNELS, and --max-seconds' default.
LIMITS = dict(max_seconds=600.0, max_sample_rate=192_000, max_channels=8)


def _write(path: Path, seconds: float, sr: int, channels: int, fmt: str) -> Path:
    rng = np.random.default_rng(0)
    sf.write(path, (0.1 * rng.standard_normal((int(seconds * sr), channels))).astype(np.float32), sr, format=fmt)
    return path


@pytest.fixture
def no_decoding(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any decode fails the test: a refusal must come from the header alone."""
    monkeypatch.setattr(clips, "stored_features", lambda *a, **k: pytest.fail("decoding started"))


def test_suggested_defaults() -> None:
    assert (getattr(clips, "DEFAULT_MAX_SAMPLE_RATE", None), getattr(clips, "DEFAULT_MAX_CHANNELS", None)) == (
        LIMITS["max_sample_rate"], LIMITS["max_channels"])


@pytest.mark.parametrize(("seconds", "sr", "channels", "fmt", "message"), [
    (0.05, 655_350, 8, "FLAC", "sample rate of 655350 Hz is above the limit of 192000 Hz"),  # the attack file's kind
    (0.2, 384_000, 1, "WAV", "sample rate of 384000 Hz is above the limit of 192000 Hz"),
    (0.2, 22_050, 16, "WAV", "audio of 16 channels is above the limit of 8 channels"),
])
def test_a_header_asking_too_much_is_refused_before_decoding(tmp_path: Path, no_decoding: None, seconds: float,
                                                             sr: int, channels: int, fmt: str, message: str) -> None:
    f = _write(tmp_path / f"x.{fmt.lower()}", seconds, sr, channels, fmt)
    with pytest.raises(ClipError) as err:
        decode_file(f, SPECS, **LIMITS)
    assert str(err.value) == message
    with pytest.raises(ClipError, match="above the limit"):
        decode_bytes(f.read_bytes(), SPECS, **LIMITS)


def test_each_limit_is_checked_on_its_own(tmp_path: Path, no_decoding: None) -> None:
    f = _write(tmp_path / "x.wav", 3.0, 48_000, 4, "WAV")
    with pytest.raises(ClipError, match="sample rate of 48000 Hz is above the limit of 44100 Hz"):
        decode_file(f, SPECS, max_sample_rate=44_100)
    with pytest.raises(ClipError, match="audio of 4 channels is above the limit of 2 channels"):
        decode_file(f, SPECS, max_channels=2)
    with pytest.raises(ClipError, match="audio of 3 s is longer than the limit of 1 s"):
        decode_file(f, SPECS, max_seconds=1.0)


def test_files_within_the_limits_decode(tmp_path: Path) -> None:
    f = _write(tmp_path / "x.flac", 1.0, 192_000, 8, "FLAC")  # exactly at both limits
    clip = decode_file(f, SPECS, **LIMITS)
    assert clip.duration == pytest.approx(1.0, abs=0.01) and clip.features.shape[0] == 16
    assert decode_bytes(f.read_bytes(), SPECS, **LIMITS).hash == clip.hash
    assert decode_file(f, SPECS).n_frames == clip.n_frames  # no limits: as before

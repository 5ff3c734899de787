"""pipeline.audio: streaming decode equals librosa.load; every bad input is a one-line AudioError."""

from __future__ import annotations

import math
import os
import tracemalloc
from pathlib import Path

import librosa
import numpy as np
import pytest
import soundfile as sf

from specstore.pipeline import mixdown
from specstore.pipeline.audio import AudioError, StreamResampler, probe, stream_mono
from specstore.pipeline.testing import (
    write_corrupt_flac,
    write_empty,
    write_music_like,
    write_short_wav,
    write_text_as_wav,
    write_truncated_mp3,
    write_truncated_wav,
    write_zero_length_wav,
)

SR = 22050


def _cat(path: Path, sr: int = SR, **kw) -> np.ndarray:
    blocks = list(stream_mono(path, sr, **kw))
    assert all(b.dtype == np.float32 and b.ndim == 1 and b.size > 0 for b in blocks)
    return np.concatenate(blocks)


# (suffix, native rate, channels, exact): lossless and Vorbis decode the same
# samples whatever the read size, and streaming soxr is sample-identical to
# the one-shot resampling librosa does, so those must match bit for bit.
# libsndfile's MP3 decoder (mpg123) returns float32 values that depend on
# where read calls end, by an ulp or so; librosa.load reads once.  (MP3s that
# libsndfile itself writes at 22.05 kHz mono contain frames mpg123 reports as
# broken, "part2_3_length too large"; its concealment of those depends on the
# read boundaries too, by up to ~1e-3, so they are not used here.)
CASES = [
    ("wav", 44100, 2, True),
    ("flac", 22050, 1, True),
    ("flac", 48000, 2, True),
    ("ogg", 44100, 2, True),
    ("mp3", 44100, 2, False),
    ("mp3", 16000, 1, False),
]


@pytest.mark.parametrize("fmt,sr,channels,exact", CASES, ids=[f"{c[0]}-{c[1]}-{c[2]}ch" for c in CASES])
def test_stream_equals_librosa_load(tmp_path: Path, fmt: str, sr: int, channels: int, exact: bool) -> None:
    p = write_music_like(tmp_path / f"x.{fmt}", 7.3, seed=3, sr=sr, channels=channels)
    ref, _ = librosa.load(p, sr=SR, mono=True)
    got = _cat(p, block_samples=10_000)  # many blocks
    assert got.shape == ref.shape
    if exact:
        np.testing.assert_array_equal(got, ref)
    else:
        assert np.abs(got - ref).max() <= 1e-6
        assert np.abs(got - ref).mean() <= 1e-7


@pytest.mark.parametrize("fmt", ["WAV", "AIFF", "AU"])
@pytest.mark.parametrize("channels", [1, 2, 3])
def test_pcm16_read_as_int16_is_libsndfiles_float_read(tmp_path: Path, fmt: str, channels: int) -> None:
    # 16-bit PCM is read as int16 and scaled here (faster than libsndfile's own conversion); the samples must
    # be the bits of its float32 read and of librosa.load, extremes of the int16 range included.
    rng = np.random.default_rng(channels)
    x = rng.integers(-32768, 32768, size=(9001, channels), dtype=np.int16)
    x[:4] = [[-32768], [32767], [0], [-1]]
    p = tmp_path / f"x.{fmt.lower()}"
    sf.write(p, x, SR, format=fmt, subtype="PCM_16")
    with sf.SoundFile(p) as f:
        assert mixdown.reads_pcm16(f)
    ref = sf.read(p, dtype="float32", always_2d=True)[0].mean(axis=1, dtype=np.float32)
    got = _cat(p, block_samples=1000)
    np.testing.assert_array_equal(got, ref)
    np.testing.assert_array_equal(got, librosa.load(p, sr=SR, mono=True)[0])


def test_compressed_and_wider_pcm_keep_the_float_read(tmp_path: Path) -> None:
    x = np.zeros((100, 1), dtype=np.float32)
    for name, subtype in [("a.flac", "PCM_16"), ("b.wav", "PCM_24"), ("c.wav", "FLOAT")]:
        sf.write(tmp_path / name, x, SR, subtype=subtype)
        with sf.SoundFile(tmp_path / name) as f:
            assert not mixdown.reads_pcm16(f), name


def test_block_size_does_not_change_samples(tmp_path: Path) -> None:
    p = write_music_like(tmp_path / "x.wav", 5.0, seed=1, sr=44100, channels=2)
    a = _cat(p, block_samples=999)
    b = _cat(p, block_samples=1 << 20)
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("sr_in", [8000, 16000, 32000, 44100, 48000])
def test_resampled_length_is_librosas(tmp_path: Path, sr_in: int) -> None:
    n = 12_345
    p = write_short_wav(tmp_path / "x.wav", n_samples=n, sr=sr_in)
    assert _cat(p, block_samples=1000).shape[0] == math.ceil(n * SR / sr_in)


def test_no_resampling_at_native_rate_is_the_file(tmp_path: Path) -> None:
    p = write_music_like(tmp_path / "x.flac", 3.0, seed=2, sr=SR, channels=1)
    data, _ = sf.read(p, dtype="float32")
    np.testing.assert_array_equal(_cat(p, block_samples=4096), data)


def test_multichannel_downmix_is_the_channel_mean(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    x = (0.2 * rng.standard_normal((5000, 4))).astype(np.float32)
    p = tmp_path / "quad.wav"
    sf.write(p, x, SR, subtype="FLOAT")
    np.testing.assert_allclose(_cat(p, block_samples=777), x.mean(axis=1), rtol=0, atol=1e-7)


def test_stream_resampler_matches_librosa_resample_with_scale() -> None:
    rng = np.random.default_rng(1)
    y = rng.standard_normal(50_001).astype(np.float32)
    ref = librosa.resample(y, orig_sr=2, target_sr=1, res_type="soxr_hq", scale=True)
    rs = StreamResampler(2, 1, scale=True)
    parts = [rs.push(y[i : i + 3000]) for i in range(0, y.size, 3000)] + [rs.finish()]
    np.testing.assert_array_equal(np.concatenate(parts), ref)


def test_stream_memory_does_not_grow_with_length(tmp_path: Path) -> None:
    p = write_music_like(tmp_path / "long.wav", 120.0, seed=4, sr=44100, channels=2, loop_seconds=10.0)
    block = 8192
    tracemalloc.start()
    try:
        n = 0
        for b in stream_mono(p, SR, block_samples=block):
            n += b.shape[0]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert n == 120 * SR
    decoded_bytes = 120 * 44100 * 2 * 4
    # a few blocks of float32 stereo, nowhere near the 42 MB the file decodes to
    assert peak < 16 * block * 2 * 4 + 256 * 1024, (peak, decoded_bytes)


def test_probe(tmp_path: Path) -> None:
    p = write_music_like(tmp_path / "x.flac", 2.5, seed=0, sr=44100, channels=2)
    info = probe(p)
    assert (info.sample_rate, info.channels, info.n_samples) == (44100, 2, 110250)
    assert info.duration == pytest.approx(2.5)
    assert info.format == "FLAC/PCM_16"


# ---------------------------------------------------------------- bad input


def _reason(path: Path, target_sr: int = SR) -> str:
    with pytest.raises(AudioError) as ei:
        for _ in stream_mono(path, target_sr):
            pass
    err = ei.value
    assert "\n" not in str(err)
    assert err.path == os.fspath(path)
    assert str(err) == f"{os.fspath(path)}: {err.reason}"
    return err.reason


def test_empty_file(tmp_path: Path) -> None:
    assert _reason(write_empty(tmp_path / "e.wav")) == "empty file"
    with pytest.raises(AudioError, match="empty file"):
        probe(tmp_path / "e.wav")


def test_text_renamed_wav(tmp_path: Path) -> None:
    r = _reason(write_text_as_wav(tmp_path / "t.wav"))
    assert r.startswith("not an audio file: ") and "Format not recognised" in r


def test_zero_length_wav(tmp_path: Path) -> None:
    p = write_zero_length_wav(tmp_path / "z.wav")
    assert probe(p).n_samples == 0  # a valid header; the samples decide
    assert _reason(p) == "zero-length audio"


def test_corrupt_flac(tmp_path: Path) -> None:
    r = _reason(write_corrupt_flac(tmp_path / "c.flac"))
    assert r.startswith("decode failed at frame ")
    frame = int(r.split("frame ")[1].split(":")[0])
    assert frame >= 0


def test_missing_file(tmp_path: Path) -> None:
    assert _reason(tmp_path / "nope.wav") == "file not found"


def test_broken_symlink(tmp_path: Path) -> None:
    link = tmp_path / "dangling.wav"
    link.symlink_to(tmp_path / "gone.wav")
    assert _reason(link) == "broken symlink"


def test_directory_is_unreadable(tmp_path: Path) -> None:
    d = tmp_path / "album.wav"
    d.mkdir()
    assert _reason(d) == "unreadable: is a directory"


@pytest.mark.skipif(os.geteuid() == 0, reason="running as root: chmod 000 does not stop root from reading")
def test_permission_denied(tmp_path: Path) -> None:
    p = write_short_wav(tmp_path / "locked.wav")
    p.chmod(0)
    try:
        assert _reason(p) == "unreadable: permission denied"
    finally:
        p.chmod(0o644)


def test_non_finite_samples(tmp_path: Path) -> None:
    x = np.zeros(4000, dtype=np.float32)
    x[1234] = np.nan
    p = tmp_path / "nan.wav"
    sf.write(p, x, SR, subtype="FLOAT")
    assert _reason(p).startswith("non-finite samples")


@pytest.mark.parametrize("writer, suffix", [(write_truncated_wav, "wav"), (write_truncated_mp3, "mp3")])
def test_truncated_files_are_rejected_not_shortened(tmp_path: Path, writer, suffix: str) -> None:
    p = writer(tmp_path / f"tr.{suffix}", seconds=3.0, sr=SR)
    assert _reason(p).startswith("truncated: ")


def test_truncated_ogg_and_flac_are_rejected(tmp_path: Path) -> None:
    for ext in ("ogg", "flac"):
        full = write_music_like(tmp_path / f"full.{ext}", 4.0, seed=2)
        data = full.read_bytes()
        cut = tmp_path / f"cut.{ext}"
        cut.write_bytes(data[: len(data) * 2 // 3])
        assert _cat(full).shape[0] == 4 * SR
        reason = _reason(cut)
        assert reason.startswith("truncated: ") or reason.startswith("decode failed"), reason

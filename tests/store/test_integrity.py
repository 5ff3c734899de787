"""Truncation detection from container headers: no false alarms on whole files, every cut caught."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from specstore.pipeline.integrity import truncation_reason
from specstore.pipeline.testing import write_music_like


@pytest.mark.parametrize("ext, sr, channels", [("wav", 22050, 1), ("wav", 44100, 2), ("ogg", 22050, 2),
                                               ("mp3", 44100, 2), ("mp3", 22050, 1), ("flac", 22050, 1)])
def test_whole_files_pass_and_cut_files_are_caught(tmp_path: Path, ext: str, sr: int, channels: int) -> None:
    full = write_music_like(tmp_path / f"a.{ext}", 5.0, seed=1, sr=sr, channels=channels)
    assert truncation_reason(full) is None
    data = full.read_bytes()
    for keep in (0.3, 0.6, 0.9):
        cut = tmp_path / f"cut{keep}.{ext}"
        cut.write_bytes(data[: int(len(data) * keep)])
        reason = truncation_reason(cut)
        if ext == "flac":  # FLAC is checked while decoding (declared sample count), not here
            assert reason is None
        else:
            assert reason is not None and reason.startswith("truncated: "), (ext, keep)


def test_streamed_wav_with_unknown_length_is_not_judged(tmp_path: Path) -> None:
    full = write_music_like(tmp_path / "a.wav", 2.0)
    data = bytearray(full.read_bytes())
    at = data.find(b"data")
    data[at + 4: at + 8] = struct.pack("<I", 0xFFFFFFFF)
    p = tmp_path / "stream.wav"
    p.write_bytes(bytes(data[: len(data) // 2]))
    assert truncation_reason(p) is None


def test_non_audio_and_tiny_files_are_not_judged(tmp_path: Path) -> None:
    (tmp_path / "t.wav").write_text("hello")
    (tmp_path / "x.mp3").write_bytes(b"\x00" * 100)
    assert truncation_reason(tmp_path / "t.wav") is None
    assert truncation_reason(tmp_path / "x.mp3") is None

"""A header whose length disagrees with the audio is an error, not a shorter clip.

libsndfile never decodes past the frame count a header declares, so a 3 h
Vorbis file whose last granule position says 1 s was stored and classified
as 1 s.  The fixtures here are real files whose header is rewritten: the
last Ogg page's granule position (with its CRC), FLAC's STREAMINFO sample
count, an MP3's Xing frame count.  Declaring less than the file holds is
"longer than declared"; declaring more is "truncated", as the integrity
checks already call a cut-off file.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from factories import make_corpus

from specstore.pipeline.audio import AudioError, probe, stream_mono
from specstore.pipeline.extract import extract
from specstore.pipeline.testing import write_music_like
from specstore.serving.clips import ClipError, decode_file
from specstore.store import FeatureSpec, open_store

MEL = {"mel": FeatureSpec.mel(n_bins=16)}
SECONDS = 4.0


def _ogg_crc(page: bytes) -> int:
    """An Ogg page's CRC-32 (polynomial 0x04C11DB7, not reflected, initial value 0)."""
    crc = 0
    for byte in page:
        crc ^= byte << 24
        for _ in range(8):
            crc = ((crc << 1) ^ 0x04C11DB7) & 0xFFFFFFFF if crc & 0x80000000 else (crc << 1) & 0xFFFFFFFF
    return crc


def _declare(data: bytearray, kind: str, frames: int, declared: int) -> None:
    """Rewrite the header of a ``kind`` file of ``frames`` sample frames so that it declares ``declared``."""
    if kind in ("ogg", "opus"):  # the last page's granule position, keeping Opus's pre-skip
        at = data.rfind(b"OggS")
        n_seg = data[at + 26]
        end = at + 27 + n_seg + sum(data[at + 27: at + 27 + n_seg])
        granule = int.from_bytes(data[at + 6: at + 14], "little")
        data[at + 6: at + 14] = (granule - frames + declared).to_bytes(8, "little")
        data[at + 22: at + 26] = bytes(4)
        data[at + 22: at + 26] = _ogg_crc(bytes(data[at:end])).to_bytes(4, "little")
    elif kind == "flac":  # STREAMINFO's 36-bit total sample count
        assert data[:4] == b"fLaC"
        word = int.from_bytes(data[18:26], "big")
        data[18:26] = ((word & ~((1 << 36) - 1)) | declared).to_bytes(8, "big")
    else:  # the Xing header's frame count (MPEG frames, scaled)
        at = data.find(b"Xing", 0, 200)
        assert at > 0 and data[at + 7] & 0x1, "the MP3 has no Xing frame count"
        count = int.from_bytes(data[at + 8: at + 12], "big")
        data[at + 8: at + 12] = max(1, count * declared // frames).to_bytes(4, "big")


def write_misdeclared(path: Path, declared_seconds: float, seconds: float = SECONDS, seed: int = 11) -> Path:
    """A music-like file of ``seconds`` whose header declares ``declared_seconds`` (format from the suffix)."""
    kind = path.suffix.lstrip(".")
    if kind == "opus":
        sr = 48000
        y = np.random.default_rng(seed).uniform(-0.3, 0.3, int(seconds * sr)).astype(np.float32)
        path.parent.mkdir(parents=True, exist_ok=True)
        sf.write(path, y, sr, format="OGG", subtype="OPUS")
    else:
        sr = 22050
        write_music_like(path, seconds, seed=seed, sr=sr)
    data = bytearray(path.read_bytes())
    _declare(data, kind, sf.info(str(path)).frames, int(round(declared_seconds * sr)))
    path.write_bytes(bytes(data))
    return path


def _decode(path: Path) -> int:
    return sum(len(c) for c in stream_mono(path, 22050))


@pytest.mark.parametrize("kind", ["ogg", "opus", "flac", "mp3"])
def test_a_header_declaring_less_than_the_file_holds_is_an_error(tmp_path: Path, kind: str) -> None:
    f = write_misdeclared(tmp_path / f"x.{kind}", 1.0)
    assert probe(f).duration == pytest.approx(1.0, abs=0.1)  # what the header says: 1 s of 4
    with pytest.raises(AudioError, match=r"longer than declared: the .* declares \d+ samples \(\d\.\d\d s\), "
                                         r"but more audio follows at byte \d+ of \d+"):
        _decode(f)


@pytest.mark.parametrize(("kind", "declared"), [("flac", 9.6), ("ogg", 8.5), ("mp3", 9.9)])
def test_a_small_understatement_is_found(tmp_path: Path, kind: str, declared: float) -> None:
    """The decoder reads to the end of the file here: FLAC frame numbers, Ogg granules, MPEG frames show the rest."""
    f = write_misdeclared(tmp_path / f"x.{kind}", declared, seconds=10.0)
    with pytest.raises(AudioError, match="longer than declared"):
        _decode(f)


@pytest.mark.parametrize("kind", ["ogg", "opus", "mp3"])
def test_a_header_declaring_more_than_the_file_holds_is_truncated(tmp_path: Path, kind: str) -> None:
    f = write_misdeclared(tmp_path / f"x.{kind}", 2 * SECONDS)
    with pytest.raises(AudioError, match=r"truncated: the (Ogg|MP3 Xing) header declares \d+ samples, \d+ decoded"):
        _decode(f)


@pytest.mark.parametrize("kind", ["ogg", "flac", "mp3"])
def test_tags_and_junk_after_the_audio_are_not_more_audio(tmp_path: Path, kind: str) -> None:
    f = write_music_like(tmp_path / f"x.{kind}", 2.0, seed=3)
    n = _decode(f)
    rng = np.random.default_rng(0)
    picture = b"\xff\xd8\xff\xe0" + rng.integers(0, 256, 30000, dtype=np.uint8).tobytes() + b"\xff\xd9"
    tagged = tmp_path / f"tagged.{kind}"
    tagged.write_bytes(f.read_bytes() + b"APETAGEX" + bytes(24) + picture + b"TAG" + bytes(125))
    assert _decode(tagged) == n


def test_make_features_records_a_misdeclared_file_as_an_error(tmp_path: Path) -> None:
    c = tmp_path / "c"
    make_corpus(c, n=2, seconds=1.0)
    write_misdeclared(c / "rock" / "liar.ogg", 1.0)
    write_misdeclared(c / "jazz" / "cut.opus", 2 * SECONDS)
    summary = extract(c, str(tmp_path / "s.zarr"), specs=MEL, jobs=1, progress=False)
    assert set(summary.errors) == {"rock/liar.ogg", "jazz/cut.opus"}
    assert summary.errors["rock/liar.ogg"].startswith("longer than declared: the Ogg header declares 22050 samples")
    assert summary.errors["jazz/cut.opus"].startswith("truncated: the Ogg header declares")
    s = open_store(tmp_path / "s.zarr")
    assert dict(s.errors) == summary.errors and len(s.paths) == 2
    assert "rock/liar.ogg: longer than declared" in summary.report()


def test_classify_refuses_a_misdeclared_file(tmp_path: Path) -> None:
    f = write_misdeclared(tmp_path / "liar.ogg", 1.0)
    with pytest.raises(ClipError, match="longer than declared: the Ogg header declares 22050 samples"):
        decode_file(f, MEL, max_seconds=2.0)  # the header passes the limit; the audio does not match it

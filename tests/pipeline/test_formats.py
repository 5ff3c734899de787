"""Formats soundfile cannot read (m4a/AAC, WMA) decode through PyAV; AIFF is searched.

Every file is made here with PyAV's own encoders (:func:`specstore.pipeline.testing.write_with_av`)
from one music-like signal also written as a 16-bit WAV, and decoded through
the project's entry points: :func:`specstore.pipeline.audio.stream_mono` and
:func:`specstore.pipeline.stored_features` (what ``specstore classify`` and the server
decode with), and :func:`specstore.pipeline.extract` (``make features``) into a store.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

pytest.importorskip("av", reason="PyAV (the formats extra) is not installed")

import specstore.pipeline.decode_av as decode_av  # noqa: E402
from specstore.pipeline import extract, scan_corpus, stored_features  # noqa: E402
from specstore.pipeline.audio import AudioError, probe, stream_mono  # noqa: E402
from specstore.pipeline.corpus import AUDIO_EXTENSIONS  # noqa: E402
from specstore.pipeline.testing import music_like, write_truncated_m4a, write_with_av  # noqa: E402
from specstore.serving.classify import expand_inputs  # noqa: E402
from specstore.serving.clips import ClipError, decode_bytes, decode_file  # noqa: E402
from specstore.store import FeatureSpec, open_store  # noqa: E402

SR = 44_100  # source rate: every decode below also mixes down (stereo) and resamples (to 22 050 Hz)
SPECS = {"mel": FeatureSpec.mel(n_bins=16)}
#: suffix -> the header format :func:`probe` reports (AIFF is soundfile's, the others PyAV's).
NEW = {"m4a": "MP4/aac", "wma": "ASF/wmav2", "aac": "AAC/aac", "aiff": "AIFF/PCM_16"}


def _mel(path: Path) -> np.ndarray:
    return stored_features(path, SPECS).arrays["mel"].astype(np.float32)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The same 1.5 s stereo signal as a 16-bit WAV and in each new format, plus a 440 Hz tone per format."""
    root = tmp_path_factory.mktemp("formats")
    x = music_like(1.5, seed=3, sr=SR, channels=2)
    x = np.round(x * 32768) / 32768  # what a 16-bit file holds, so AIFF and WAV carry the same samples
    out = {"wav": root / "ref.wav"}
    sf.write(out["wav"], x, SR, subtype="PCM_16")
    t = np.arange(int(1.5 * SR)) / SR
    tone = np.repeat(0.3 * np.sin(2 * np.pi * 440.0 * t)[:, None], 2, axis=1).astype(np.float32)
    for ext in NEW:
        out[ext] = write_with_av(root / f"music.{ext}", x, SR)
        out[f"tone.{ext}"] = write_with_av(root / f"tone.{ext}", tone, SR)
    return out


@pytest.mark.parametrize("ext", list(NEW))
def test_each_new_format_decodes_to_the_signal_it_was_made_from(files: dict[str, Path], ext: str) -> None:
    info = probe(files[ext])
    assert (info.format, info.sample_rate, info.channels) == (NEW[ext], SR, 2)
    assert info.duration == pytest.approx(1.5, abs=0.05)
    y = np.concatenate(list(stream_mono(files[f"tone.{ext}"], 22_050)))
    assert len(y) == pytest.approx(1.5 * 22_050, abs=0.05 * 22_050)
    peak_hz = np.argmax(np.abs(np.fft.rfft(y))) * 22_050 / len(y)
    assert peak_hz == pytest.approx(440.0, abs=1.0)

    got, ref = _mel(files[ext]), _mel(files["wav"])
    if ext == "aiff":  # lossless, and soundfile's own path: the WAV's values exactly
        np.testing.assert_array_equal(got, ref)
        return
    n = min(len(got), len(ref)) - 4
    envelope = np.abs(got[4:n].mean(axis=0) - ref[4:n].mean(axis=0))  # per mel band, dB
    assert envelope.max() < 4.0, envelope  # codec tolerance at 128 kbit/s (WMA the coarsest, ~3 dB)
    framewise = min(np.median(np.abs(got[4 + k:n] - ref[4:n - k])) for k in range(3))  # up to 2 frames of delay
    assert framewise < 1.5


def test_a_store_holds_what_classify_decodes(files: dict[str, Path], tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    for i, ext in enumerate(NEW):
        (corpus / f"g{i % 2}").mkdir(parents=True, exist_ok=True)
        (corpus / f"g{i % 2}" / f"x.{ext}").write_bytes(files[ext].read_bytes())
    write_truncated_m4a(corpus / "g0" / "cut.m4a", sr=SR)
    summary = extract(corpus, tmp_path / "s.zarr", specs=SPECS, jobs=1, progress=False)
    assert list(summary.errors) == ["g0/cut.m4a"]
    assert summary.errors["g0/cut.m4a"].startswith(("decode failed at frame", "truncated:"))
    store = open_store(tmp_path / "s.zarr")
    assert sorted(store.paths) == sorted(f"g{i % 2}/x.{ext}" for i, ext in enumerate(NEW))
    for i, path in enumerate(store.paths):
        clip = decode_file(corpus / path, SPECS)  # specstore classify's and the server's decode
        np.testing.assert_array_equal(np.asarray(store.feature("mel").frames(i)).T, clip.features)
        upload = decode_bytes((corpus / path).read_bytes(), SPECS)  # an upload: its name says nothing
        np.testing.assert_array_equal(upload.features, clip.features)


@pytest.mark.parametrize("index_first", [True, False], ids=["index-first", "index-last"])
def test_a_cut_m4a_is_one_line_error(tmp_path: Path, index_first: bool) -> None:
    p = write_truncated_m4a(tmp_path / "cut.m4a", index_first=index_first)
    with pytest.raises(AudioError) as err:
        list(stream_mono(p, 22_050))
    reason = err.value.reason
    assert "\n" not in reason and str(err.value) == f"{p}: {reason}"
    want = ("decode failed at frame", "truncated:") if index_first else ("not an audio file:",)
    assert reason.startswith(want), reason
    with pytest.raises(ClipError, match="^(decode failed|truncated|not an audio file)"):
        decode_file(p, SPECS)


def test_a_playlist_is_not_followed(files: dict[str, Path], tmp_path: Path) -> None:
    """A file that is an HLS playlist naming a local file must not make FFmpeg read that file as its audio."""
    playlist = tmp_path / "list.m3u8"
    playlist.write_text(f"#EXTM3U\n#EXT-X-TARGETDURATION:10\n#EXTINF:1.5,\n{files['m4a']}\n#EXT-X-ENDLIST\n")
    with pytest.raises(AudioError, match="not an audio file"):
        list(stream_mono(playlist, 22_050))
    with pytest.raises(ClipError, match="^not an audio file"):
        decode_bytes(playlist.read_bytes(), SPECS)


def test_decoding_stops_past_the_declared_length(files: dict[str, Path]) -> None:
    with decode_av.AvReader(str(files["m4a"])) as reader:
        reader.declared = 4096  # a header declaring 0.09 s of a 1.5 s file
        with pytest.raises(AudioError, match="longer than declared: the MP4 header declares 4096 samples"):
            for _ in reader.blocks(1024):
                pass
        assert reader.decoded <= 4096  # stopped there: the rest was never decoded


def test_header_limits_hold_for_the_new_formats(files: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    import specstore.serving.clips as clips

    monkeypatch.setattr(clips, "stored_features", lambda *a, **k: pytest.fail("decoding started"))
    for ext in ("m4a", "wma"):
        with pytest.raises(ClipError, match="longer than the limit"):
            decode_file(files[ext], SPECS, max_seconds=0.25)
        with pytest.raises(ClipError, match="audio of 2 channels is above the limit of 1 channels"):
            decode_file(files[ext], SPECS, max_channels=1)


def test_without_pyav_such_files_name_the_extra(files: dict[str, Path], tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(decode_av, "available", lambda: False)
    with pytest.raises(AudioError) as err:
        list(stream_mono(files["m4a"], 22_050))
    assert err.value.reason == ".m4a files need the optional PyAV decoder, which is not installed: " \
                               "pip install 'specstore[formats]'"
    with pytest.raises(ClipError, match=r"specstore\[formats\]"):
        decode_file(files["wma"], SPECS)
    upload = tmp_path / "upload.audio"  # an upload's name says nothing of its format
    upload.write_bytes(files["m4a"].read_bytes())
    with pytest.raises(AudioError, match=r"^.*: not an audio file: .* \(files soundfile cannot read need .*formats"):
        probe(upload)
    bad_wav = tmp_path / "bad.wav"
    bad_wav.write_bytes(b"RIFF....not audio at all")
    with pytest.raises(AudioError, match=r"not an audio file: Format not recognised\.$"):
        probe(bad_wav)  # soundfile's own formats: its reason, unchanged
    assert probe(files["aiff"]).format == "AIFF/PCM_16"  # soundfile reads AIFF without PyAV


def test_folders_are_searched_for_the_new_extensions(tmp_path: Path) -> None:
    names = ["a.m4a", "b.M4A", "c.aac", "d.wma", "e.aiff", "f.aif", "g.m4b", "h.wav", "notes.txt", "video.mp4"]
    for name in names:
        (tmp_path / "corpus" / "rock").mkdir(parents=True, exist_ok=True)
        (tmp_path / "corpus" / "rock" / name).write_bytes(b"x")
    _, items = scan_corpus(tmp_path / "corpus")
    want = sorted(f"rock/{n}" for n in names if n not in ("notes.txt", "video.mp4"))
    assert sorted(it.path for it in items) == want
    assert sorted(Path(p).name for p in expand_inputs([tmp_path / "corpus"])) == sorted(Path(w).name for w in want)
    assert {".m4a", ".aac", ".wma", ".aiff", ".aif"} <= AUDIO_EXTENSIONS

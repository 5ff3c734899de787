"""A file that is not audio gets one reason whatever its name and whichever command reads it.

libsndfile given a path takes the name as a hint: a text file named
``x.mp3`` went to libmpg123, which printed three ``Note:`` lines, and came
back as "File does not exist or is not a regular file"; named ``x.flac`` it
opened with a sample rate of 0; through PyAV a ``.m4a`` was "Invalid data
found".  Every decoder now judges the bytes (soundfile reads through the
file's descriptor), so ``make features``, ``specstore classify`` and the
server all say "not an audio file: Format not recognised." and nothing
else.  libmpg123's own ``Note:`` lines, printed for real MP3s with junk
between frames, are counted as its lines and logged from worker processes.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import soundfile as sf
from factories import make_checkpoint

from specstore.pipeline import extract
from specstore.pipeline.audio import AudioError, probe, stream_mono
from specstore.pipeline.decoder_log import DecoderWarnings, captured_stderr, library_of
from specstore.pipeline.testing import write_music_like
from specstore.serving.cli import main as specstore_main
from specstore.store import FeatureSpec

REASON = "not an audio file: Format not recognised."
SPEC = FeatureSpec.mel(n_bins=16)
NAMES = ("x.mp3", "x.flac", "x.ogg", "x.wav", "x.m4a", "x.wma", "upload-1")


def _texts(folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for name in NAMES:
        (folder / name).write_text("hello, these are words and not audio at all\n" * 3)
        out.append(folder / name)
    return out


def test_every_name_gets_the_same_reason_from_probe_and_decode(tmp_path: Path,
                                                               capfd: pytest.CaptureFixture[str]) -> None:
    for p in _texts(tmp_path):
        for read in (probe, lambda f: list(stream_mono(f, 22050))):
            with pytest.raises(AudioError) as err:
                read(p)
            assert err.value.reason == REASON, (p.name, err.value.reason)
    assert capfd.readouterr().err == ""  # libmpg123 was never asked to read a text file


def test_features_classify_and_the_server_say_the_same(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    from starlette.testclient import TestClient

    from specstore.infer.engine.runtime import RunOptions
    from specstore.serving.app import Service, create_app
    from specstore.serving.config import ServeConfig
    from specstore.serving.model import Classifier

    corpus = tmp_path / "corpus"
    texts = _texts(corpus / "rock")
    good = write_music_like(corpus / "rock" / "good.wav", 1.0, seed=1)
    summary = extract(corpus, str(tmp_path / "s.zarr"), specs={"mel": SPEC}, jobs=1, progress=False)
    assert summary.errors == {f"rock/{p.name}": REASON for p in texts if p.suffix}  # folders: audio names only

    model = make_checkpoint(tmp_path / "m.pt", spec=SPEC)
    assert specstore_main(["classify", *map(str, texts), "--model", str(model), "--device", "cpu",
                           "--no-progress"]) == 1
    err = capfd.readouterr().err
    assert err.splitlines() == [f"specstore: {p}: {REASON}" for p in texts], err

    service = Service(Classifier(model, RunOptions(device="cpu", progress=False)), ServeConfig(workers=1))
    with TestClient(create_app(service), base_url="http://localhost") as client:
        r = client.post("/classify", files=[("file", (p.name, p.read_bytes())) for p in texts]
                        + [("file", ("good.wav", good.read_bytes()))])
    assert r.status_code == 200, r.text
    assert [f.get("error") for f in r.json()["files"]] == [REASON] * len(texts) + [None]


def test_libmpg123_notes_about_junk_between_frames_are_its_lines(tmp_path: Path,
                                                                  capfd: pytest.CaptureFixture[str]) -> None:
    clean = write_music_like(tmp_path / "clean.mp3", 3.0, seed=1, sr=44100, channels=1, format="mp3")
    data = bytearray(clean.read_bytes())
    data[len(data) // 2:len(data) // 2] = b"JUNK" * 32  # not a frame: libmpg123 resyncs past it
    junk = tmp_path / "junk.mp3"
    junk.write_bytes(bytes(data))
    got = DecoderWarnings()
    with captured_stderr(got):
        audio, _ = sf.read(junk)
    lines = capfd.readouterr().err.splitlines()
    assert len(audio) == 3 * 44100 and lines and all(line.startswith("Note: ") for line in lines), lines
    assert got.counts == {"libmpg123": len(lines)}
    assert [library_of(line) for line in lines] == ["libmpg123"] * len(lines)
    for other in ("Note: see the docs", "Notes: Trying to resync", "a Note: Trying to resync"):
        assert library_of(other) is None


"""The C decoders' own lines on stderr: logged and counted, one summary line per run.

libmpg123 (libsndfile's MP3 decoder) writes ``[src/libmpg123/layer3.c:...]
error: part2_3_length (4095) too large ...`` to file descriptor 2 for a
frame it conceals; the file decodes and the exit status is 0, but the line
reads as a failure.  Decode worker processes now divert those lines into
``logging`` (``specstore.decoder``, INFO: ``-v`` shows them); in-process
decoding leaves them on stderr; either way the run ends with one line
counting them.  The fixture is an MP3 with one frame's side info damaged so
that libmpg123 complains, as it does about real files.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import soundfile as sf
from factories import make_checkpoint

from specstore.pipeline import extract
from specstore.pipeline.decoder_log import DecoderWarnings, captured_stderr, library_of
from specstore.pipeline.testing import write_music_like
from specstore.serving.cli import main as specstore_main
from specstore.store import FeatureSpec

ROOT = Path(__file__).resolve().parents[2]
SPEC = FeatureSpec.mel(n_bins=16)
RAW = "[src/libmpg123/"
"""How libmpg123's own lines start on stderr."""
SUMMARY = re.compile(r"(\d+) decoder warnings? \(libmpg123\) during this run")

# MPEG-1 Layer III bit rates by header index, kbit/s (index 0, "free", is not written by libsndfile)
_BITRATES = (0, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320)


def write_noisy_mp3(path: Path, seed: int, frame: int = 5) -> Path:
    """A 3 s music-like 44.1 kHz mono MP3 whose ``frame``-th frame claims more bits than it has.

    Its side info's ``main_data_begin`` is set to 0 and granule 0's
    ``part2_3_length`` to 4095 bits: libmpg123 prints "part2_3_length (4095)
    too large for available bit count", conceals the frame, and the file
    decodes to its full length.
    """
    write_music_like(path, 3.0, seed=seed, sr=44100, channels=1, format="mp3")
    data = bytearray(path.read_bytes())
    starts, i = [], 0
    while i + 4 <= len(data) and len(starts) <= frame:
        if data[i] == 0xFF and data[i + 1] & 0xFE == 0xFA:  # frame sync, MPEG-1, Layer III
            starts.append(i)
            i += max(1, 144_000 * _BITRATES[data[i + 2] >> 4] // 44100 + (data[i + 2] >> 1 & 1))
        else:
            i += 1
    side = starts[frame] + 4 + (0 if data[starts[frame] + 1] & 1 else 2)  # after the header (and its CRC)
    bits = int.from_bytes(data[side:side + 4], "big") & ~(0x1FF << 23) | 0xFFF << 2
    data[side:side + 4] = bits.to_bytes(4, "big")
    path.write_bytes(bytes(data))
    return path


@pytest.fixture()
def noisy(tmp_path: Path) -> list[Path]:
    """Two noisy MP3s of different content (so both are decoded)."""
    return [write_noisy_mp3(tmp_path / f"noisy{k}.mp3", seed=k) for k in (1, 2)]


def _raw_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith(RAW)]


def _summaries(stderr: str) -> list[int]:
    return [int(m.group(1)) for m in SUMMARY.finditer(stderr)]


def test_the_fixture_makes_libmpg123_complain_and_still_decodes(noisy: list[Path],
                                                                capfd: pytest.CaptureFixture[str]) -> None:
    audio, sr = sf.read(noisy[0])
    err = capfd.readouterr().err
    assert sr == 44100 and len(audio) == 3 * 44100
    assert [line.split("] ", 1)[1] for line in _raw_lines(err)] == [
        "error: part2_3_length (4095) too large for available bit count (1496)"], err


def test_library_of_names_the_c_library_and_nothing_else() -> None:
    assert library_of("[src/libmpg123/layer3.c:INT123_do_layer3():1774] error: part2_3_length too large") \
        == "libmpg123"
    assert library_of("\r50%|#####     | [src/libmpg123/parse.c:123] warning: x") == "libmpg123"
    assert library_of("[vorbisfile.c:12] bad page") == "vorbisfile.c"
    for line in ("Traceback (most recent call last):", "WARNING pipeline.extract: [x] done",
                 "  File \"a.py\", line 3, in <module>", "[1/3] files", ""):
        assert library_of(line) is None, line


def test_in_process_capture_passes_everything_through_and_counts_the_decoders_lines(
        noisy: list[Path], capfd: pytest.CaptureFixture[str]) -> None:
    got = DecoderWarnings()
    with captured_stderr(got):
        sf.read(noisy[0])
        print("python's own line", file=sys.stderr, flush=True)
        with captured_stderr(got):  # nested (another thread's decode): fd 2 comes back once, at the end
            sf.read(noisy[1])
    sys.stderr.write("after\n")
    err = capfd.readouterr().err
    assert len(_raw_lines(err)) == 2 and "python's own line\n" in err and err.endswith("after\n"), err
    assert got.counts == {"libmpg123": 2} and got.shown == 2 and got.lines == []
    assert got.summary() is not None and "printed above" in got.summary()  # type: ignore[operator]


def test_many_lines_from_several_threads_are_all_passed_through_and_counted(
        capfd: pytest.CaptureFixture[str]) -> None:
    """Far more than a pipe holds (64 KiB), from three decoding threads at once: no line lost, no deadlock."""
    line = b"[src/libmpg123/layer3.c:INT123_do_layer3():1774] error: part2_3_length (4095) too large\n"
    got = [DecoderWarnings() for _ in range(3)]

    def decode(into: DecoderWarnings) -> None:
        with captured_stderr(into):
            for _ in range(3000):
                os.write(2, line)

    threads = [threading.Thread(target=decode, args=(w,)) for w in got]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    err = capfd.readouterr().err
    assert len(_raw_lines(err)) == 9000 and sum(w.total for w in got) == 9000 and all(w.shown == w.total for w in got)


_WORKER_SCRIPT = textwrap.dedent('''
    import concurrent.futures as cf, logging, multiprocessing, os, sys
    import soundfile as sf
    from specstore.pipeline.decoder_log import DecoderLogListener, log_summary

    def job(path):
        sf.read(path)
        print("python stderr of the worker", file=sys.stderr)
        logging.getLogger("worker").warning("logging of the worker")
        os.write(2, b"another C library's line\\n")
        return 0

    if __name__ == "__main__":
        logging.basicConfig(level=logging.INFO if "-v" in sys.argv else logging.WARNING,
                            format="%(levelname)s %(name)s: %(message)s")
        listener = DecoderLogListener()
        context = multiprocessing.get_context(sys.argv[1])
        with cf.ProcessPoolExecutor(1, mp_context=context, **listener.pool_options()) as pool:
            assert list(pool.map(job, sys.argv[2:4])) == [0, 0]
        log_summary(listener.close())
''')


@pytest.mark.parametrize("context", ["spawn", "fork"])
def test_a_worker_pool_diverts_only_the_decoders_lines(tmp_path: Path, noisy: list[Path], context: str) -> None:
    """Python's stderr and logging in the worker (inherited handlers too, with fork) and other C lines get through."""
    script = tmp_path / "pool.py"
    script.write_text(_WORKER_SCRIPT)
    done = subprocess.run([sys.executable, str(script), context, *map(str, noisy)], capture_output=True, text=True,
                          timeout=120, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    err = done.stderr
    assert _raw_lines(err) == [] and _summaries(err) == [2], err
    for line in ("python stderr of the worker", "logging of the worker", "another C library's line"):
        assert err.count(line) == 2, err


def _classify(*args: str) -> subprocess.CompletedProcess[str]:
    code = "import sys\nfrom specstore.serving.cli import main\nsys.exit(main(sys.argv[1:]))\n"
    return subprocess.run([sys.executable, "-c", code, "classify", "--no-progress", *args], capture_output=True,
                          text=True, timeout=300, cwd=ROOT)


@pytest.mark.slow  # a fresh process that imports torch: ~5 s; the next test covers the same in-process
def test_classify_with_workers_prints_one_count_and_no_decoder_line(tmp_path: Path, noisy: list[Path]) -> None:
    """``specstore classify --jobs 2`` as a user runs it: stderr holds the summary line, not libmpg123's."""
    model = str(make_checkpoint(tmp_path / "m.pt", spec=SPEC))
    code = "import sys\nfrom specstore.serving.cli import main\nsys.exit(main(sys.argv[1:]))\n"
    done = subprocess.run([sys.executable, "-c", code, "classify", "--jobs", "2", "--model", model,
                           *map(str, noisy)], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0 and len(done.stdout.splitlines()) == 3, done.stdout + done.stderr
    assert _raw_lines(done.stderr) == [] and "-v shows them" in done.stderr, done.stderr
    assert len(_summaries(done.stderr)) == 1 and _summaries(done.stderr)[0] >= 2, done.stderr


def test_classify_in_process_keeps_the_lines_and_counts_them_and_verbose_logs_the_workers(
        tmp_path: Path, noisy: list[Path], capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture,
) -> None:
    model = str(make_checkpoint(tmp_path / "m.pt", spec=SPEC))
    files = [str(p) for p in noisy]
    with caplog.at_level(logging.WARNING, logger="specstore.decoder"):
        assert specstore_main(["classify", "--jobs", "1", "--model", model, *files]) == 0
    n = len(_raw_lines(capfd.readouterr().err))  # in-process: the decoder's own lines stay on stderr ...
    assert n >= 2 and _summaries(caplog.text) == [n] and "printed above" in caplog.text, caplog.text  # ... counted
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="specstore.decoder"):  # what -v turns on
        assert specstore_main(["classify", "--jobs", "2", "-v", "--model", model, *files]) == 0
    assert _raw_lines(capfd.readouterr().err) == []
    logged = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert len(logged) == n and all(m.startswith(RAW) for m in logged), caplog.text
    assert _summaries(caplog.text) == [n] and "logged above" in caplog.text, caplog.text


def test_features_report_counts_the_decoders_lines_from_workers_and_in_process(
        tmp_path: Path, noisy: list[Path], capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture,
) -> None:
    corpus = tmp_path / "corpus"
    (corpus / "rock").mkdir(parents=True)
    for p in noisy:
        p.rename(corpus / "rock" / p.name)
    specs = {"mel": SPEC}
    with caplog.at_level(logging.INFO, logger="specstore.decoder"):
        workers = extract(corpus, str(tmp_path / "w.zarr"), specs=specs, jobs=2, progress=False)
    err = capfd.readouterr().err
    assert workers.indexed == 2 and workers.jobs == 2 and not workers.errors
    assert _raw_lines(err) == [], err  # the loky workers' lines came back with their tasks ...
    n = workers.decoder.total
    assert n >= 2 and workers.decoder.counts == {"libmpg123": n} and workers.decoder.shown == 0
    logged = [r.getMessage() for r in caplog.records if r.name == "specstore.decoder"]
    assert len(logged) == n and all(m.startswith(RAW) for m in logged)  # ... to be logged by the driver
    assert f"decoder      {n} decoder warnings (libmpg123) during this run" in workers.report()

    inline = extract(corpus, str(tmp_path / "i.zarr"), specs=specs, jobs=1, progress=False)
    err = capfd.readouterr().err
    assert len(_raw_lines(err)) == n and inline.decoder.total == n and inline.decoder.shown == n, err
    assert "printed above" in inline.report()


def test_the_server_counts_its_workers_decoder_lines_in_metrics_and_at_shutdown(
        tmp_path: Path, noisy: list[Path], caplog: pytest.LogCaptureFixture,
        capfd: pytest.CaptureFixture[str]) -> None:
    from starlette.testclient import TestClient

    from specstore.infer.engine.runtime import RunOptions
    from specstore.serving.app import Service, create_app
    from specstore.serving.config import ServeConfig
    from specstore.serving.model import Classifier

    service = Service(Classifier(make_checkpoint(tmp_path / "m.pt", spec=SPEC), RunOptions(device="cpu",
                                                                                           progress=False)),
                      ServeConfig(workers=1))
    with caplog.at_level(logging.WARNING, logger="specstore.decoder"):
        with TestClient(create_app(service), base_url="http://localhost") as client:
            answer = client.post("/classify", files=[("file", (p.name, p.read_bytes(), "audio/mpeg")) for p in noisy])
            assert answer.status_code == 200 and all("top" in f for f in answer.json()["files"]), answer.text
            deadline = time.monotonic() + 10
            while service.metrics.decoder_warnings.get() < 2 and time.monotonic() < deadline:
                time.sleep(0.05)  # the lines reach the listener on their own pipe, just after the answers
            n = int(service.metrics.decoder_warnings.get())
            assert n >= 2 and f"specstore_decoder_warnings_total {n}\n" in client.get("/metrics").text
    assert _raw_lines(capfd.readouterr().err) == []
    assert [r.getMessage().split(";")[0] for r in caplog.records if r.name == "specstore.decoder"] == [
        f"{n} decoder warnings (libmpg123) since the server started"]

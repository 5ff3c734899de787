"""Output paths: a FIFO or standard output is written straight through, never replaced; a link's target is
written and the link kept; other special files are refused in one line (``specstore.common.atomic``).

No test writes to a real device: standard output is always a pipe or a file of the test's own, in a child
process, and a child names it ``/dev/stdout`` only once the code under test is seen to write it through.
"""

from __future__ import annotations

import csv
import io
import os
import socket
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from specstore.common import OutputPathError, atomic_path, check_output_path, write_atomic

ROOT = Path(__file__).resolve().parents[2]
PAYLOAD = bytes(range(256)) * 1024
"""256 KiB: more than a pipe holds, so the writer and the reader must run together."""


class FifoReader:
    """A FIFO and a thread reading it until every writer has closed it.

    It holds a writer of its own until :meth:`received`, so that a FIFO replaced by a file gives the reader an
    end with nothing instead of a wait for ever.
    """

    def __init__(self, path: Path) -> None:
        os.mkfifo(path)
        self.path = path
        reader = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO's open for reading waits for a writer
        self._holder = os.open(path, os.O_WRONLY)
        os.set_blocking(reader, True)
        self._got: list[bytes] = []
        self._thread = threading.Thread(target=self._read, args=(reader,), daemon=True)
        self._thread.start()

    def _read(self, fd: int) -> None:
        with open(fd, "rb") as f:
            self._got.append(f.read())

    def received(self) -> bytes:
        """Everything written into the FIFO, once its writers have closed it."""
        if self._holder >= 0:
            os.close(self._holder)
            self._holder = -1
        self._thread.join(10)
        assert not self._thread.is_alive(), "the FIFO's reader never saw an end"
        return self._got[0]


@pytest.fixture()
def fifo(tmp_path: Path) -> Iterator[FifoReader]:
    reader = FifoReader(tmp_path / "out.fifo")
    yield reader
    reader.received()


def _temporaries(*folders: Path) -> list[str]:
    return [p.name for folder in folders for p in folder.iterdir() if p.name.endswith(".tmp")]


def test_a_fifo_is_written_through_and_stays_a_fifo(fifo: FifoReader) -> None:
    assert check_output_path(fifo.path) == fifo.path  # checked before work: a FIFO is a fine output
    write_atomic(fifo.path, PAYLOAD)
    assert stat.S_ISFIFO(os.lstat(fifo.path).st_mode), "the FIFO was replaced"
    assert fifo.received() == PAYLOAD
    assert not _temporaries(fifo.path.parent)


def test_a_library_writing_a_path_reaches_a_fifo_whole(fifo: FifoReader) -> None:
    """``atomic_path`` gives a real file (this writer seeks back, as zip and PNG writers do); its whole content
    then goes into the FIFO."""
    with atomic_path(fifo.path) as tmp, open(tmp, "wb") as f:
        f.write(PAYLOAD)
        f.seek(0)
        f.write(b"HEAD")
    assert stat.S_ISFIFO(os.lstat(fifo.path).st_mode), "the FIFO was replaced"
    assert fifo.received() == b"HEAD" + PAYLOAD[4:]


@pytest.mark.parametrize("how", ["write_atomic", "atomic_path"])
def test_a_link_to_a_file_keeps_the_link_and_replaces_its_target(tmp_path: Path, how: str) -> None:
    """The temporary file lies beside the target (another folder), and the target is replaced whole."""
    (tmp_path / "data").mkdir()
    (tmp_path / "links").mkdir()
    target, link = tmp_path / "data" / "p.csv", tmp_path / "links" / "p.csv"
    target.write_text("old\n")
    link.symlink_to(target)
    before = os.stat(target).st_ino
    if how == "write_atomic":
        write_atomic(link, "new\n")
    else:
        with atomic_path(link) as tmp:
            assert tmp.parent == target.parent
            tmp.write_text("new\n")
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_text() == "new\n" and os.stat(target).st_ino != before  # replaced, not written in place
    assert not _temporaries(target.parent, link.parent)


def test_a_dangling_link_creates_its_target(tmp_path: Path) -> None:
    link = tmp_path / "out.csv"
    link.symlink_to(tmp_path / "made" / "later.csv")
    write_atomic(link, "made\n")
    assert link.is_symlink() and (tmp_path / "made" / "later.csv").read_text() == "made\n"


@pytest.fixture()
def unix_socket(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "s.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(str(path))
        yield path


def test_a_socket_is_refused_in_one_line_and_left_as_it_is(unix_socket: Path) -> None:
    with pytest.raises(OutputPathError, match="is a socket") as err:
        check_output_path(unix_socket, what="predictions")
    assert len(str(err.value).splitlines()) == 1
    with pytest.raises(OutputPathError, match="is a socket"):
        write_atomic(unix_socket, "x\n")
    assert stat.S_ISSOCK(os.lstat(unix_socket).st_mode)


WRITER = """
import sys
from specstore.common import atomic_path, write_atomic
write_atomic(sys.argv[1], "first\\n")
with atomic_path(sys.argv[1]) as tmp, open(tmp, "wb") as f:
    f.write(b"xxxxxx\\n"); f.seek(0); f.write(b"second")
"""
"""A child that writes its first argument twice: through ``write_atomic``, then ``atomic_path`` (a seeking writer)."""


def _child(argv: list[str], stdout: int | io.BufferedWriter) -> subprocess.CompletedProcess[bytes]:
    """``python argv...`` on this checkout, its standard output going to ``stdout``."""
    return subprocess.run([sys.executable, *argv], cwd=ROOT, stdout=stdout, stderr=subprocess.PIPE,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300, check=False)


def _stdout_is_written_through() -> None:
    """Name ``/dev/stdout`` itself only where the code under test writes it through: code that renames a file over
    its output would replace the system's ``/dev/stdout`` when run as root."""
    from specstore.common.atomic import output_target

    assert output_target("/dev/stdout").fd == 1


@pytest.fixture(params=["/dev/stdout", "/dev/fd/1", "link"])
def stdout_name(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Names of the child's standard output: ``/dev/stdout``, ``/dev/fd/1``, and a link of the test's own to
    ``/dev/stdout``."""
    if request.param == "link":
        (tmp_path / "to-stdout").symlink_to("/dev/stdout")
        return str(tmp_path / "to-stdout")
    if request.param == "/dev/stdout":
        _stdout_is_written_through()
    return str(request.param)


def test_standard_output_as_a_pipe_is_written_through(stdout_name: str) -> None:
    done = _child(["-c", WRITER, stdout_name], subprocess.PIPE)
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout == b"first\nsecond\n"


@pytest.mark.parametrize("mode", ["wb", "ab"])
def test_standard_output_as_a_file_is_written_at_its_offset(stdout_name: str, tmp_path: Path, mode: str) -> None:
    """``> f`` leaves the output in ``f``, ``>> f`` appends it, and ``f`` stays the file the shell opened."""
    out = tmp_path / "out.txt"
    out.write_bytes(b"kept\n")
    before = os.stat(out).st_ino
    with open(out, mode) as f:  # the shell's `>` (truncating) and `>>` (appending)
        done = _child(["-c", WRITER, stdout_name], f)
    assert done.returncode == 0, done.stderr.decode()
    assert out.read_bytes() == (b"kept\n" if mode == "ab" else b"") + b"first\nsecond\n"
    assert os.stat(out).st_ino == before
    if stdout_name.endswith("to-stdout"):
        assert Path(stdout_name).is_symlink()


def _predict_to_stdout(store: Path, model: Path, stdout: int | io.BufferedWriter) -> subprocess.CompletedProcess[bytes]:
    _stdout_is_written_through()
    return _child(["-m", "specstore", "infer", str(store), str(model), "--out", "/dev/stdout", "--device", "cpu",
                   "--no-progress"], stdout)


@pytest.mark.slow  # two fresh interpreters with torch: a few seconds
def test_predict_out_dev_stdout_to_a_pipe_and_to_a_file(small_store: Path, checkpoint: Path, tmp_path: Path) -> None:
    """``--out /dev/stdout`` passes the check before work, and standard output holds the CSV alone: the summary
    goes to standard error."""
    piped = _predict_to_stdout(small_store, checkpoint, subprocess.PIPE)
    assert piped.returncode == 0, piped.stderr.decode()
    rows = list(csv.reader(io.StringIO(piped.stdout.decode())))
    assert rows[0] == ["path", "pred", "prob", "topk", "truth", "calibration"] and len(rows) == 1 + 12
    assert b"predictions: /dev/stdout" in piped.stderr
    out = tmp_path / "p.csv"
    out.write_bytes(b"x" * 100_000)
    with open(out, "wb") as f:
        written = _predict_to_stdout(small_store, checkpoint, f)
    assert written.returncode == 0, written.stderr.decode()
    assert out.read_bytes() == piped.stdout


def test_a_model_path_must_be_a_regular_file(fifo: FifoReader, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """A checkpoint is read back and has files beside it: a FIFO or standard output is refused before work."""
    from specstore.infer.cli import main as infer_main

    for name in (fifo.path, tmp_path / "link-to-fifo"):
        if name != fifo.path:
            name.symlink_to(fifo.path)
        with pytest.raises(OutputPathError, match="not a regular file"):
            check_output_path(name, what="MODEL", stream=False)
    assert check_output_path(tmp_path / "new.pt", what="MODEL", stream=False) == tmp_path / "new.pt"
    assert infer_main(["train", str(tmp_path / "no.zarr"), str(fifo.path), "--no-progress"]) == 2
    assert "MODEL path" in capsys.readouterr().err  # refused before the missing store is noticed


def test_export_refuses_a_fifo_in_one_line_before_torch(fifo: FifoReader, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """An export is read back to check it and gets a sidecar beside it."""
    from specstore.serving.cli import main as serve_main

    model = tmp_path / "m.pt"
    model.write_bytes(b"not read")
    assert serve_main(["export", str(model), "--out", str(fifo.path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("specstore: error: export path") and "not a regular file (FIFO)" in err, err
    assert not (tmp_path / "out.fifo.json").exists()


def test_a_stores_own_files_are_never_written_through_a_fifo(tmp_path: Path) -> None:
    """A FIFO put among a store's files is refused in one line, not waited on (the writer would block)."""
    fifo = tmp_path / "zarr.json"
    os.mkfifo(fifo)
    with pytest.raises(OutputPathError, match="not a regular file"):
        write_atomic(fifo, b"{}", stream=False)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


# -- a folder that cannot be made ------------------------------------------------------------------------

UNMAKEABLE = Path("/proc/specstore-no-such-folder")
"""A folder no process can create (``/proc`` takes no new entries, even from root)."""
needs_proc = pytest.mark.skipif(not Path("/proc/self").exists(), reason="needs Linux's /proc")


@needs_proc
def test_missing_folders_are_proved_makeable_and_left_unmade_or_refused_in_one_line(tmp_path: Path) -> None:
    out = tmp_path / "a" / "b" / "p.csv"
    assert check_output_path(out) == out and not (tmp_path / "a").exists()  # made and removed again
    with pytest.raises(OutputPathError) as err:
        check_output_path(UNMAKEABLE / "deeper" / "p.csv", what="predictions")
    assert str(err.value) == (f"predictions path {UNMAKEABLE}/deeper/p.csv: cannot create the folder {UNMAKEABLE}: "
                              "No such file or directory")
    with pytest.raises(OutputPathError, match="cannot create the folder"):  # and when written without a check
        write_atomic(UNMAKEABLE / "x.txt", "x")
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "keep").touch()
    assert check_output_path(out) == out and (tmp_path / "a" / "keep").exists() and not (tmp_path / "a" / "b").exists()


@needs_proc
@pytest.mark.parametrize("argv", [
    ["infer", "{store}", "{model}", "--out", "{bad}/p.csv"],
    ["eval", "{store}", "{model}", "--out-dir", "{bad}"],
    ["eval", "{store}", "{model}", "--out-dir", "{bad}", "--backend", "dask"],
    ["train", "{store}", "{bad}/m.pt", "--epochs", "1"],
    ["cv", "{store}", "--out-dir", "{bad}", "--folds", "2"],
    ["export", "{model}", "--out", "{bad}/m.onnx"],
], ids=["infer", "eval", "eval-on-a-cluster", "train", "cv", "export"])
def test_commands_refuse_an_output_folder_they_cannot_make_in_one_line_before_work(
        argv: list[str], small_store: Path, checkpoint: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from specstore.cli import main

    words = [a.format(store=small_store, model=checkpoint, bad=UNMAKEABLE) for a in argv]
    assert main(words) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"cannot create the folder {UNMAKEABLE}" in err[0] and err[0].startswith("specstore: ")
    assert not UNMAKEABLE.exists()


@needs_proc
def test_features_refuses_a_store_folder_it_cannot_make_in_one_line(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    from factories import make_corpus

    from specstore.cli import main

    corpus = tmp_path / "corpus"
    make_corpus(corpus, n=2)
    assert main(["features", str(corpus), str(UNMAKEABLE / "s.zarr"), "--features", "mel"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"specstore: error: cannot create the store folder {UNMAKEABLE}/s.zarr: No such file or directory"]

"""`specstore serve` as a user starts it: the port answers at once, `/health` says `starting` until the
model is loaded, then one line says where it is; an access-log line per request (`--quiet` silences it); a busy
port is one `specstore:` line before the model loads.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from factories import make_checkpoint

from specstore.pipeline.testing import write_music_like


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def serving(model: Path, *options: str) -> Iterator[tuple[subprocess.Popen[str], int, list[int]]]:
    """``python -m specstore serve`` on a free port; yields the process, the port and the /health statuses seen
    while it started (polled every 50 ms from the moment the port answered)."""
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "specstore", "serve", "--model", str(model), "--port", str(port),
                             "--workers", "1", *options], stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    seen: list[int] = []
    try:
        deadline = time.monotonic() + 180
        while not seen or seen[-1] != 200:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, "the server did not become ready"
            with contextlib.suppress(httpx.TransportError):
                seen.append(httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code)
            time.sleep(0.05)
        yield proc, port, seen
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(30)
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("serve") / "genre.pt")


@pytest.mark.slow  # starts the real command twice: about 20 s
def test_the_server_answers_while_it_loads_then_says_where_it_is(model: Path, tmp_path: Path) -> None:
    audio = write_music_like(tmp_path / "a.wav", 2.0, seed=3).read_bytes()
    with serving(model) as (proc, port, seen):
        assert 503 in seen, seen  # the port answered before the model was loaded
        r = httpx.post(f"http://127.0.0.1:{port}/classify", files={"file": ("a.wav", audio)}, timeout=60)
        assert r.status_code == 200
        proc.terminate()
        err = proc.communicate(timeout=60)[1]
    lines = err.splitlines()
    listening = next(i for i, x in enumerate(lines) if x.startswith("specstore: listening on http://127.0.0.1:"))
    ready = next(i for i, x in enumerate(lines) if x.startswith("specstore: serving genre.pt ("))
    assert listening < ready
    assert f"on http://127.0.0.1:{port}/" in lines[ready] and "limits:" in lines[ready]
    assert any('"GET /health" 503' in x for x in lines[listening:ready])
    assert any('"POST /classify" 200 1 file' in x for x in lines[ready:])
    assert not any("Traceback" in x for x in lines)


@pytest.mark.slow
def test_quiet_has_no_access_log(model: Path) -> None:
    with serving(model, "--quiet") as (proc, port, _):
        httpx.get(f"http://127.0.0.1:{port}/health", timeout=5)
        proc.terminate()
        err = proc.communicate(timeout=60)[1]
    assert "specstore: serving genre.pt" in err and '"GET /health"' not in err


def test_a_busy_port_is_one_line_before_the_model_loads(model: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        t0 = time.monotonic()
        proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "specstore", "serve", "--model", str(model),
                               "--port", str(port)], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2
    lines = [x for x in proc.stderr.splitlines() if not x.startswith("import time:")]
    assert lines == [f"specstore: error: cannot listen on 127.0.0.1:{port}: another server is listening there; "
                     "stop it or choose another --port"]
    imported = {x.split("|")[-1].strip() for x in proc.stderr.splitlines() if x.startswith("import time:")}
    assert "torch" not in imported  # refused before the model (and torch) were loaded
    assert time.monotonic() - t0 < 60


def test_a_missing_checkpoint_is_one_line_at_once(tmp_path: Path) -> None:
    for command in (["serve"], ["classify", str(tmp_path)]):
        proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "specstore", *command, "--model",
                               str(tmp_path / "none.pt")], capture_output=True, text=True, timeout=120, check=False)
        lines = [x for x in proc.stderr.splitlines() if not x.startswith("import time:")]
        assert proc.returncode == 2 and lines == [f"specstore: error: no checkpoint at {tmp_path / 'none.pt'} "
                                                  "(train one with `make train`, or name a shipped model: "
                                                  "musicnn-msd, musicnn-mtt)"]
        assert "torch" not in {x.split("|")[-1].strip() for x in proc.stderr.splitlines()
                               if x.startswith("import time:")}


def test_every_option_is_checked_before_the_port_opens(model: Path) -> None:
    """A bad server, batching, planner or run option, or a missing model, is one line before anything listens
    (the port stays free) and before torch is imported."""
    port = _free_port()
    for bad in (["--batch-overhead-frames", "nan"], ["--batch-overhead-frames", "-1"], ["--max-batch", "0"],
                ["--max-file-mb", "0"], ["--max-delay-ms", "nan"], ["--max-client-connections", "600"]):
        proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "specstore", "serve", "--model", str(model),
                               "--port", str(port), *bad], capture_output=True, text=True, timeout=120, check=False)
        lines = [x for x in proc.stderr.splitlines() if not x.startswith("import time:")]
        assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("specstore"), (bad, proc.stderr)
        assert bad[0].lstrip("-").replace("-", "_") in lines[0] or bad[0] in lines[0], lines
        imported = {x.split("|")[-1].strip() for x in proc.stderr.splitlines() if x.startswith("import time:")}
        assert "torch" not in imported and "uvicorn" not in imported, bad  # refused before the server module


@pytest.mark.slow  # starts the real command: about 10 s
def test_ctrl_c_is_one_line(model: Path) -> None:
    """Ctrl-C reaches the whole process group, decode workers included: the server stops with one line, and no
    worker prints a KeyboardInterrupt traceback of its own."""
    import signal

    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "specstore", "serve", "--model", str(model), "--port", str(port),
                             "--workers", "2", "--quiet"], stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        deadline = time.monotonic() + 180
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, "the server did not become ready"
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200:
                    break
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
        err = proc.communicate(timeout=60)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    lines = err.splitlines()
    ready = next(i for i, x in enumerate(lines) if x.startswith("specstore: serving genre.pt"))
    assert proc.returncode == 130 and lines[ready + 1:] == ["specstore: interrupted"], err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err

"""One writer at a time: a second writer is refused at once, naming the holder; a dead holder blocks nothing.

Local stores use a kernel lock (flock), which a killed process loses; fsspec
stores (``memory://`` here) a lease that expires and is taken over from a
dead process on this host.  Orphan cleanup belongs to the lock holder, so a
refused writer never touches the holder's uncommitted shards.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
from factories import make_corpus

from specstore.pipeline.cli import main as features_main
from specstore.store import (
    FeatureSpec,
    IndexRow,
    ShardWriter,
    StoreLocked,
    StoreWriter,
    create_store,
    open_store,
    validate,
)

ROOT = Path(__file__).resolve().parents[2]
SPECS = {"mel": FeatureSpec.mel()}  # what `--features mel` makes

HOLDER = """
import sys, time
from specstore.store import StoreWriter
w = StoreWriter.open(sys.argv[1])
print("locked", flush=True)
time.sleep(120)
"""


def _holder(store: Path) -> subprocess.Popen[str]:
    """A separate process that takes the store's writer lock and keeps it."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(store)], cwd=ROOT, text=True,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "locked", (
        proc.stderr.read() if proc.stderr else ""
    )
    return proc


def _one_shard(store: Path | str, n: int = 7) -> object:
    with ShardWriter(store) as sw:
        sw.append("mel", np.random.default_rng(n).normal(size=(n, SPECS["mel"].n_bins)))
        sw.end_clip(f"h{n}", 0.1)
        return sw.close()


def test_second_writer_in_this_process_is_refused_then_admitted(tmp_path: Path) -> None:
    w = create_store(tmp_path / "s.zarr", SPECS)
    with pytest.raises(
        StoreLocked,
        match=rf"locked by another writer: pid {os.getpid()} on host "
        rf"{socket.gethostname()} since \d{{4}}-",
    ):
        StoreWriter.open(tmp_path / "s.zarr")
    with pytest.raises(StoreLocked):
        create_store(tmp_path / "s.zarr", SPECS)
    w.close()
    with StoreWriter.open(tmp_path / "s.zarr") as again:
        assert again.commit_state.generation == 0


def test_run_refused_while_another_process_writes_and_its_shards_survive(tmp_path: Path, capsys) -> None:
    """Order 1: another process holds the store; this run is refused and deletes nothing of its work."""
    make_corpus(tmp_path / "c", n=2, seconds=0.5)
    create_store(tmp_path / "s.zarr", SPECS).close()
    proc = _holder(tmp_path / "s.zarr")
    try:
        info = _one_shard(tmp_path / "s.zarr")  # the holder's uncommitted work in progress
        args = [str(tmp_path / "c"), str(tmp_path / "s.zarr"), "--features", "mel", "--no-progress"]
        t0 = time.monotonic()
        assert features_main(args) == 2
        assert time.monotonic() - t0 < 10  # refused at once, not after waiting
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and f"pid {proc.pid} on host {socket.gethostname()}" in err, err
        assert (tmp_path / "s.zarr" / "shards" / info.name / "zarr.json").exists()  # no orphan cleanup
    finally:
        proc.kill()
        proc.wait()
    # the holder died (kill -9): its lock is gone at once, and the next run works
    assert features_main(args) == 0
    assert len(open_store(tmp_path / "s.zarr")) == 2 and validate(str(tmp_path / "s.zarr")) == []


def test_other_process_refused_while_this_one_writes(tmp_path: Path) -> None:
    """Order 2: this process holds the store; a run in another process is refused with one line."""
    make_corpus(tmp_path / "c", n=2, seconds=0.5)
    w = create_store(tmp_path / "s.zarr", SPECS)
    info = _one_shard(tmp_path / "s.zarr")
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "specstore", "features",
            str(tmp_path / "c"),
            str(tmp_path / "s.zarr"),
            "--features",
            "mel",
            "--no-progress",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        timeout=120,
    )
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [res.stderr.strip()] and f"pid {os.getpid()}" in res.stderr
    assert "Traceback" not in res.stderr
    w.commit([info], [IndexRow("mine.wav", "h7")])  # our shard survived the other run
    w.close()
    assert open_store(tmp_path / "s.zarr").paths == ["mine.wav"]


def test_killed_writer_does_not_block(tmp_path: Path) -> None:
    create_store(tmp_path / "s.zarr", SPECS).close()
    proc = _holder(tmp_path / "s.zarr")
    with pytest.raises(StoreLocked, match=f"pid {proc.pid}"):
        StoreWriter.open(tmp_path / "s.zarr")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    t0 = time.monotonic()
    StoreWriter.open(tmp_path / "s.zarr").close()
    assert time.monotonic() - t0 < 2


# -- leases (fsspec stores) ---------------------------------------------------------------------------
@pytest.fixture
def mem_url():
    from fsspec.core import url_to_fs

    url = f"memory://specstore-lock-{uuid.uuid4().hex[:12]}/s.zarr"
    yield url
    fs, path = url_to_fs(url)
    if fs.exists(path.rsplit("/", 1)[0]):
        fs.rm(path.rsplit("/", 1)[0], recursive=True)


def _forge_lease(url: str, **holder: object) -> None:
    import json

    from specstore.store.location import as_location

    doc = {"host": "elsewhere", "pid": 1, "since": time.time(), "token": "other", "expires": time.time() + 60}
    doc.update(holder)
    as_location(url).put(".specstore-lock", json.dumps(doc).encode())


def test_lease_refuses_a_second_writer_and_is_released(mem_url: str) -> None:
    w = create_store(mem_url, SPECS, layout="zstd")
    assert not w.lock.reliable
    with pytest.raises(StoreLocked, match=rf"pid {os.getpid()} on host .* lease runs \d+ s more"):
        StoreWriter.open(mem_url)
    w.close()
    StoreWriter.open(mem_url).close()


def test_lease_of_a_live_other_host_blocks_until_it_expires(mem_url: str) -> None:
    create_store(mem_url, SPECS, layout="zstd").close()
    _forge_lease(mem_url)
    with pytest.raises(StoreLocked, match="pid 1 on host elsewhere"):
        StoreWriter.open(mem_url)
    _forge_lease(mem_url, expires=time.time() - 1)  # it stopped renewing: expired
    StoreWriter.open(mem_url).close()


def test_lease_of_a_dead_process_on_this_host_is_taken_over_at_once(mem_url: str) -> None:
    create_store(mem_url, SPECS, layout="zstd").close()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    _forge_lease(mem_url, host=socket.gethostname(), pid=int(dead.stdout))
    StoreWriter.open(mem_url).close()


def test_a_writer_whose_lease_was_taken_cannot_commit(mem_url: str) -> None:
    w = create_store(mem_url, SPECS, layout="zstd")
    info = _one_shard(mem_url)
    _forge_lease(mem_url)  # another writer took over (e.g. after this one stalled past the lease)
    with pytest.raises(StoreLocked, match="lost its lock"):
        w.commit([info], [IndexRow("a.wav", "h7")])
    assert len(open_store(mem_url)) == 0

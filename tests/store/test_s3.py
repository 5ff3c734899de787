"""Stores on ``s3://`` against a real S3-compatible server on loopback (moto's server mode, :mod:`s3_server`).

What ``memory://`` cannot show (tests/store/test_remote.py): other processes reach the store (extraction
workers, a CLI run killed and rerun, forked DataLoader workers) through the network and the usual AWS
variables, an async filesystem (s3fs on aiohttp) survives ``fork``, and a storage failure says so, not
"corrupt".
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from factories import LABELS, SMALL_SPECS, assert_same_content, make_corpus, make_separable_store, store_content
from s3_server import KEY, SECRET, S3Place, s3_endpoint_fixture, s3_fixture  # noqa: F401 - the fixtures
from torch.utils.data import DataLoader

from specstore.infer.data import StoreDataset
from specstore.infer.engine.predict import predict
from specstore.infer.options.run_options import RunOptions
from specstore.infer.train import TrainConfig, train
from specstore.pipeline.extract import extract
from specstore.store import FeatureSpec, StoreCorrupt, create_store, open_store, validate
from specstore.store.__main__ import main as store_main
from specstore.store.layout import LOCK_NAME
from specstore.store.location import StoreUnavailable, as_location
from specstore.store.metadata import load_metadata

REPO = Path(__file__).resolve().parents[2]
#: A tiny CNN, one epoch: what the loader feeds matters here, not what the model learns.
TINY = dict(epochs=1, width=4, depth=2, crop_seconds=None, val_fraction=0.25, dropout=0.0,
            run=RunOptions(device="cpu", max_batch=8, loader_workers=2))
#: No retries, a short connect: an unreachable endpoint answers in a second, not botocore's ~12 s of backoff.
NO_RETRIES = {"config_kwargs": {"retries": {"max_attempts": 1}, "connect_timeout": 2}}


def _dead_endpoint() -> str:
    """An ``http://`` endpoint on loopback where nothing listens (a port just freed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


# -- extraction ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, tuple[object, ...]]]:
    """A small corpus (8 files, 4 formats) and what an uninterrupted local extraction of it holds."""
    root = tmp_path_factory.mktemp("s3corpus")
    make_corpus(root / "c", n=8, seconds=1.0, step=0.31)
    extract(root / "c", root / "ref.zarr", specs=SMALL_SPECS, jobs=1, progress=False)
    return root / "c", store_content(root / "ref.zarr")


@pytest.mark.slow
def test_extraction_into_s3_reads_back_as_a_local_extraction(
        corpus: tuple[Path, dict[str, tuple[object, ...]]], s3: S3Place) -> None:
    c, expected = corpus
    url = s3.url("x.zarr")
    done = extract(c, url, specs=SMALL_SPECS, layout="zstd", jobs=1, progress=False, storage_options=s3.storage_options)
    assert done.decoded == 8 and not done.errors
    store = open_store(url, s3.storage_options)
    assert store.layout == "zstd" and store.specs == SMALL_SPECS and store.location.local is None
    assert_same_content(store_content(url), expected)  # found through AWS_* alone
    assert validate(url, deep=True) == []
    assert as_location(url).get(LOCK_NAME) is None  # the lease is given back


@pytest.mark.slow
def test_a_killed_extraction_on_s3_is_taken_over_and_resumed_to_the_uninterrupted_content(
        corpus: tuple[Path, dict[str, tuple[object, ...]]], s3: S3Place) -> None:
    c, expected = corpus
    url = s3.url("killed.zarr")
    loc = as_location(url)  # no options: the CLI and this test reach the server through AWS_* alone
    cli = [sys.executable, "-m", "specstore", "features", str(c), url, "--layout", "zstd", "--features", "mel,cqt",
           "--n-mels", "32", "--cqt-bins", "24", "--jobs", "1", "--commit-seconds", "0", "--no-progress"]
    run = subprocess.Popen(cli, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        committed = 0
        deadline = time.monotonic() + 120
        while committed == 0:  # poll the committed metadata until the first shards are in
            assert run.poll() is None, f"the run ended before its first commit: {run.stderr.read()!r}"  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "no commit within 120 s"
            if loc.exists():
                committed = load_metadata(loc).commit.n_clips
            time.sleep(0.02)
        run.send_signal(signal.SIGKILL)
    finally:
        run.kill()
        run.wait()
    assert run.returncode == -signal.SIGKILL
    left = load_metadata(loc).commit.n_clips
    assert 0 < left < 8, f"the run was killed after committing {left} of 8 clips: nothing left to resume"
    assert loc.get(LOCK_NAME) is not None  # the dead writer's lease is still there, unexpired
    again = extract(c, url, specs=SMALL_SPECS, layout="zstd", jobs=1, progress=False)  # takes the lease over
    assert again.decoded == 8 - left and again.unchanged == left and not again.errors
    assert_same_content(store_content(url), expected)
    assert validate(url, deep=True) == [] and loc.get(LOCK_NAME) is None


# -- loader workers: an async filesystem after fork ---------------------------------------------------------
def test_forked_loader_workers_read_a_store_opened_over_s3_in_the_parent(tmp_path: Path, s3: S3Place) -> None:
    make_separable_store(tmp_path / "local.zarr", n=8, lengths=(5, 90))
    make_separable_store(s3.url("s.zarr"), n=8, lengths=(5, 90))
    store = open_store(s3.url("s.zarr"), s3.storage_options)  # its index read made the parent's s3fs session
    assert store.shard_record(0).n_frames == sum(store.lengths)  # in use before the fork; no clip read (cached) yet
    ds = StoreDataset(store)
    loader = DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="fork", timeout=60)
    got = {item.index: item.features for item in loader}
    local = StoreDataset(tmp_path / "local.zarr")
    assert sorted(got) == list(range(8)) and len(local) == 8
    for i, x in got.items():
        np.testing.assert_array_equal(x, local[i].features)


@pytest.mark.slow
def test_training_and_prediction_with_loader_workers_on_s3_match_a_local_store(tmp_path: Path, s3: S3Place) -> None:
    local = make_separable_store(tmp_path / "local.zarr", n=12)
    url = s3.url("train.zarr")
    make_separable_store(url, n=12)
    res = train(url, tmp_path / "m.pt", TrainConfig(**TINY), progress=False)  # type: ignore[arg-type]
    assert len(res.history) == 1 and np.isfinite(res.history[0]["loss"])
    remote = predict(url, res.model_path, device="cpu", loader_workers=2, progress=False)
    here = predict(local, res.model_path, device="cpu", progress=False)
    assert remote.paths == here.paths and remote.label_names == LABELS
    np.testing.assert_allclose(remote.probs, here.probs, rtol=1e-5, atol=1e-6)


# -- a storage failure is named, with its cause, on one line ------------------------------------------------
def test_an_unreachable_endpoint_is_one_line_naming_the_cause_not_corruption(s3: S3Place, capsys,
                                                                             monkeypatch) -> None:
    url = s3.url("x.zarr")
    options = {**s3.storage_options, **NO_RETRIES, "endpoint_url": _dead_endpoint()}
    with pytest.raises(StoreUnavailable) as err:
        open_store(url, options)
    message = str(err.value)
    assert not isinstance(err.value, StoreCorrupt) and "\n" not in message
    assert message.startswith(f"{url}: cannot read zarr.json: EndpointConnectionError: Could not connect")
    # raised in a DataLoader worker, the parent's error keeps the cause as its one line
    from torch._utils import ExceptionWrapper

    try:
        raise err.value
    except StoreUnavailable:
        wrapped = ExceptionWrapper(where="in DataLoader worker process 0")
    with pytest.raises(StoreUnavailable) as again:
        wrapped.reraise()
    assert str(again.value) == message
    # the command line, configured by the environment alone
    monkeypatch.setenv("AWS_ENDPOINT_URL", options["endpoint_url"])
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    assert store_main(["info", url]) != 0
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and f"{url}: cannot read zarr.json" in lines[0] and "corrupt" not in lines[0]


def test_a_server_gone_after_open_fails_a_read_with_its_cause_not_as_a_damaged_shard(tmp_path: Path) -> None:
    server_mod = pytest.importorskip("moto.server")
    s3fs = pytest.importorskip("s3fs")
    server = server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    options = {"endpoint_url": f"http://{host}:{port}", "key": KEY, "secret": SECRET, **NO_RETRIES}
    try:
        s3fs.S3FileSystem(skip_instance_cache=True, **options).mkdir("gone")
        spec = FeatureSpec.mel(n_bins=16)
        with create_store("s3://gone/s.zarr", {"mel": spec}, layout="zstd", storage_options=options) as w:
            w.add_clips([{"path": "a.wav", "hash": "h", "duration": 1.0}], {"mel": [np.zeros((9, 16), np.float32)]})
        store = open_store("s3://gone/s.zarr", options)
        store.feature("mel")._shard_array(0)  # the shard's record and array are open: only its chunk is left to read
    finally:
        server.stop()
    with pytest.raises(StoreUnavailable, match=r"^s3://gone/s\.zarr: cannot read shards/\w+/mel/c/0/0: ") as err:
        store[0]
    assert not isinstance(err.value, StoreCorrupt) and "\n" not in str(err.value)

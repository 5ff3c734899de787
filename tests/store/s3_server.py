"""A real S3-compatible server on loopback for tests: moto's server mode, one per test session, a bucket per test.

Import the fixtures into a test module (``from s3_server import s3_fixture, s3_endpoint_fixture``); pytest
finds them there under their names ``s3`` and ``s3_endpoint``.  ``s3`` yields an :class:`S3Place`: a fresh
bucket and the ``storage_options`` that reach it, with the ``AWS_*`` environment variables set for the test,
so that subprocesses (the CLI, DataLoader workers, dask workers) reach the same server without being told.
Without moto or s3fs (the ``dev`` extra installs both) the tests that use these fixtures are skipped, with
the reason.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

__all__ = ["S3Place", "s3_endpoint_fixture", "s3_fixture"]

#: Any key and secret work against moto; the region must be one botocore knows.
KEY, SECRET, REGION = "specstore-test-key", "specstore-test-secret", "us-east-1"


@dataclass(frozen=True)
class S3Place:
    """A fresh bucket on the loopback server: ``url("x.zarr")`` is ``s3://<bucket>/x.zarr``."""

    endpoint: str
    bucket: str
    storage_options: dict[str, Any] = field(default_factory=dict)

    def url(self, key: str) -> str:
        """The ``s3://`` URL of ``key`` in this bucket."""
        return f"s3://{self.bucket}/{key}"

    def env(self) -> dict[str, str]:
        """The ``AWS_*`` variables that make botocore (s3fs, boto3) in any process reach this server."""
        return {"AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_DEFAULT_REGION": REGION,
                "AWS_ENDPOINT_URL": self.endpoint}


@pytest.fixture(scope="session", name="s3_endpoint")
def s3_endpoint_fixture() -> Iterator[str]:
    """Start moto's S3 server on 127.0.0.1 (a free port) once per session; yield its ``http://`` endpoint."""
    server_mod = pytest.importorskip("moto.server", reason="moto[server] is not installed (pip install -e '.[dev]')")
    pytest.importorskip("s3fs", reason="s3fs is not installed (pip install -e '.[dev]')")
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one log line per request otherwise
    server = server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture(name="s3")
def s3_fixture(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[S3Place]:
    """A new bucket on the session's server, with the ``AWS_*`` environment set for this test; removed after."""
    import s3fs

    place = S3Place(s3_endpoint, f"specstore-{uuid.uuid4().hex[:12]}",
                    {"endpoint_url": s3_endpoint, "key": KEY, "secret": SECRET})
    for name, value in place.env().items():
        monkeypatch.setenv(name, value)
    no_proxy = ",".join(v for v in (os.environ.get("NO_PROXY"), "127.0.0.1") if v)
    monkeypatch.setenv("NO_PROXY", no_proxy)  # loopback never goes through a proxy
    fs = s3fs.S3FileSystem(skip_instance_cache=True, **place.storage_options)
    fs.mkdir(place.bucket)
    yield place
    try:
        fs.rm(place.bucket, recursive=True)
    except OSError:  # a test that removed its bucket itself
        pass
    # fsspec keeps filesystems keyed by their arguments, not the environment: a filesystem made from this test's
    # AWS_* variables must not serve the next test
    s3fs.S3FileSystem.clear_instance_cache()

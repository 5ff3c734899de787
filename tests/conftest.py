"""Shared test set-up: markers, the CUDA skip, and fixtures over :mod:`factories`.

Markers (``pytest -n 2 -m "not slow"`` is ``make test-fast``):

* ``slow``: a test that takes seconds to minutes (notebook runs, kill -9,
  dask/ray clusters, the benchmark smoke run, long librosa references);
* ``gpu``: needs CUDA; skipped with a reason where there is none
  (``make gpu-check`` runs them on a GPU machine).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from factories import LABELS, make_checkpoint, make_corpus, make_store


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip ``gpu`` tests without CUDA (the reason says so, never silently)."""
    if not any(item.get_closest_marker("gpu") for item in items):
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run `make gpu-check` on one)")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)


@pytest.fixture()
def corpus(tmp_path: Path) -> Path:
    """A small labelled audio corpus (8 files, mixed formats) in a fresh folder."""
    make_corpus(tmp_path / "corpus")
    return tmp_path / "corpus"


@pytest.fixture()
def small_store(tmp_path: Path) -> Path:
    """A 12-clip labelled store of random 16-bin log-mel values."""
    return make_store(tmp_path / "small.zarr")


@pytest.fixture()
def checkpoint(tmp_path: Path) -> Path:
    """An untrained small checkpoint for :func:`small_store`'s feature and :data:`factories.LABELS`."""
    return make_checkpoint(tmp_path / "model.pt", labels=LABELS)

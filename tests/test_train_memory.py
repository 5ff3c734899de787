"""Training on CPU keeps freed memory in the heap for its steps (:func:`infer.train.prepare.keep_freed_memory`),
and hands that setting back when it ends, so the caller's process does not keep growing its heap afterwards."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from factories import make_separable_store

from infer.train import TrainConfig, train


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc settings")
def test_after_training_a_freed_block_goes_back_to_the_system(tmp_path: Path) -> None:
    store = make_separable_store(tmp_path / "s.zarr", n=12, lengths=(20, 40))
    train(store, tmp_path / "m.pt", TrainConfig(device="cpu", epochs=1, width=4, depth=2), progress=False)
    before = _rss_bytes()
    block = np.ones(64 * 2**20 // 8)  # 64 MiB, touched
    assert _rss_bytes() - before > 48 * 2**20
    del block
    assert _rss_bytes() - before < 16 * 2**20, "the freed 64 MiB stayed in the heap: training's setting outlived it"

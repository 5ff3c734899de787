"""`make bench ONLY=model`: every corpus of the grid trains afresh, so its training time is measured.

`infer.train` resumes a finished run with the same configuration (it does
nothing and returns at once); a grid rerun in the same work folder would then
report a training time of zero.  :func:`benchmarks.bench_model.fresh_model_path`
removes the earlier run first.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from factories import make_separable_store

from benchmarks.bench_model import fresh_model_path
from infer.train import TrainConfig, resume_path_for, train

TINY = dict(epochs=1, width=4, depth=2, max_batch=8, crop_seconds=None, val_fraction=0.25, device="cpu")


@pytest.mark.slow
def test_a_rerun_trains_again_instead_of_resuming_the_finished_run(tmp_path: Path) -> None:
    store = make_separable_store(tmp_path / "s.zarr", n=24)
    model = tmp_path / "m.pt"
    assert train(store, model, TrainConfig(**TINY), progress=False, overwrite=True).epochs_run == 1
    assert resume_path_for(model).is_file()
    # Without it, the same call resumes the finished run and trains nothing: the bench would time 0 s.
    assert train(store, model, TrainConfig(**TINY), progress=False, overwrite=True).epochs_run == 0
    path = fresh_model_path(model)
    assert path == model and not model.exists() and not resume_path_for(model).exists()
    again = train(store, path, TrainConfig(**TINY), progress=False, overwrite=True)
    assert again.epochs_run == 1 and again.resumed_from == 0
    assert fresh_model_path(tmp_path / "none.pt") == tmp_path / "none.pt"  # nothing there: nothing to remove

"""Transfer (:mod:`specstore.infer.train.transfer`): a head on a shipped backbone's cached clip embeddings, with the
tiny stand-in backbone of ``tests/shipped_stub.py`` (a width-4 CNN) in place of musicnn."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import shipped_stub
from factories import make_separable_store, make_store

from specstore.infer.engine.predict import predict
from specstore.infer.models.checkpoint import CheckpointError, load_checkpoint
from specstore.infer.options.run_options import RunOptions
from specstore.infer.train.config import TrainConfig
from specstore.infer.train.transfer import embeddings_path_for, train_transfer
from specstore.store import FeatureSpec, open_store

NAME = shipped_stub.NAME
CPU_RUN = RunOptions(device="cpu")
stand_in = shipped_stub.stand_in  # the module's autouse fixture: the stand-in tagger registered




@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, object]:
    root = tmp_path_factory.mktemp("transfer")
    store = make_separable_store(root / "s.zarr", n=30, lengths=(20, 60))
    model = root / "head.pt"
    res = train_transfer(store, model, TrainConfig(backbone=NAME, run=CPU_RUN), progress=False)
    return store, model, res


def test_a_head_trains_on_the_backbones_embeddings_and_runs_as_a_checkpoint(trained: tuple[Path, Path, object],
                                                                            ) -> None:
    store, model, res = trained
    assert res.embedded == 30 and res.n_train == 30 and res.fit["c"] > 0  # type: ignore[attr-defined]
    ckpt = load_checkpoint(model)
    assert ckpt.outputs == "classes" and ckpt.extra["transfer"]["backbone"] == NAME
    pred = predict(store, model, device="cpu")
    s = open_store(store)
    truth = np.array([s.label_names.index(t) for t in pred.truth])
    assert (pred.probs.argmax(1) == truth).mean() >= 0.8, "band energy is what the stand-in's embedding sees"
    np.testing.assert_allclose(pred.probs.sum(1), 1.0, atol=1e-5)
    assert "transfer head on tiny-tags" in res.summary()  # type: ignore[attr-defined]


def test_embeddings_are_cached_by_content_hash_and_reused(trained: tuple[Path, Path, object], tmp_path: Path) -> None:
    store, model, _ = trained
    cache = embeddings_path_for(model)
    with np.load(cache, allow_pickle=False) as z:
        assert sorted(z["hashes"].tolist()) == sorted(set(open_store(store).hashes)) and z["embeddings"].shape[0] == 30
        before = z["embeddings"].copy()
    again = train_transfer(store, model, TrainConfig(backbone=NAME, run=CPU_RUN, seed=1), progress=False,
                           overwrite=True)
    assert again.embedded == 0
    with np.load(cache, allow_pickle=False) as z:
        np.testing.assert_array_equal(z["embeddings"], before)
        key = str(z["key"])
    np.savez(cache, key=np.array(key.replace(NAME, "another")), hashes=np.array(["x"]), embeddings=np.zeros((1, 8)))
    assert train_transfer(store, model, TrainConfig(backbone=NAME, run=CPU_RUN), progress=False,
                          overwrite=True).embedded == 30
    assert not load_checkpoint(model).calibration.calibrated  # no validation clips: nothing to fit a temperature on
    held = tmp_path / "held.pt"  # validation clips (from the cache: no backbone pass): the head gets a temperature
    train_transfer(store, held, TrainConfig(backbone=NAME, run=CPU_RUN, val_fraction=0.3), progress=False,
                   cache_path=cache)
    assert load_checkpoint(held).calibration.temperature is not None


def test_a_store_without_the_backbones_feature_is_refused(tmp_path: Path) -> None:
    other = make_store(tmp_path / "cqt.zarr", lengths=[20, 30, 25, 40], specs={"cqt": FeatureSpec.cqt(n_bins=16)})
    with pytest.raises(CheckpointError, match="make features FEATURES=mel"):
        train_transfer(other, tmp_path / "m.pt", TrainConfig(backbone=NAME, run=CPU_RUN), progress=False)


def test_finetune_trains_the_top_layers_only(trained: tuple[Path, Path, object], tmp_path: Path) -> None:
    store, _, _ = trained
    model = tmp_path / "ft.pt"
    train_transfer(store, model, TrainConfig(backbone=NAME, run=CPU_RUN, finetune=1, epochs=1, crop_seconds=None),
                   progress=False)
    start, _, _ = shipped_stub.load(NAME)
    tuned = load_checkpoint(model).state_dict
    assert not embeddings_path_for(model).exists(), "fine-tuned embeddings change: nothing is cached"
    for name, value in start.state_dict().items():
        if name.startswith("blocks.0."):  # the bottom layer: frozen, BatchNorm statistics included
            assert (tuned[f"backbone.{name}"] == value).all(), name
    assert not (tuned["backbone.blocks.1.conv.weight"] == start.state_dict()["blocks.1.conv.weight"]).all()


def test_cross_validation_of_a_head_shares_one_embedding_cache(trained: tuple[Path, Path, object],
                                                                    tmp_path: Path) -> None:
    from specstore.infer.train.crossval import cross_validate

    store, _, _ = trained
    res = cross_validate(store, tmp_path, TrainConfig(backbone=NAME, run=CPU_RUN), folds=3, progress=False,
                         baselines=False)
    with np.load(tmp_path / "embeddings.npz", allow_pickle=False) as z:
        assert z["embeddings"].shape[0] == 30
    assert res.n_clips == 30 and 0.0 <= res.accuracy <= 1.0 and len(res.fold_accuracy) == 3
    assert all((tmp_path / f"fold-{k}.pt").is_file() for k in range(3))


def test_the_recipe_chooses_from_training_data_and_records_why(tmp_path: Path) -> None:
    from specstore.infer.train.choice import choose_backbone, decide, record_choice

    store = make_separable_store(tmp_path / "s.zarr", n=30, lengths=(20, 60))
    auto = choose_backbone(store, tmp_path / "m.pt", TrainConfig(run=CPU_RUN))
    figures = auto.figures
    assert auto.why is not None and figures["backbone"] == NAME and figures["backbone_clips"] == 30
    verdict = decide(figures["band_statistics_cv_accuracy"], figures["transfer_cv_accuracy"],
                     figures["sum_cv_accuracy"])
    assert auto.backbone == (None if verdict == "scratch" else NAME) and auto.combine == (verdict == "sum")
    assert f"{figures['transfer_cv_accuracy']:.3f}" in auto.why and f"{figures['sum_cv_accuracy']:.3f}" in auto.why
    assert 0.0 <= figures["sum_cv_accuracy"] <= 1.0
    assert auto.feature == "mel", "the backbone's feature alone: the CNN reads it too (no other to read)"
    assert embeddings_path_for(tmp_path / "m.pt").is_file(), "a transfer chosen here reuses the pass"
    assert choose_backbone(store, tmp_path / "m.pt", TrainConfig(backbone="none")).why is None
    other = make_store(tmp_path / "cqt.zarr", lengths=[20, 30], specs={"cqt": FeatureSpec.cqt(n_bins=16)})
    plain = choose_backbone(other, tmp_path / "o.pt", TrainConfig(run=CPU_RUN))
    assert plain.backbone is None and "FEATURES=musicnn" in (plain.why or "")
    from factories import make_checkpoint

    make_checkpoint(tmp_path / "m.pt")
    record_choice(tmp_path / "m.pt", auto)
    assert load_checkpoint(tmp_path / "m.pt").extra["recipe"]["rules"]["backbone"] == auto.why

"""Files written by an earlier version still load and mean the same: checkpoints, their run configs, a TOML config.

The fixtures in ``tests/fixtures/legacy`` were written once by ``make_legacy.py`` with the code of
the time (before the settings moved into one home and the models into registries).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

LEGACY = Path(__file__).resolve().parents[1] / "fixtures" / "legacy"
CHECKPOINTS = ("cnn_recipe", "resnet_attention", "cnn_window")


@pytest.mark.parametrize("name", CHECKPOINTS)
def test_a_legacy_checkpoint_computes_the_same_logits(name: str) -> None:
    import torch

    from specstore.infer.models.checkpoint import load_checkpoint

    expected = np.load(LEGACY / "expected.npz")
    model = load_checkpoint(LEGACY / f"{name}.pt").build().eval()
    batch = torch.from_numpy(expected["x"]).transpose(1, 2).unsqueeze(1)
    with torch.no_grad():
        got = model(batch, torch.from_numpy(expected["lengths"])).numpy()
    np.testing.assert_allclose(got, expected[name], rtol=1e-5, atol=1e-5)


def test_a_legacy_toml_config_reads_as_it_did() -> None:
    from specstore.infer.train import TrainConfig

    config = TrainConfig.from_file(LEGACY / "train.toml")
    flat = config.to_dict()
    flat = {**flat, **flat.pop("model", {}), **flat.pop("run", {})} if "model" in flat else flat
    assert (flat["width"], flat["depth"], flat["pooling"], flat["freq_pooling"], flat["stem_freq_kernel"],
            flat["input_time_pool"], flat["stats_head"], flat["max_batch"], flat["device"], flat["epochs"]) == (
        4, 2, "meanstd", "keep", 5, 2, True, 16, "cpu", 1)


def test_a_legacy_run_config_reads_as_it_did() -> None:
    """``MODEL.config.json`` (what ``--config`` also accepts) gives the config the run was trained with."""
    import json

    from specstore.infer.train import TrainConfig

    recorded = json.loads((LEGACY / "cnn_recipe.config.json").read_text(encoding="utf-8"))["train_config"]
    config = TrainConfig.from_file(LEGACY / "cnn_recipe.config.json")
    again = TrainConfig.from_dict(recorded)
    assert config == again
    assert config.to_dict() == TrainConfig.from_dict(config.to_dict()).to_dict()
    now = config.to_dict()
    assert {k: now[k] for k in recorded} == recorded  # every recorded field comes through with its value
    defaults = TrainConfig().to_dict()
    assert {k: now[k] for k in set(now) - set(recorded)} == {k: defaults[k] for k in set(now) - set(recorded)}
    assert config.model is not None and config.run is not None  # the model and run options it holds
    assert {k: getattr(config.model, k) for k in ("width", "depth", "pooling", "freq_pooling", "stem_freq_kernel",
                                                  "input_time_pool", "stats_head")} == {
        k: recorded[k] for k in ("width", "depth", "pooling", "freq_pooling", "stem_freq_kernel", "input_time_pool",
                                 "stats_head")}
    assert (config.run.device, config.run.max_batch, config.run.budget_mb) == (
        recorded["device"], recorded["max_batch"], recorded["budget_mb"])
    assert {k: v for k, v in config.resume_key().items() if k in recorded} == {
        k: v for k, v in recorded.items() if k not in ("device", "precision", "budget_mb", "loader_workers")}

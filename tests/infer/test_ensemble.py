"""The sum of models (:mod:`specstore.infer.models.ensemble`, :mod:`specstore.infer.train.ensemble`) and the recipe's
three-way choice (:func:`specstore.infer.train.choice.decide`), with the tiny stand-in backbone of
``tests/shipped_stub.py``."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import shipped_stub
import torch
from factories import make_separable_store

from specstore.common import ConfigError
from specstore.infer.data.collate import collate
from specstore.infer.engine.predict import predict
from specstore.infer.engine.windows import run_windowed
from specstore.infer.models import ModelConfig, build_model
from specstore.infer.models.checkpoint import load_checkpoint
from specstore.infer.models.contract import spec_of
from specstore.infer.models.ensemble import SumClassifier
from specstore.infer.options.defaults import PLAIN_MODEL
from specstore.infer.options.run_options import RunOptions
from specstore.infer.train.choice import MARGIN, decide
from specstore.infer.train.config import TrainConfig
from specstore.store import open_store

NAME = shipped_stub.NAME
stand_in = shipped_stub.stand_in  # the module's autouse fixture: the stand-in tagger registered
Summed = tuple[SumClassifier, list[torch.nn.Module]]


def _member(seed: int, n_bins: int, depth: int = 2, **config: object) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = build_model(ModelConfig(**{**PLAIN_MODEL, "width": 4, "depth": depth, "n_bins": n_bins,
                                       "n_classes": 3, **config}))
    for m in model.modules():  # BatchNorm statistics that are not the identity, so eval mode is exercised
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
    return model.eval()


@pytest.fixture(scope="module")
def summed() -> Summed:
    a, b = _member(1, 16), _member(2, 8, depth=3)  # other time strides: other pooled counts per window
    assert a.time_stride != b.time_stride
    members = [{"model": spec_of(a).to_dict(), "rows": [0, 16], "temperature": 1.0},
               {"model": spec_of(b).to_dict(), "rows": [16, 24], "temperature": 2.5}]
    net = SumClassifier(members, n_classes=3, n_bins=24)
    net.load_state_dict({**{f"members.0.{k}": v for k, v in a.state_dict().items()},
                         **{f"members.1.{k}": v for k, v in b.state_dict().items()}})
    return net.eval(), [a, b]


def test_the_sum_averages_its_members_probabilities_after_their_temperatures(summed: Summed) -> None:
    net, (a, b) = summed
    rng = np.random.default_rng(0)
    clips = [rng.normal(-40, 8, size=(24, n)).astype(np.float32) for n in (40, 97, 63)]
    batch = collate(clips)
    with torch.no_grad():
        got = torch.softmax(net(batch.x, batch.lengths), dim=1)
        pa = torch.softmax(a(batch.x[:, :, :16], batch.lengths), dim=1)
        pb = torch.softmax(b(batch.x[:, :, 16:], batch.lengths) / 2.5, dim=1)
        alone = [net(collate([c]).x, collate([c]).lengths)[0] for c in clips]
    torch.testing.assert_close(got, (pa + pb) / 2, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(pa, pb, atol=1e-3), "two members that agree would not test the averaging"
    with torch.no_grad():  # masked like every member: a clip's logits do not depend on its batch
        torch.testing.assert_close(net(batch.x, batch.lengths), torch.stack(alone), rtol=1e-4, atol=1e-5)


def test_a_clip_too_long_for_any_batch_windows_exactly(summed: Summed) -> None:
    net, _ = summed
    assert callable(getattr(net, "pooled_sum", None)) and net.receptive_field >= 1
    clip = np.random.default_rng(1).normal(-40, 8, size=(24, 300)).astype(np.float32)
    with torch.no_grad():
        whole = net(collate([clip]).x, collate([clip]).lengths)[0]
    windowed = run_windowed(net, clip, max_window=128, device="cpu")
    assert whole.shape == windowed.shape
    torch.testing.assert_close(windowed, whole, rtol=1e-4, atol=1e-4)


def test_members_whose_window_alignments_do_not_divide_average_their_windows() -> None:
    from specstore.infer.engine.windows import mean_of_windows

    a, b = _member(1, 16, pool_window=12), _member(2, 8, depth=3)  # windows on 12 frames and on 8: none exact
    net = SumClassifier([{"model": spec_of(a).to_dict(), "rows": [0, 16]},
                         {"model": spec_of(b).to_dict(), "rows": [16, 24]}], n_classes=3, n_bins=24).eval()
    net.load_state_dict({**{f"members.0.{k}": v for k, v in a.state_dict().items()},
                         **{f"members.1.{k}": v for k, v in b.state_dict().items()}})
    assert getattr(net, "pooled_sum", None) is None and net.time_stride == max(a.time_stride, b.time_stride)
    clip = np.random.default_rng(3).normal(-40, 8, size=(24, 300)).astype(np.float32)
    logits = mean_of_windows(net, clip, 128, align=net.time_stride, device="cpu")
    assert logits.shape == (3,) and torch.isfinite(logits).all()


def test_members_are_checked_and_only_builtin_code_builds(summed: Summed) -> None:
    _, (a, _) = summed
    good = {"model": spec_of(a).to_dict(), "rows": [0, 16]}
    with pytest.raises(ConfigError, match="at least two members"):
        SumClassifier([good], n_classes=3, n_bins=16)
    with pytest.raises(ConfigError, match=r"reads rows \[0, 16\) of a 8-row input"):
        SumClassifier([good, good], n_classes=3, n_bins=8)
    with pytest.raises(ConfigError, match="temperature"):
        SumClassifier([good, {**good, "temperature": 0}], n_classes=3, n_bins=16)
    evil = {"model": {"target": "subprocess:Popen", "kwargs": {"args": ["true"]}}, "rows": [0, 16]}
    with pytest.raises(ConfigError, match="subprocess"):  # untrusted import path: refused before its import
        SumClassifier([good, evil], n_classes=3, n_bins=16)


@pytest.mark.parametrize(("scratch", "transfer", "both", "verdict"), [
    (0.80, 0.80, 0.81, "scratch"),  # neither gains more than the margin
    (0.80, 0.85, 0.84, "transfer"),  # the head gains, the sum less
    (0.80, 0.85, 0.85, "sum"),  # a tie goes to the sum (its from-scratch half is only the floor)
    (0.80, 0.75, 0.86, "sum"),  # the sum alone gains
    (0.80, float("nan"), float("nan"), "scratch"),  # too few works to cross-validate
])
def test_the_recipe_rule_between_scratch_transfer_and_their_sum(scratch: float, transfer: float, both: float,
                                                                verdict: str) -> None:
    assert MARGIN == 0.02
    assert decide(scratch, transfer, both) == verdict


@pytest.mark.parametrize("features", ["mel", "cqt+mel"])
def test_train_sum_saves_the_sum_and_its_members(tmp_path: Path, features: str) -> None:
    from factories import SPEC16, make_store

    from specstore.infer.train.ensemble import member_paths, train_sum
    from specstore.store import FeatureSpec

    if features == "mel":  # the backbone's feature is the store's only one: both members read it
        store = make_separable_store(tmp_path / "s.zarr", n=40, lengths=(20, 60))
    else:  # the CNN reads the cqt, the head the mel: the sum stacks cqt then mel
        cqt = FeatureSpec.cqt(n_bins=12, sample_rate=SPEC16.sample_rate, hop_length=SPEC16.hop_length)
        store = make_store(tmp_path / "s.zarr", lengths=[20 + 3 * k for k in range(40)],
                           specs={"cqt": cqt, "mel": SPEC16})
    model = tmp_path / "sum.pt"
    cfg = TrainConfig(run=RunOptions(device="cpu"), epochs=2, width=4, depth=2, val_fraction=0.3, crop_seconds=None)
    res = train_sum(store, model, cfg, NAME, progress=False, rules={"backbone": "test: forced"})
    scratch, head = member_paths(model)
    assert res.members == (scratch, head) and scratch.is_file() and head.is_file()
    ckpt = load_checkpoint(model)
    assert ckpt.feature == features and ckpt.extra["recipe"]["rules"]["backbone"] == "test: forced"
    assert res.n_val > 0 and all(v is not None for v in res.val_accuracy.values())
    assert "probabilities averaged" in res.summary() and str(head) in res.summary()
    # The saved sum = the members' calibrated probabilities averaged (then its own temperature), on every clip.
    s = open_store(store)
    p_scratch = predict(s, scratch, device="cpu").probs
    p_head = predict(s, head, device="cpu").probs
    t_sum = ckpt.calibration.temperature or 1.0
    mixed = np.log((p_scratch + p_head) / 2) / t_sum
    expected = np.exp(mixed - mixed.max(1, keepdims=True))
    expected /= expected.sum(1, keepdims=True)
    got = predict(s, model, device="cpu").probs
    np.testing.assert_allclose(got, expected, atol=2e-5)
    assert not math.isclose(float(np.abs(p_scratch - p_head).max()), 0.0, abs_tol=1e-3)


def test_make_train_trains_the_sum_when_the_rule_chooses_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib
    import json

    from specstore.infer.cli import main as infer_main
    from specstore.infer.train.loop import config_path_for

    store = make_separable_store(tmp_path / "s.zarr", n=30, lengths=(20, 60))
    choice = importlib.import_module("specstore.infer.train.choice")  # (infer.train is also a function's name)
    monkeypatch.setattr(choice, "decide", lambda scratch, transfer, both: "sum")
    model = tmp_path / "m.pt"
    assert infer_main(["train", str(store), str(model), "--epochs", "1", "--width", "4", "--no-progress"]) == 0
    ckpt = load_checkpoint(model)
    assert ckpt.model.target == "specstore.infer.models.ensemble:SumClassifier"
    rule = ckpt.extra["recipe"]["rules"]["backbone"]
    assert rule.startswith(f"{NAME} summed with the CNN") and "sum_cv_accuracy" in ckpt.extra["backbone_choice"]
    assert json.loads(config_path_for(model).read_text())["recipe"]["rules"]["backbone"] == rule


def test_a_saved_sum_exports_and_the_export_equals_it(summed: Summed, tmp_path: Path) -> None:
    from factories import SPEC16

    from specstore.infer.engine.export import export_model
    from specstore.infer.models.checkpoint import Checkpoint, save_checkpoint
    from specstore.store import FeatureSpec

    net, _ = summed
    specs = {"mel": SPEC16, "cqt": FeatureSpec.cqt(n_bins=8, sample_rate=SPEC16.sample_rate,
                                                   hop_length=SPEC16.hop_length)}
    path = tmp_path / "sum.pt"
    save_checkpoint(Checkpoint.from_model(net, ["a", "b", "c"], "mel+cqt", specs, {"trained": True},
                                          model_spec=spec_of(net)), path)
    for fmt in ("torchscript", "onnx"):
        res = export_model(path, tmp_path / f"sum.{fmt}", format=fmt)
        assert res.max_difference is not None and res.max_difference <= 1e-4, fmt

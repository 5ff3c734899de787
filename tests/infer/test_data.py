"""The library for people's own PyTorch code: StoreDataset, BudgetBatchSampler, PadCollate in a DataLoader,
any model through train -> predict -> eval, gradient checkpointing."""

from __future__ import annotations

import copy
import pickle
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from factories import SPEC16, make_separable_store, make_store
from torch.utils.data import DataLoader
from user_models import PoolsOverPadding, TinyUserNet

from specstore.common import ConfigError
from specstore.infer.batching.budget import Budget, CostModel
from specstore.infer.batching.planner import plan_batches
from specstore.infer.cli import main as infer_main
from specstore.infer.data import BudgetBatchSampler, PadCollate, StoreDataset, pad_collate
from specstore.infer.data.augment import SpecAugment
from specstore.infer.engine.cost import measure_cost_per_frame
from specstore.infer.engine.predict import predict
from specstore.infer.evaluation.evaluate import evaluate
from specstore.infer.models import ModelConfig, build_model
from specstore.infer.models.checkpoint import load_checkpoint
from specstore.infer.models.contract import ModelSpec, spec_of
from specstore.infer.models.trust import UntrustedModelError
from specstore.infer.options.defaults import PLAIN_MODEL
from specstore.infer.options.run_options import RunOptions
from specstore.infer.train import TrainConfig, train
from specstore.store import IndexRow, create_store, open_store

COST = CostModel(bytes_per_frame=1000.0, fixed_bytes=0)
CPU_RUN = RunOptions(device="cpu")


def lognormal_lengths(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.maximum(1, np.round(np.exp(rng.normal(np.log(300), 0.8, n)))).astype(np.int64)


# -- the dataset ----------------------------------------------------------------------------------------

def test_dataset_items_crops_and_lengths(tmp_path: Path) -> None:
    store = make_store(tmp_path / "s.zarr", ["rock", None, "jazz", "ambient"], lengths=[50, 80, 10, 200])
    s = open_store(store)
    whole = StoreDataset(store)
    assert len(whole) == 4 and whole.lengths.tolist() == s.lengths.tolist()
    item = whole[3]
    np.testing.assert_array_equal(item.features, np.asarray(s[int(item.row)], dtype=np.float32))
    assert item.features.flags.writeable and item.features.dtype == np.float32
    labelled = StoreDataset(s, labelled_only=True)
    assert len(labelled) == 3 and (labelled.labels >= 0).all()

    cropped = StoreDataset(store, crop_frames=40, seed=7)
    assert cropped.lengths.tolist() == [min(n, 40) for n in s.lengths.tolist()]
    a = cropped[3].features
    again = StoreDataset(store, crop_frames=40, seed=7)[3].features
    np.testing.assert_array_equal(a, again)  # seeded by (seed, epoch, index): the same in any process
    cropped.set_epoch(1)
    b = cropped[3].features
    assert a.shape == b.shape == (16, 40) and not np.array_equal(a, b)  # a new crop every epoch
    full = np.asarray(s[int(cropped[3].row)], dtype=np.float32)
    starts = [k for k in range(full.shape[1] - 39) if np.array_equal(full[:, k:k + 40], b)]
    assert starts, "the crop is a window of the stored clip"
    with pytest.raises(ConfigError, match="crop_seconds or crop_frames"):
        StoreDataset(store, crop_seconds=1.0, crop_frames=10)


def test_dataset_pickles_nothing_open_and_refuses_a_changed_store(tmp_path: Path) -> None:
    store = make_store(tmp_path / "s.zarr", lengths=[30, 40, 50])
    ds = StoreDataset(store)
    blob = pickle.dumps(ds)
    assert len(blob) < 20_000  # the index arrays and the location, no zarr or mmap objects
    clone = pickle.loads(blob)
    np.testing.assert_array_equal(clone[1].features, ds[1].features)
    w = create_store(store, {"mel": SPEC16})
    w.commit(rows=[IndexRow("zz/extra.wav", "h0", None)])  # the store moves on
    stale = pickle.loads(blob)
    with pytest.raises(ConfigError, match="changed since this dataset was made"):
        stale[0]


def test_spec_augment_stays_in_real_frames(tmp_path: Path) -> None:
    store = make_store(tmp_path / "s.zarr", lengths=[60, 25])
    aug = SpecAugment(time_masks=3, time_mask_frames=8, freq_masks=2, freq_mask_bins=4, fill=-999.0)
    ds = StoreDataset(store, spec_augment=aug, seed=1)
    plain = StoreDataset(store)
    for i in range(len(ds)):
        x, ref = ds[i].features, plain[i].features
        changed = x != ref
        assert changed.any() and np.all(x[changed] == -999.0)
    batch = PadCollate(4)([ds[0], ds[1]])
    assert torch.all(batch.x[1, 0, :, 25:] == 0.0)  # the collate's padding is never masked


@pytest.mark.slow
@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_dataloader_workers_fork_and_spawn_give_the_same_batches(context: str, tmp_path: Path) -> None:
    store = make_store(tmp_path / "s.zarr", lengths=lognormal_lengths(40, seed=2).tolist())
    ds = StoreDataset(store, crop_frames=300, spec_augment=SpecAugment(fill=-45.0), seed=3)
    budget = Budget(4_000_000, 1000.0, max_batch=8, frame_align=4)

    def run(workers: int) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        sampler = BudgetBatchSampler(ds, budget, shuffle=True, seed=5)
        sampler.set_epoch(2)
        kw = {"num_workers": workers, "multiprocessing_context": context} if workers else {}
        loader = DataLoader(ds, batch_sampler=sampler, collate_fn=PadCollate(4), **kw)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # e.g. the non-writable NumPy array warning
            return [(b.ids.copy(), b.x.numpy().copy(), b.labels.numpy().copy()) for b in loader]

    alone, workers = run(0), run(2)
    assert len(alone) == len(workers) > 1
    for (i0, x0, y0), (i1, x1, y1) in zip(alone, workers, strict=True):
        np.testing.assert_array_equal(i0, i1)
        np.testing.assert_array_equal(x0, x1)
        np.testing.assert_array_equal(y0, y1)


# -- the sampler ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("shuffle", [False, True])
def test_sampler_batches_fit_the_budget_and_cover_every_clip(shuffle: bool) -> None:
    lengths = lognormal_lengths(600)
    budget = Budget(48_000_000, 1000.0, max_batch=16, frame_align=16)
    sampler = BudgetBatchSampler(lengths, budget, shuffle=shuffle, seed=1)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        batches = list(sampler)
        assert len(batches) == len(sampler)
        assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
        for b in batches:
            assert 1 <= len(b) <= 16 and budget.fits(len(b), budget.align(int(lengths[b].max())))
        real = sum(int(lengths[b].sum()) for b in batches)
        computed = sum(len(b) * int(budget.align(int(lengths[b].max()))) for b in batches)
        if shuffle:
            assert real / computed >= 0.95
        else:
            assert batches == [b.tolist() for b in plan_batches(lengths, budget).batches]
            assert real / computed == pytest.approx(plan_batches(lengths, budget).efficiency)


def test_sampler_epoch_items_trains_a_fresh_subset_of_fixed_size_every_epoch() -> None:
    lengths = np.repeat(lognormal_lengths(100, seed=3), 3)  # three crops of each of 100 clips
    budget = Budget(48_000_000, 1000.0, max_batch=16, frame_align=16)
    sampler = BudgetBatchSampler(lengths, budget, shuffle=True, seed=1, epoch_items=160)
    subsets = []
    for epoch in range(3):
        sampler.set_epoch(epoch)
        items = [i for b in sampler for i in b]
        assert len(items) == len(set(items)) == 160 and 0 <= min(items) and max(items) < len(lengths)
        assert sampler.plan.efficiency >= 0.95 and sum(len(b) for b in sampler.plan.batches) == 160
        for b in sampler:
            assert budget.fits(len(b), budget.align(int(lengths[b].max())))
        subsets.append(frozenset(items))
    assert len(set(subsets)) == 3  # a fresh subset each epoch
    again = BudgetBatchSampler(lengths, budget, shuffle=True, seed=1, epoch_items=160)
    again.set_epoch(2)
    assert frozenset(i for b in again for i in b) == subsets[2]  # seeded by (seed, epoch)
    with pytest.raises(ConfigError, match="epoch_items"):
        BudgetBatchSampler(lengths, budget, epoch_items=10)  # a subset needs shuffle


def test_sampler_from_budget_mb_and_cost_and_too_long_clips() -> None:
    lengths = np.array([100, 200, 5000])
    with pytest.raises(ConfigError, match="too long for one batch"):
        BudgetBatchSampler(lengths, budget_mb=1.0, cost=COST)
    left = BudgetBatchSampler(lengths, budget_mb=1.0, cost=COST, too_long="leave")
    assert left.too_long_indices.tolist() == [2] and sorted(i for b in left for i in b) == [0, 1]
    with pytest.raises(ConfigError, match="budget_mb and the model's cost"):
        BudgetBatchSampler(lengths)
    with pytest.raises(ConfigError, match="finite"):
        BudgetBatchSampler(lengths, budget_mb=float("inf"), cost=COST)


@pytest.mark.parametrize("replicas", [2, 3, 4])
def test_sampler_replicas_are_disjoint_equal_and_complete(replicas: int) -> None:
    lengths = lognormal_lengths(97, seed=4)
    budget = Budget(30_000_000, 1000.0, max_batch=8, frame_align=8)
    for epoch in range(2):
        per_rank = []
        for rank in range(replicas):
            s = BudgetBatchSampler(lengths, budget, shuffle=True, seed=9, num_replicas=replicas, rank=rank)
            s.set_epoch(epoch)
            per_rank.append(list(s))
        assert len({len(b) for b in per_rank}) == 1  # the same number of batches on every rank
        clips = [i for batches in per_rank for b in batches for i in b]
        assert sorted(clips) == list(range(len(lengths)))  # none lost, none duplicated
        for batches in per_rank:
            for b in batches:
                assert budget.fits(len(b), budget.align(int(lengths[b].max())))


def test_mid_epoch_resume_yields_exactly_the_rest_of_the_epoch() -> None:
    lengths = lognormal_lengths(300, seed=6)
    budget = Budget(40_000_000, 1000.0, max_batch=12, frame_align=4)
    straight = BudgetBatchSampler(lengths, budget, shuffle=True, seed=3)
    straight.set_epoch(4)
    expected = list(straight)

    first = BudgetBatchSampler(lengths, budget, shuffle=True, seed=3)
    first.set_epoch(4)
    it = iter(first)
    done = [next(it) for _ in range(5)]
    state = first.state_dict()
    assert state["epoch"] == 4 and state["batches_done"] == 5

    resumed = BudgetBatchSampler(lengths, budget, shuffle=True, seed=3)
    resumed.load_state_dict(state)
    assert len(resumed) == len(expected) - 5
    assert done + list(resumed) == expected
    resumed.set_epoch(5)  # the next epoch is whole again
    assert len(list(resumed)) == len(resumed) and len(resumed) > 0
    with pytest.raises(ConfigError, match="seed"):
        BudgetBatchSampler(lengths, budget, shuffle=True, seed=4).load_state_dict(state)


# -- the collate ----------------------------------------------------------------------------------------

def test_pad_collate_rounds_to_the_stride_and_carries_labels(tmp_path: Path) -> None:
    store = make_store(tmp_path / "s.zarr", ["rock", "jazz", None], lengths=[21, 9, 14])
    ds = StoreDataset(store)
    batch = PadCollate(8)([ds[0], ds[1], ds[2]])
    assert batch.x.shape == (3, 1, 16, 24) and batch.lengths.tolist() == ds.lengths.tolist()
    assert sorted(batch.lengths.tolist()) == [9, 14, 21]
    assert batch.mask.sum(dim=1).tolist() == ds.lengths.tolist()
    assert batch.labels.tolist() == ds.labels.tolist() and batch.ids.tolist() == [0, 1, 2]
    shortest = int(np.argmin(ds.lengths))
    assert pad_collate([ds[shortest]]).x.shape[-1] == 9
    assert PadCollate(8, pad_to=32)([ds[shortest]]).x.shape[-1] == 32


@pytest.mark.gpu
def test_pad_collate_pins_in_a_dataloader(tmp_path: Path) -> None:
    store = make_store(tmp_path / "s.zarr", lengths=[20, 30, 40])
    ds = StoreDataset(store)
    loader = DataLoader(ds, batch_size=2, collate_fn=PadCollate(4), pin_memory=True)
    assert all(b.x.is_pinned() and b.lengths.is_pinned() for b in loader)


# -- any model -------------------------------------------------------------------------------------------

def test_a_user_model_through_train_predict_eval_from_the_cli(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    store = make_separable_store(tmp_path / "s.zarr", n=36)
    model = tmp_path / "user.pt"
    assert infer_main(["train", str(store), str(model), "--arch", "user_models:TinyUserNet", "--model-args",
                       '{"width": 6}', "--epochs", "3", "--lr", "0.05", "--crop-seconds", "0",
                       "--val-fraction", "0.25", "--device", "cpu", "--no-progress"]) == 0
    ck = load_checkpoint(model)
    assert ck.model.target == "user_models:TinyUserNet" and ck.model.kwargs["width"] == 6
    assert ck.model.kwargs["n_bins"] == 16 and ck.model.kwargs["n_classes"] == 3  # filled in from the store
    assert isinstance(ck.build(trust_model_code=True), TinyUserNet)
    # the checkpoint names user code: loading it later needs the flag (--arch trusted the training run only)
    assert infer_main(["predict", str(store), str(model), "--out", str(tmp_path / "p.csv"), "--device", "cpu",
                       "--no-progress"]) == 2
    assert "--trust-model-code" in capsys.readouterr().err
    assert infer_main(["predict", str(store), str(model), "--out", str(tmp_path / "p.csv"), "--device", "cpu",
                       "--no-progress", "--trust-model-code"]) == 0
    assert infer_main(["eval", str(store), str(model), "--out-dir", str(tmp_path / "r"), "--device", "cpu",
                       "--no-progress", "--trust-model-code"]) == 0
    out = capsys.readouterr().out
    assert "split 'val'" in out and "accuracy" in out
    # batched == alone for a masking user model
    s = open_store(store)
    net = ck.build(trust_model_code=["user_models"])
    batched = predict(s, net, device="cpu", progress=False).probs
    for i in (0, 5, 17):
        x = torch.from_numpy(np.asarray(s[i], dtype=np.float32))[None, None]
        alone = torch.softmax(net(x, torch.tensor([x.shape[-1]])), dim=1)[0].detach().numpy()
        np.testing.assert_allclose(batched[i], alone, atol=1e-5)


def test_modules_and_import_paths_are_accepted_and_recorded(tmp_path: Path) -> None:
    store = make_separable_store(tmp_path / "s.zarr", n=24)
    net = TinyUserNet(16, 3, width=4)
    res = train(store, tmp_path / "m.pt", TrainConfig(epochs=1, crop_seconds=None, run=CPU_RUN, val_fraction=0.25),
                model=net, model_args={"n_bins": 16, "n_classes": 3, "width": 4}, progress=False)
    assert res.model_spec == ModelSpec("user_models:TinyUserNet", {"n_bins": 16, "n_classes": 3, "width": 4})
    with pytest.raises(Exception, match="model_args"):  # no way to rebuild it without its arguments
        train(store, tmp_path / "m2.pt", TrainConfig(epochs=1, run=CPU_RUN), model=TinyUserNet(16, 3, width=5),
              progress=False)
    probs = predict(store, "user_models:TinyUserNet", device="cpu", progress=False, model_args={"width": 4}).probs
    assert probs.shape == (24, 3) and np.allclose(probs.sum(axis=1), 1.0, atol=1e-5)
    with pytest.raises(UntrustedModelError, match="--trust-model-code"):
        ModelSpec("os:system", {}).build()  # refused before `os` is even looked at
    with pytest.raises(ConfigError, match="not a torch.nn.Module subclass"):
        ModelSpec("os:system", {}).build(trust_model_code=True)
    with pytest.raises(ConfigError, match="defined inside a function"):
        class Local(torch.nn.Module):
            pass
        spec_of(Local())


def test_a_model_that_pools_over_padding_runs_on_equal_windows(tmp_path: Path) -> None:
    store = make_store(tmp_path / "s.zarr", lengths=[10, 32, 50, 90, 200])
    s = open_store(store)
    torch.manual_seed(0)
    net = PoolsOverPadding(16, 3).eval()
    probs = predict(s, net, device="cpu", progress=False, budget_mb=1).probs
    # each clip alone: its windows of 32 frames (the last one ending at the clip's end), padded alike
    for i in range(len(s)):
        x = np.asarray(s[i], dtype=np.float32)
        n = x.shape[1]
        starts = list(range(0, max(n - 32, 0) + 1, 32))
        if n > 32 and starts[-1] + 32 < n:
            starts.append(n - 32)
        logits = []
        for a in starts:
            w = np.zeros((16, 32), dtype=np.float32)
            part = x[:, a:a + 32]
            w[:, :part.shape[1]] = part
            logits.append(net(torch.from_numpy(w)[None, None], torch.tensor([part.shape[1]]))[0].detach())
        alone = torch.softmax(torch.stack(logits).mean(0), dim=0).numpy()
        np.testing.assert_allclose(probs[i], alone, atol=1e-5)
    res = train(store, tmp_path / "p.pt", TrainConfig(epochs=1, run=CPU_RUN, val_fraction=0.0), model=net,
                model_args={"n_bins": 16, "n_classes": 3}, progress=False)
    assert res.history[0]["batches"] >= 1


# -- gradient checkpointing -----------------------------------------------------------------------------

def test_gradient_checkpointing_same_gradients_less_memory_larger_batches() -> None:
    torch.manual_seed(0)
    model = build_model(ModelConfig(**PLAIN_MODEL,
                                    arch="resnet", n_bins=32, n_classes=3, width=8, depth=3, dropout=0.0)).train()
    ckpt = copy.deepcopy(model)
    ckpt.grad_checkpoint = True
    x = torch.randn(3, 1, 32, 64) * 10 - 40
    lengths = torch.tensor([64, 40, 17])
    y = torch.tensor([0, 1, 2])
    for m in (model, ckpt):
        F.cross_entropy(m(x, lengths), y).backward()
    for (name, a), b in zip(model.named_parameters(), ckpt.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-6, msg=name)
    for (name, a), b in zip(model.named_buffers(), ckpt.buffers(), strict=True):
        assert torch.equal(a, b), name  # BatchNorm statistics counted once, not again in the recompute
    plain_cost = measure_cost_per_frame(model, 32, training=True)
    ckpt_cost = measure_cost_per_frame(ckpt, 32, training=True)
    assert ckpt_cost.bytes_per_frame < 0.8 * plain_cost.bytes_per_frame
    lengths_all = np.full(64, 400)
    plain = plan_batches(lengths_all, Budget.for_cost(64 * 2**20, plain_cost, max_batch=64, frame_align=8))
    packed = plan_batches(lengths_all, Budget.for_cost(64 * 2**20, ckpt_cost, max_batch=64, frame_align=8))
    assert max(len(b) for b in packed.batches) > max(len(b) for b in plain.batches)


@pytest.mark.slow
def test_training_with_grad_checkpoint_option(tmp_path: Path) -> None:
    store = make_separable_store(tmp_path / "s.zarr", n=30)
    res = train(store, tmp_path / "m.pt", TrainConfig(epochs=2, width=4, depth=2, crop_seconds=None, lr=0.03,
                                                     run=CPU_RUN, grad_checkpoint=True, val_fraction=0.25),
                progress=False)
    assert len(res.history) == 2 and np.isfinite(res.history[-1]["loss"])
    assert load_checkpoint(tmp_path / "m.pt").extra["train_config"]["grad_checkpoint"] is True
    with pytest.raises(Exception, match="gradient checkpointing"):
        train(store, tmp_path / "u.pt", TrainConfig(epochs=1, run=CPU_RUN, grad_checkpoint=True),
              model="user_models:TinyUserNet", progress=False)


def test_stacked_features_train_predict_and_evaluate(tmp_path: Path) -> None:
    """feature="mel+cqt": both features of every frame stacked along the bins, through train -> predict -> eval."""
    from specstore.store import FeatureSpec

    specs = {"mel": FeatureSpec.mel(n_bins=16), "cqt": FeatureSpec.cqt(n_bins=12)}
    store = make_store(tmp_path / "s.zarr", lengths=[30, 50, 70, 90, 40, 60] * 4, specs=specs)
    s = open_store(store)
    ds = StoreDataset(s, "mel+cqt")
    assert ds.n_bins == 28 and ds.feature == "mel+cqt"
    item = ds[3]
    np.testing.assert_array_equal(item.features[:16], np.asarray(s.feature("mel")[item.row], dtype=np.float32))
    np.testing.assert_array_equal(item.features[16:], np.asarray(s.feature("cqt")[item.row], dtype=np.float32))
    with pytest.raises(ConfigError, match="joined list of them"):
        StoreDataset(s, "mel+chroma")
    res = train(store, tmp_path / "m.pt", TrainConfig(epochs=1, width=4, depth=2, crop_seconds=None, run=CPU_RUN,
                                                     feature="mel+cqt", val_fraction=0.25), progress=False)
    ck = load_checkpoint(res.model_path)
    assert ck.feature == "mel+cqt" and list(ck.specs) == ["mel", "cqt"] and ck.n_bins == 28
    assert predict(s, ck, device="cpu", progress=False).probs.shape == (len(s), 3)
    assert evaluate(s, res.model_path, device="cpu", progress=False).split == "val"
    mel_only = make_store(tmp_path / "m.zarr", lengths=[30, 40], specs={"mel": specs["mel"]})
    with pytest.raises(Exception, match="needs feature 'mel\\+cqt'"):
        predict(mel_only, ck, device="cpu", progress=False)

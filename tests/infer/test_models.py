"""Tests for infer.models, infer.collate and infer.cost: masking makes padding invisible."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import nn

from specstore.infer.batching.budget import Budget, CostModel
from specstore.infer.batching.planner import plan_batches
from specstore.infer.data.collate import Batch, CollateError, collate
from specstore.infer.engine.cost import activation_peak_bytes, measure_cost_per_frame
from specstore.infer.models import (
    AttentionPooling,
    MaskedBatchNorm2d,
    MaskedClassifier,
    ModelConfig,
    ModelConfigError,
    build_model,
    count_parameters,
)
from specstore.infer.options.defaults import PLAIN_MODEL

ATOL = 1e-4


def tiny(arch: str, **overrides: object) -> ModelConfig:
    """A small config that keeps tests fast but has every kind of layer."""
    base: dict[str, object] = dict(**PLAIN_MODEL, arch=arch, n_bins=20, n_classes=6, width=8, depth=3,
                                   blocks_per_stage=1, dropout=0.3)
    base.update(overrides)
    return ModelConfig(**base)  # type: ignore[arg-type]


def randomise_batchnorm(model: nn.Module, seed: int = 0) -> None:
    """Non-trivial running statistics and affine parameters, so BN is not an identity."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, MaskedBatchNorm2d):
                c = m.num_features
                m.running_mean.copy_(torch.rand(c, generator=g) - 0.5)
                m.running_var.copy_(torch.rand(c, generator=g) * 1.5 + 0.5)
                m.weight.copy_(torch.rand(c, generator=g) + 0.5)
                m.bias.copy_(torch.rand(c, generator=g) - 0.5)


def make_clips(n_bins: int, lengths: list[int], seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [(rng.normal(size=(n_bins, n)) * 15.0 - 45.0).astype(np.float16) for n in lengths]


def eval_model(config: ModelConfig, seed: int = 0) -> MaskedClassifier:
    torch.manual_seed(seed)
    model = build_model(config)
    randomise_batchnorm(model, seed)
    return model.eval()


def logits_alone(model: MaskedClassifier, clip: np.ndarray) -> torch.Tensor:
    batch = collate([clip])
    assert batch.n_frames == clip.shape[1]  # no padding at all
    with torch.no_grad():
        return model(batch.x, batch.lengths)[0]


# --- batched == alone -------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["cnn", "resnet"])
def test_batched_logits_equal_alone(arch: str) -> None:
    model = eval_model(tiny(arch))
    stride = model.time_stride
    assert stride == 8
    # Very short clips, lengths that are and are not multiples of the stride, and a long one.
    lengths = [1, 2, 3, 4, 5, 7, 8, 9, 31, 64, 97, 150]
    clips = make_clips(20, lengths, seed=1)
    for multiple_of in (1, stride):
        batch = collate(clips, multiple_of=multiple_of)
        with torch.no_grad():
            batched = model(batch.x, batch.lengths)
        for i, clip in enumerate(clips):
            torch.testing.assert_close(batched[i], logits_alone(model, clip), atol=ATOL, rtol=0)


@pytest.mark.parametrize("arch", ["cnn", "resnet"])
def test_batched_equals_alone_with_random_lengths_and_default_width(arch: str) -> None:
    rng = np.random.default_rng(5)
    config = ModelConfig(**PLAIN_MODEL, arch=arch, n_bins=32, n_classes=4, depth=4, blocks_per_stage=1)
    model = eval_model(config, seed=2)
    lengths = rng.integers(1, 120, size=6).tolist()
    clips = make_clips(32, lengths, seed=3)
    batch = collate(clips, pad_to=140)  # extra padding beyond the longest clip changes nothing either
    with torch.no_grad():
        batched = model(batch.x, batch.lengths)
    for i, clip in enumerate(clips):
        torch.testing.assert_close(batched[i], logits_alone(model, clip), atol=ATOL, rtol=0)


def test_padding_content_is_ignored_in_eval() -> None:
    model = eval_model(tiny("cnn"))
    batch = collate(make_clips(20, [5, 40, 23]))
    dirty = batch.x.clone()
    dirty[~batch.mask[:, None, None, :].expand_as(dirty)] = 1e4  # garbage where there is no clip
    with torch.no_grad():
        torch.testing.assert_close(model(dirty, batch.lengths), model(batch.x, batch.lengths), atol=ATOL, rtol=0)


def test_pooled_sum_and_classify_reproduce_forward() -> None:
    model = eval_model(tiny("resnet"))
    batch = collate(make_clips(20, [13, 50]))
    with torch.no_grad():
        sums, counts = model.pooled_sum(batch.x, batch.lengths)
        assert counts.tolist() == [2.0, 7.0]  # ceil(L / 8) frames at the final resolution
        torch.testing.assert_close(model.classify(sums, counts), model(batch.x, batch.lengths))


def bin_stats(n_bins: int, seed: int = 0) -> dict[str, list[float]]:
    """Per-bin normalisation values around the test clips' -45 dB."""
    rng = np.random.default_rng(seed)
    return {"bin_mean": rng.normal(-45.0, 5.0, n_bins).tolist(), "bin_std": rng.uniform(5.0, 20.0, n_bins).tolist()}


@pytest.mark.parametrize("arch", ["cnn", "resnet"])
@pytest.mark.parametrize("pooling", ["mean", "meanstd", "attention"])
def test_every_pooling_with_per_bin_normalisation_is_batched_equal_alone_and_windows_exactly(
        arch: str, pooling: str) -> None:
    from specstore.infer.engine.windows import run_windowed

    model = eval_model(tiny(arch, pooling=pooling, **bin_stats(20)))
    if isinstance(model.pooling, AttentionPooling):  # a non-trivial attention score
        torch.nn.init.normal_(model.pooling.weight, std=2.0)
    clips = make_clips(20, [1, 3, 8, 9, 31, 97], seed=1)
    batch = collate(clips, multiple_of=model.time_stride)
    with torch.no_grad():
        batched = model(batch.x, batch.lengths)
        sums, counts = model.pooled_sum(batch.x, batch.lengths)
        torch.testing.assert_close(model.classify(sums, counts), batched)
    for i, clip in enumerate(clips):
        torch.testing.assert_close(batched[i], logits_alone(model, clip), atol=ATOL, rtol=0)
    long = make_clips(20, [500], seed=2)[0]
    context = -(-model.receptive_field // model.time_stride) * model.time_stride
    windowed = run_windowed(model, long, 4 * context + 40, context=context)
    torch.testing.assert_close(windowed, logits_alone(model, long), atol=ATOL, rtol=0)


def test_per_bin_normalisation_maps_bin_means_to_zero_and_is_not_in_the_state_dict() -> None:
    stats = bin_stats(20)
    model = eval_model(tiny("cnn", **stats))
    x = torch.tensor(stats["bin_mean"], dtype=torch.float32)[None, None, :, None].expand(2, 1, 20, 8)
    h, _ = model._prepare(x, torch.tensor([8, 3]))
    assert h.abs().max() < 1e-5
    assert not any(k.startswith("bin_") for k in model.state_dict())
    with pytest.raises(ModelConfigError, match="bin_mean must hold 20"):
        tiny("cnn", bin_mean=[0.0] * 19, bin_std=[1.0] * 19)
    with pytest.raises(ModelConfigError, match="together"):
        tiny("cnn", bin_mean=[0.0] * 20)
    with pytest.raises(ModelConfigError, match="pooling"):
        tiny("cnn", pooling="max")
    config = tiny("resnet", pooling="meanstd", **stats)
    assert ModelConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config


# --- training: masked batch norm ----------------------------------------------------------------


def test_unpadded_training_batches_take_the_fused_path_with_the_same_results() -> None:
    """No padding: batch norm, masking and pooling take faster paths that give what the masked ones give."""
    torch.manual_seed(0)
    x = torch.randn(3, 4, 5, 12) * 3 + 1
    full = torch.tensor([12, 12, 12])
    fused, masked = MaskedBatchNorm2d(4).train(), MaskedBatchNorm2d(4).train()
    out = fused(x, full)
    padded = torch.cat([x, torch.randn(3, 4, 5, 4) * 50], dim=-1)  # forces the masked path
    torch.testing.assert_close(out, masked(padded, full)[..., :12], atol=1e-5, rtol=1e-5)
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        torch.testing.assert_close(getattr(fused, name), getattr(masked, name), atol=1e-6, rtol=1e-6)
    fused.recomputing = True  # gradient checkpointing's second pass leaves the running stats alone
    before = fused.running_mean.clone()
    fused(x, full)
    torch.testing.assert_close(fused.running_mean, before, atol=0, rtol=0)
    # a training step on an unpadded batch equals the same clips with padding after them
    config = tiny("cnn", dropout=0.0)
    clips = make_clips(20, [24, 24, 24], seed=6)
    outs = []
    for pad_to in (24, 40):
        torch.manual_seed(0)
        model = build_model(config).train()
        batch = collate(clips, pad_to=pad_to)
        out = model(batch.x, batch.lengths)
        out.square().sum().backward()
        outs.append((out.detach(), model.blocks[0].conv.weight.grad.clone()))
    torch.testing.assert_close(outs[0][0], outs[1][0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(outs[0][1], outs[1][1], atol=1e-4, rtol=1e-4)



def test_masked_batchnorm_statistics_cover_real_frames_only() -> None:
    torch.manual_seed(0)
    x = torch.randn(3, 4, 5, 12) * 3 + 1
    lengths = torch.tensor([12, 7, 2])
    masked = MaskedBatchNorm2d(4).train()
    reference = nn.BatchNorm2d(4).train()
    with torch.no_grad():
        masked.weight.uniform_(0.5, 1.5)
        masked.bias.uniform_(-1, 1)
        reference.load_state_dict(masked.state_dict())
    out = masked(x, lengths)
    # Reference: plain BN on the real frames laid side by side (one "clip" of all real frames).
    real = torch.cat([x[i, :, :, : int(n)] for i, n in enumerate(lengths)], dim=-1)[None]
    expected = reference(real)
    got = torch.cat([out[i, :, :, : int(n)] for i, n in enumerate(lengths)], dim=-1)[None]
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(masked.running_mean, reference.running_mean)
    torch.testing.assert_close(masked.running_var, reference.running_var)
    assert int(masked.num_batches_tracked) == 1


@pytest.mark.parametrize("arch", ["cnn", "resnet"])
def test_training_step_ignores_padding_content_and_amount(arch: str) -> None:
    """Outputs, parameter gradients and BN running stats do not see what or how much padding there is."""
    config = tiny(arch, dropout=0.0)
    clips = make_clips(20, [3, 17, 40], seed=4)
    results = []
    for pad_to, garbage in ((40, 0.0), (61, 0.0), (61, 50.0)):
        torch.manual_seed(0)
        model = build_model(config).train()
        batch = collate(clips, pad_to=pad_to)
        x = batch.x.clone()
        x[~batch.mask[:, None, None, :].expand_as(x)] = garbage
        x.requires_grad_(True)
        out = model(x, batch.lengths)
        out.square().sum().backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        stats = {n: b.clone() for n, b in model.named_buffers()}
        pad = ~batch.mask[:, None, None, :].expand_as(x)
        assert x.grad is not None and not x.grad[pad].any(), "padding gets no gradient"
        real = [x.grad[i, :, :, :n].clone() for i, n in enumerate(batch.lengths.tolist())]
        results.append((out.detach(), grads, stats, real))
    base = results[0]
    for other in results[1:]:
        torch.testing.assert_close(other[0], base[0], atol=1e-5, rtol=1e-5)
        for name in base[1]:
            torch.testing.assert_close(other[1][name], base[1][name], atol=1e-4, rtol=1e-4, msg=name)
        for name in base[2]:
            torch.testing.assert_close(other[2][name], base[2][name], atol=1e-5, rtol=1e-5, msg=name)
        for got, expected in zip(other[3], base[3], strict=True):
            torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)


def test_training_changes_only_through_real_frames_when_a_clip_is_alone() -> None:
    """Train-mode BN over one clip alone equals the same clip padded in a batch of one."""
    config = tiny("cnn", dropout=0.0)
    clip = make_clips(20, [21])[0]
    outs = []
    for pad_to in (21, 48):
        torch.manual_seed(0)
        model = build_model(config).train()
        batch = collate([clip], pad_to=pad_to)
        outs.append(model(batch.x, batch.lengths).detach())
    torch.testing.assert_close(outs[0], outs[1], atol=1e-5, rtol=1e-5)


# --- memory formats and precision --------------------------------------------------------------


@pytest.mark.parametrize("arch", ["cnn", "resnet"])
def test_channels_last_gives_the_same_logits(arch: str) -> None:
    model = eval_model(tiny(arch))
    batch = collate(make_clips(20, [3, 29, 50]))
    with torch.no_grad():
        reference = model(batch.x, batch.lengths)
        model = model.to(memory_format=torch.channels_last)
        out = model(batch.x.to(memory_format=torch.channels_last), batch.lengths)
    torch.testing.assert_close(out, reference, atol=ATOL, rtol=0)


def test_bf16_autocast_runs_and_stays_close() -> None:
    model = eval_model(tiny("cnn"))
    batch = collate(make_clips(20, [9, 60]))
    with torch.no_grad():
        reference = model(batch.x, batch.lengths)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(batch.x, batch.lengths)
    assert out.dtype == torch.float32 or out.dtype == torch.bfloat16
    assert torch.isfinite(out).all()
    assert (out.float() - reference).abs().max() < 0.05 * reference.abs().max() + 0.05


# --- configs ------------------------------------------------------------------------------------


def test_config_round_trip_and_errors() -> None:
    config = ModelConfig(arch="resnet", n_bins=84, width=16, depth=3, time_kernel=5)
    assert ModelConfig.from_dict(config.to_dict()) == config
    with pytest.raises(ModelConfigError, match="unknown model config field"):
        ModelConfig.from_dict({**config.to_dict(), "colour": "red"})
    with pytest.raises(ModelConfigError, match="arch"):
        ModelConfig(arch="vgg")
    with pytest.raises(ModelConfigError, match="time_kernel"):
        ModelConfig(time_kernel=2)
    with pytest.raises(ModelConfigError, match="width"):
        ModelConfig(width=0)


def test_default_sizes() -> None:
    cnn = build_model(ModelConfig(**PLAIN_MODEL))
    assert 100_000 <= count_parameters(cnn) <= 500_000
    assert cnn.time_stride == 16
    resnet = build_model(ModelConfig(**PLAIN_MODEL, arch="resnet"))
    assert count_parameters(resnet) > count_parameters(cnn)
    assert resnet.time_stride == 16
    flat = build_model(ModelConfig(**PLAIN_MODEL, time_kernel=1, time_pool=False))
    assert flat.time_stride == 1 and flat.receptive_field == 1


def test_bad_input_shapes_raise() -> None:
    model = eval_model(tiny("cnn"))
    with pytest.raises(ValueError, match="expected input"):
        model(torch.zeros(2, 1, 21, 10), torch.tensor([10, 10]))
    with pytest.raises(ValueError, match="lengths must lie"):
        model(torch.zeros(2, 1, 20, 10), torch.tensor([0, 10]))
    with pytest.raises(ValueError, match="lengths must lie"):
        model(torch.zeros(2, 1, 20, 10), torch.tensor([11, 10]))


# --- collation ----------------------------------------------------------------------------------


def test_collate_pads_with_zeros_and_builds_the_mask() -> None:
    clips = make_clips(6, [4, 9, 1])
    batch = collate(clips, ids=[10, 11, 12])
    assert isinstance(batch, Batch) and len(batch) == 3
    assert batch.x.shape == (3, 1, 6, 9) and batch.x.dtype == torch.float32
    assert batch.lengths.tolist() == [4, 9, 1] and batch.lengths.dtype == torch.int64
    assert batch.mask.dtype == torch.bool and batch.mask.sum(dim=1).tolist() == [4, 9, 1]
    for i, clip in enumerate(clips):
        n = clip.shape[1]
        np.testing.assert_array_equal(batch.x[i, 0, :, :n].numpy(), clip.astype(np.float32))
        assert not batch.x[i, 0, :, n:].any()
    assert batch.ids is not None and batch.ids.tolist() == [10, 11, 12]
    assert collate(clips, multiple_of=4).n_frames == 12
    assert collate(clips, pad_to=10, multiple_of=4).n_frames == 12
    assert collate(clips, dtype=torch.bfloat16).x.dtype == torch.bfloat16


def test_collate_rejects_bad_batches() -> None:
    with pytest.raises(CollateError, match="empty"):
        collate([])
    with pytest.raises(CollateError, match="n_bins"):
        collate([np.zeros((4, 3)), np.zeros((5, 3))])
    with pytest.raises(CollateError, match="pad_to"):
        collate([np.zeros((4, 8))], pad_to=5)
    with pytest.raises(CollateError, match="2-D"):
        collate([np.zeros((1, 4, 3))])


# --- memory cost --------------------------------------------------------------------------------


def test_cost_fit_is_linear_positive_and_grows_with_the_model() -> None:
    small = build_model(tiny("cnn", width=4)).eval()
    big = build_model(tiny("cnn", width=16)).eval()
    c_small = measure_cost_per_frame(small, 20)
    c_big = measure_cost_per_frame(big, 20)
    assert c_small.bytes_per_frame > 0 and c_small.fixed_bytes > 0
    assert c_big.bytes_per_frame > 2 * c_small.bytes_per_frame
    assert c_big.fixed_bytes > c_small.fixed_bytes
    # The line predicts a probe it was not fitted on (batch 3, 200 frames: multiple of the stride).
    x = torch.zeros(3, 1, 20, 200)
    measured = activation_peak_bytes(big, x, torch.full((3,), 200))
    params = sum(t.numel() * t.element_size() for t in [*big.parameters(), *big.buffers()])
    charged = Budget.for_cost(2**62, c_big).bytes(3, 200)
    assert measured + params <= charged
    assert measured + params == pytest.approx(charged, rel=1e-3)
    # Fields survive a round trip.
    assert CostModel.from_dict(c_big.to_dict()) == c_big
    # Training needs more per frame than inference, bf16 autocast less.
    assert measure_cost_per_frame(big.train(), 20, training=True).bytes_per_frame > c_big.bytes_per_frame
    big.eval()
    assert measure_cost_per_frame(big, 20, autocast=torch.bfloat16).bytes_per_frame < c_big.bytes_per_frame


def test_planned_batches_stay_under_budget_when_run() -> None:
    model = eval_model(tiny("resnet"))
    cost = measure_cost_per_frame(model, 20)
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 400, size=40)
    budget = int(Budget.for_cost(2**62, cost).bytes(5, 300))
    plan = plan_batches(lengths, Budget.for_cost(budget, cost, frame_align=model.time_stride))
    clips = make_clips(20, lengths.tolist(), seed=1)
    params = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    peaks = []
    for ids in plan.batches:
        batch = collate([clips[i] for i in ids], multiple_of=model.time_stride)
        peaks.append(activation_peak_bytes(model, batch.x, batch.lengths) + params)
    assert max(peaks) <= budget
    assert max(peaks) > 0.8 * budget  # and the budget is actually used
    assert len(plan.too_long) == int(np.sum(-(-lengths // 8) * 8 * cost.bytes_per_frame + cost.fixed_bytes > budget))


def test_a_few_training_steps_learn_and_keep_batched_equal_alone() -> None:
    """Gradients flow through the masked layers; trained BN statistics keep the padding invariance."""
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    config = tiny("cnn", n_classes=2, dropout=0.0)
    model = build_model(config)
    optimiser = torch.optim.Adam(model.parameters(), lr=3e-3)

    def sample(n: int) -> tuple[list[np.ndarray], torch.Tensor]:
        labels = rng.integers(0, 2, size=n)
        clips = []
        for label in labels:
            clip = rng.normal(size=(20, int(rng.integers(3, 60)))) * 5 - 50
            clip[(0 if label == 0 else 10) : (10 if label == 0 else 20)] += 25  # loud low or high band
            clips.append(clip.astype(np.float16))
        return clips, torch.from_numpy(labels)

    losses = []
    model.train()
    for _ in range(25):
        clips, labels = sample(8)
        batch = collate(clips)
        loss = nn.functional.cross_entropy(model(batch.x, batch.lengths), labels)
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        losses.append(loss.item())
    assert np.mean(losses[-5:]) < 0.5 * np.mean(losses[:5])
    model.eval()
    clips, labels = sample(10)
    batch = collate(clips)
    with torch.no_grad():
        batched = model(batch.x, batch.lengths)
    assert (batched.argmax(dim=1) == labels).float().mean() >= 0.8
    for i, clip in enumerate(clips):
        torch.testing.assert_close(batched[i], logits_alone(model, clip), atol=ATOL, rtol=0)


# --- the statistics head ------------------------------------------------------------------------


def stats_model(arch: str = "cnn", weight: float = 1.0) -> MaskedClassifier:
    """A model with a statistics head whose weights are random (as if fitted)."""
    model = eval_model(tiny(arch, pooling="meanstd", freq_pooling="keep", stats_head=True, stats_weight=weight,
                            **bin_stats(20)))
    assert model.stats_linear is not None
    with torch.no_grad():
        torch.nn.init.normal_(model.stats_linear.weight, std=0.5)
        model.stats_shift.normal_()
        model.stats_scale.uniform_(0.5, 2.0)
    return model


def _assert_batched_equal_alone_and_windows_exactly(model: torch.nn.Module, *, seed: int, align: int | None) -> None:
    """Six clips of 1-97 frames batched equal each alone; a 500-frame clip windowed (context rounded up to
    ``align``, default the time stride) equals it whole."""
    from specstore.infer.engine.windows import run_windowed

    clips = make_clips(20, [1, 3, 8, 9, 31, 97], seed=seed)
    batch = collate(clips, multiple_of=model.time_stride)
    with torch.no_grad():
        batched = model(batch.x, batch.lengths)
    for i, clip in enumerate(clips):
        torch.testing.assert_close(batched[i], logits_alone(model, clip), atol=ATOL, rtol=0)
    long = make_clips(20, [500], seed=seed + 1)[0]
    step = align or model.time_stride
    context = -(-model.receptive_field // step) * step
    windowed = run_windowed(model, long, 4 * context + 40, context=context)
    torch.testing.assert_close(windowed, logits_alone(model, long), atol=ATOL, rtol=0)


@pytest.mark.parametrize("arch", ["cnn", "resnet"])
def test_statistics_head_is_batched_equal_alone_and_windows_exactly(arch: str) -> None:
    _assert_batched_equal_alone_and_windows_exactly(stats_model(arch), seed=3, align=None)


def test_statistics_head_adds_weighted_logits_in_eval_and_is_absent_in_training() -> None:
    model = stats_model(weight=0.7)
    clips = make_clips(20, [40, 17], seed=5)
    batch = collate(clips, multiple_of=model.time_stride)
    with torch.no_grad():
        both = model(batch.x, batch.lengths)
        stats = model.stats_logits(model.clip_statistics(batch.x, batch.lengths))
        cnn = model.classify_pooled(model.pooled(batch.x, batch.lengths)._replace(stats=None))
    torch.testing.assert_close(both, cnn + 0.7 * stats, atol=ATOL, rtol=0)
    assert stats.abs().max() > 0.1  # the head changes the output
    model.train()
    sums, _ = model.pooled_sum(batch.x, batch.lengths)
    assert sums.shape[1] == model.head.in_features  # training sees the CNN alone


def test_clip_statistics_are_the_baselines_band_statistics_of_the_normalised_input() -> None:
    from specstore.infer.evaluation.baselines import STATS

    model = stats_model()
    clip = make_clips(20, [57], seed=6)[0].astype(np.float64)
    mean, std = np.array(model.config.bin_mean), np.array(model.config.bin_std)
    z = (clip - mean[:, None]) / std[:, None]
    expected = {"mean": z.mean(1), "std": z.std(1), "delta": np.abs(np.diff(z, axis=1)).mean(1)}
    batch = collate([clip.astype(np.float32)])
    got = model.clip_statistics(batch.x, batch.lengths)[0].double().numpy()
    np.testing.assert_allclose(got, np.concatenate([expected[s] for s in STATS]), atol=1e-4)


@pytest.mark.parametrize("arch,pooling,stats_head", [("cnn", "meanstd", True), ("resnet", "attention", False),
                                                     ("cnn", "mean", False)])
def test_window_pooling_is_batched_equal_alone_and_windows_exactly(arch: str, pooling: str, stats_head: bool) -> None:
    model = eval_model(tiny(arch, pooling=pooling, freq_pooling="keep", pool_window=16, stats_head=stats_head,
                            **bin_stats(20)))
    assert model.window_align == 16 and model.time_stride == 8
    if isinstance(model.pooling, AttentionPooling):
        torch.nn.init.normal_(model.pooling.weight, std=2.0)
    _assert_batched_equal_alone_and_windows_exactly(model, seed=7, align=model.window_align)


def test_window_pooling_averages_the_windows_logits_weighted_by_their_frames() -> None:
    # A one-frame time kernel: a window's activations depend on its own frames only, as the window alone.
    model = eval_model(tiny("cnn", pooling="meanstd", pool_window=16, time_kernel=1, **bin_stats(20)))
    whole = eval_model(tiny("cnn", pooling="meanstd", time_kernel=1, **bin_stats(20)))  # same seed, same weights
    clip = make_clips(20, [40], seed=9)[0]  # windows of 16, 16 and 8 frames
    parts = [logits_alone(whole, clip[:, a:b]) for a, b in ((0, 16), (16, 32), (32, 40))]
    expected = (16 * parts[0] + 16 * parts[1] + 8 * parts[2]) / 40
    torch.testing.assert_close(logits_alone(model, clip), expected, atol=ATOL, rtol=0)
    one = make_clips(20, [16], seed=10)[0]  # one window: the same as pooling the whole clip
    torch.testing.assert_close(logits_alone(model, one), logits_alone(whole, one), atol=ATOL, rtol=0)
    with pytest.raises(ModelConfigError, match="multiple of the model's time stride"):
        build_model(tiny("cnn", pool_window=12))

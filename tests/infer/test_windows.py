"""Tests for infer.windows: windows cover every frame once; combined pooled sums match the full clip."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specstore.infer.data.collate import collate
from specstore.infer.engine.windows import (
    WindowError,
    default_context,
    owned_spans,
    run_windowed,
    windowed_pooled_sum,
    windows_for,
)
from specstore.infer.models import MaskedBatchNorm2d, MaskedClassifier, ModelConfig, build_model
from specstore.infer.options.defaults import PLAIN_MODEL


def make_model(**overrides: object) -> MaskedClassifier:
    config: dict[str, object] = dict(**PLAIN_MODEL, arch="cnn", n_bins=12, n_classes=5, width=8, depth=3,
                                     blocks_per_stage=1)
    config.update(overrides)
    torch.manual_seed(0)
    model = build_model(ModelConfig(**config))  # type: ignore[arg-type]
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, MaskedBatchNorm2d):
                m.running_mean.copy_(torch.rand(m.num_features, generator=g) - 0.5)
                m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
                m.weight.copy_(torch.rand(m.num_features, generator=g) + 0.5)
                m.bias.copy_(torch.rand(m.num_features, generator=g) - 0.5)
    return model.eval()


def long_clip(n_bins: int, n_frames: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    # Slowly varying content plus noise, so windows see different material.
    trend = np.sin(np.linspace(0, 12, n_frames))[None, :] * 10
    return (rng.normal(size=(n_bins, n_frames)) * 8 - 40 + trend).astype(np.float16)


def full_logits(model: MaskedClassifier, clip: np.ndarray) -> torch.Tensor:
    batch = collate([clip])
    with torch.no_grad():
        return model(batch.x, batch.lengths)[0]


@settings(max_examples=200, deadline=None)
@given(
    length=st.integers(min_value=1, max_value=5000),
    window=st.integers(min_value=1, max_value=900),
    align=st.sampled_from([1, 2, 4, 16]),
    hop_fraction=st.floats(min_value=0.0, max_value=1.0),
)
def test_windows_cover_the_clip_and_owned_spans_partition_it(
    length: int, window: int, align: int, hop_fraction: float
) -> None:
    rounded = window // align * align
    if rounded < align:
        with pytest.raises(WindowError):
            windows_for(length, window, align=align)
        return
    hop = max(align, int(rounded * hop_fraction) // align * align)
    spans = windows_for(length, window, hop=hop, align=align)
    assert spans[0][0] == 0 and spans[-1][1] == length
    for (start, stop), (next_start, _) in zip(spans, spans[1:], strict=False):
        assert next_start <= stop, "no gap between windows"
        assert next_start > start
    for start, stop in spans:
        assert start % align == 0 and 0 < stop - start <= rounded
    owned = owned_spans(spans, align=align)
    assert owned[0][0] == 0 and owned[-1][1] == length
    for (lo, hi), (next_lo, _) in zip(owned, owned[1:], strict=False):
        assert hi == next_lo and lo % align == 0
    for (lo, hi), (start, stop) in zip(owned, spans, strict=True):
        assert start <= lo < hi <= stop, "each window owns part of itself"


def test_disjoint_windows_by_default() -> None:
    assert windows_for(10, 4) == [(0, 4), (4, 8), (8, 10)]
    assert windows_for(3, 4) == [(0, 3)]
    assert windows_for(20, 10, hop=6, align=2) == [(0, 10), (6, 16), (12, 20)]
    assert owned_spans(windows_for(20, 10, hop=6, align=2), align=2) == [(0, 8), (8, 14), (14, 20)]
    with pytest.raises(WindowError, match="hop"):
        windows_for(20, 10, hop=12)
    with pytest.raises(WindowError, match="length"):
        windows_for(0, 10)


def test_one_frame_receptive_field_is_exact_for_disjoint_windows() -> None:
    model = make_model(time_kernel=1, time_pool=False)
    assert model.receptive_field == 1 and model.time_stride == 1
    clip = long_clip(12, 1003)
    expected = full_logits(model, clip)
    for window in (29, 100, 250, 2000):
        got = run_windowed(model, clip, window, context=0)
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("arch", ["cnn", "resnet"])
def test_context_covering_the_receptive_field_is_exact(arch: str) -> None:
    model = make_model(arch=arch)
    clip = long_clip(12, 1501, seed=1)
    expected = full_logits(model, clip)
    context = -(-model.receptive_field // model.time_stride) * model.time_stride
    window = 4 * context + 40
    sums, count, n_windows = windowed_pooled_sum(model, clip, window, context=context)
    assert n_windows > 3
    assert count.item() == -(-1501 // model.time_stride), "every output frame pooled exactly once"
    got = run_windowed(model, clip, window, context=context)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)
    assert default_context(model, window) == context


def test_disjoint_windows_differ_only_at_the_seams() -> None:
    model = make_model()
    clip = long_clip(12, 2400, seed=2)
    expected = full_logits(model, clip)
    many_seams = run_windowed(model, clip, 96, context=0)  # 25 windows
    few_seams = run_windowed(model, clip, 800, context=0)  # 3 windows
    err_many = (many_seams - expected).abs().max().item()
    err_few = (few_seams - expected).abs().max().item()
    scale = expected.abs().max().item()
    assert err_few < 0.02 * scale, "close to the full clip"
    assert err_few < err_many, "the error comes from seams: fewer seams, smaller error"
    # Same number of pooled frames as the full clip: nothing dropped, nothing counted twice.
    _, count, _ = windowed_pooled_sum(model, clip, 96, context=0)
    assert count.item() == 2400 // model.time_stride


def test_short_clip_is_one_window_equal_to_forward() -> None:
    model = make_model(arch="resnet")
    clip = long_clip(12, 37)
    torch.testing.assert_close(run_windowed(model, clip, 512), full_logits(model, clip), atol=1e-5, rtol=0)


def test_window_below_the_stride_is_refused() -> None:
    model = make_model()
    with pytest.raises(WindowError):
        run_windowed(model, long_clip(12, 100), model.time_stride - 1)
    with pytest.raises(WindowError, match="context"):
        run_windowed(model, long_clip(12, 100), 32, context=16)

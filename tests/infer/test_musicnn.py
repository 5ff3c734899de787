"""The PyTorch musicnn against the original TensorFlow model's outputs (tests/fixtures/musicnn, made by
tools/musicnn_convert.py), its masking, its shipped weights' checksum and its registry entry. No TensorFlow."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from specstore.common import ConfigError
from specstore.infer.models import ModelConfig, ModelConfigError, build_model
from specstore.infer.models.musicnn import EMBEDDING_DIM, PATCH_FRAMES, MusiCNN
from specstore.infer.models.pretrained import MUSICNN_MODELS, PRETRAINED_DIR, PretrainedError, load_musicnn
from specstore.store import FeatureSpec

FIXTURE = Path(__file__).parents[1] / "fixtures" / "musicnn" / "fixture.npz"
SIGNALS = ("chirp", "bursts", "chord")  # 4 s (1 patch + partial), 2 s (< 1 patch), 7 s (2 patches + partial)


@pytest.fixture(scope="module")
def fixture() -> dict[str, np.ndarray]:
    with np.load(FIXTURE, allow_pickle=False) as f:
        return {k: f[k] for k in f.files}


@pytest.fixture(scope="module")
def models() -> dict[str, tuple[MusiCNN, list[str], FeatureSpec]]:
    return {name: load_musicnn(name) for name in MUSICNN_MODELS}


def clip(mel: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """A ``(frames, 96)`` mel as the model's ``(1, 1, 96, T)`` input and its length."""
    return torch.from_numpy(np.ascontiguousarray(mel.T))[None, None], torch.tensor([mel.shape[0]])


def frame_weights(frames: int) -> np.ndarray:
    """Real frames of each 187-frame patch of a clip (the last one partial)."""
    n = -(-frames // PATCH_FRAMES)
    return np.minimum(PATCH_FRAMES, frames - PATCH_FRAMES * np.arange(n)).astype(np.float64)


@pytest.mark.parametrize("name", MUSICNN_MODELS)
def test_the_port_reproduces_the_tensorflow_model(name: str, fixture: dict[str, np.ndarray],
                                                  models: dict[str, tuple[MusiCNN, list[str], FeatureSpec]]) -> None:
    model, tags, spec = models[name]
    assert len(tags) == 50 and spec == FeatureSpec.of_kind("musicnn") and not model.training
    for key in SIGNALS:
        mel = fixture[f"mel/{key}"]
        x, lengths = clip(mel)
        with torch.no_grad():
            patches, _, real = model.patches(x, lengths)
            out = {k: v.numpy() for k, v in model.patch_layers(patches).items()}
        taggram = fixture[f"{name}/{key}/taggram"]
        np.testing.assert_allclose(1 / (1 + np.exp(-out["logits"])), taggram, rtol=0, atol=1e-4)
        for layer in ("penultimate", "mean_pool", "max_pool"):
            expected = fixture[f"{name}/{key}/{layer}"]
            scale = float(np.abs(expected).max())
            np.testing.assert_allclose(out[layer], expected, rtol=0, atol=1e-4 * scale, err_msg=layer)
        # the clip's outputs: patches averaged, each weighted by its real frames (one model: the patches cost)
        w = frame_weights(mel.shape[0])
        assert real.tolist() == w.tolist()
        if name != MUSICNN_MODELS[0]:
            continue
        with torch.no_grad():
            clip_tags, clip_embedding = (t.numpy()[0] for t in model.clip_outputs(x, lengths))
        np.testing.assert_allclose(clip_tags, w @ taggram / w.sum(), rtol=0, atol=1e-4)
        penultimate = fixture[f"{name}/{key}/penultimate"]
        np.testing.assert_allclose(clip_embedding, w @ penultimate / w.sum(), rtol=0,
                                   atol=1e-4 * float(np.abs(penultimate).max()))


def test_a_clip_batched_equals_the_clip_alone(fixture: dict[str, np.ndarray],
                                              models: dict[str, tuple[MusiCNN, list[str], FeatureSpec]]) -> None:
    model = models["musicnn-msd"][0]
    # 1 patch + a partial one, under one patch, 20 frames (4 patches in all)
    mels = [fixture["mel/chirp"], fixture["mel/bursts"], fixture["mel/chord"][:20]]
    longest = max(m.shape[0] for m in mels)
    x = torch.full((len(mels), 1, 96, longest + 50), 3.0)  # what lies beyond a clip's length must not matter
    for i, m in enumerate(mels):
        x[i, 0, :, : m.shape[0]] = torch.from_numpy(m.T)
    lengths = torch.tensor([m.shape[0] for m in mels])
    with torch.no_grad():
        tags, embedding = model.clip_outputs(x, lengths)
        assert tags.shape == (len(mels), 50) and embedding.shape == (len(mels), EMBEDDING_DIM)
        for i, m in enumerate(mels):
            alone_tags, alone_embedding = model.clip_outputs(*clip(m))
            torch.testing.assert_close(tags[i], alone_tags[0], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(embedding[i], alone_embedding[0], atol=1e-5, rtol=1e-5)
        short = (x[1:2, ..., :187], lengths[1:2])  # forward, tags and embed are the same averages
        torch.testing.assert_close(torch.sigmoid(model(*short)), tags[1:2], atol=1e-6, rtol=0)
        torch.testing.assert_close(model.embed(*short), embedding[1:2], atol=1e-5, rtol=1e-5)
    assert torch.isfinite(tags).all() and model.embedding_dim == EMBEDDING_DIM


def test_a_damaged_weight_file_or_an_unknown_name_is_one_line(tmp_path: Path) -> None:
    folder = tmp_path / "musicnn"
    shutil.copytree(PRETRAINED_DIR, folder)
    data = bytearray((folder / "msd.npz").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (folder / "msd.npz").write_bytes(bytes(data))
    with pytest.raises(PretrainedError, match=r"msd\.npz: sha256 .* does not match the recorded") as e:
        load_musicnn("musicnn-msd", folder)
    assert "\n" not in str(e.value)
    load_musicnn("musicnn-mtt", folder)  # the other file is intact
    with pytest.raises(ConfigError, match=r"unknown pretrained model 'musicnn-xyz'; shipped: musicnn-msd, musicnn-mtt"):
        load_musicnn("musicnn-xyz")


def test_musicnn_is_a_registered_architecture() -> None:
    config = ModelConfig(arch="musicnn", n_bins=96, n_classes=7, pooling="mean")
    model = build_model(config)
    assert isinstance(model, MusiCNN) and model.time_stride == PATCH_FRAMES
    assert sum(p.numel() for p in model.parameters()) == config.n_parameters
    with pytest.raises((ConfigError, ModelConfigError), match="96 mel bands"):
        build_model(ModelConfig(arch="musicnn", n_bins=128, n_classes=7, pooling="mean"))


def test_the_memory_probe_takes_one_patch_per_stride_and_predicts_longer_batches(
        models: dict[str, tuple[MusiCNN, list[str], FeatureSpec]]) -> None:
    """The CPU cost probe uses 1, 2 and 3 patches (not 4, 8, 12: a 187-frame stride made the probe the slow part of
    classify's start), and its line still bounds the live tensors of a 2 x 7-patch batch, within 1 %."""
    from specstore.infer.batching.budget import Budget
    from specstore.infer.engine.cost import _probe_frames, activation_peak_bytes, measure_cost_per_frame

    model = models[MUSICNN_MODELS[0]][0]
    assert _probe_frames(model, None, torch.device("cpu")) == (PATCH_FRAMES, 2 * PATCH_FRAMES, 3 * PATCH_FRAMES)
    cost = measure_cost_per_frame(model, 96)
    frames = 7 * PATCH_FRAMES
    x = torch.randn(2, 1, 96, frames) * 20 - 40
    measured = activation_peak_bytes(model, x, torch.full((2,), frames))
    params = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    charged = Budget.for_cost(2**62, cost).bytes(2, frames)
    assert measured + params <= charged * 1.0001
    assert measured + params == pytest.approx(charged, rel=1e-2)


@pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:DeprecationWarning")
def test_the_exported_tagger_equals_the_model_for_any_number_of_patches(
        models: dict[str, tuple[MusiCNN, list[str], FeatureSpec]], tmp_path: Path) -> None:
    """``specstore export musicnn-msd``: no shape in the graph depends on the example's lengths (a traced patch
    count once gave other logits on clips of more patches), so the file equals the model on any batch."""
    from specstore.infer.engine.export import export_model

    res = export_model("musicnn-msd", tmp_path / "m.torchscript.pt", format="torchscript")
    assert res.compared == "scores" and res.max_difference is not None and res.max_difference < 1e-5
    scripted = torch.jit.load(str(res.path))
    model = models["musicnn-msd"][0]
    gen = torch.Generator().manual_seed(3)
    for frames, lengths in [(900, [900, 400]), (150, [150]), (2000, [2000, 1000, 10, 187])]:
        lens = torch.tensor(lengths)
        x = (torch.randn(len(lengths), 1, 96, frames, generator=gen) * 20 - 40) * (
            torch.arange(frames) < lens[:, None, None, None])
        with torch.no_grad():
            torch.testing.assert_close(torch.sigmoid(scripted(x.clone(), lens)), model.tags(x.clone(), lens),
                                       atol=1e-5, rtol=0)


def _long_clip(model: torch.nn.Module, frames: int, seed: int) -> tuple[np.ndarray, torch.Tensor]:
    """A random ``(96, frames)`` clip and ``model``'s logits for it run whole."""
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(1, 1, 96, frames, generator=gen) * 20 - 40).numpy()[0, 0]
    with torch.no_grad():
        return x, model(torch.from_numpy(x)[None, None], torch.tensor([frames]))[0]


def test_a_clip_too_long_for_any_batch_is_windowed_exactly(
        models: dict[str, tuple[MusiCNN, list[str], FeatureSpec]]) -> None:
    """Windows cut on patch boundaries, their patch scores summed (``pooled_sum``/``classify``): the clip's
    logits equal the whole clip's, where the mean of the windows' logits would not (unequal windows)."""
    from specstore.infer.engine.windows import run_windowed, windowed_pooled_sum
    from specstore.infer.models.contract import exact_windows

    model = models[MUSICNN_MODELS[0]][0]
    assert exact_windows(model)
    frames = 7 * PATCH_FRAMES + 40
    x, whole = _long_clip(model, frames, seed=5)
    _, _, n_windows = windowed_pooled_sum(model, x, 3 * PATCH_FRAMES + 10)
    assert n_windows == 3  # 3 + 3 + 2 patches, no overlap (no context: a patch sees only itself)
    # (compared as scores: a tagger's logits are logit(mean score), ill-conditioned where a score nears 0 or 1)
    torch.testing.assert_close(torch.sigmoid(run_windowed(model, x, 3 * PATCH_FRAMES + 10)), torch.sigmoid(whole),
                               atol=1e-6, rtol=0)
    with torch.no_grad():
        sums, counts = model.pooled_sum(torch.from_numpy(x)[None, None], torch.tensor([frames]))
    torch.testing.assert_close(torch.sigmoid(model.classify(sums, counts))[0], torch.sigmoid(whole), atol=1e-6,
                               rtol=0)


def test_a_head_on_the_backbone_windows_a_long_clip_exactly() -> None:
    """A transfer head (``make train ARCH=musicnn``) sums the backbone's patch embeddings over the windows
    (``embedding_sum``): its logits for a clip too long for any batch equal the whole clip's."""
    from specstore.infer.engine.windows import run_windowed
    from specstore.infer.models.contract import exact_windows
    from specstore.infer.models.transfer import TransferClassifier

    model = TransferClassifier("musicnn-msd", n_classes=3, embedding_dim=EMBEDDING_DIM).eval()
    torch.nn.init.normal_(model.head.weight, std=0.05)
    assert exact_windows(model)
    x, whole = _long_clip(model, 5 * PATCH_FRAMES + 90, seed=6)
    torch.testing.assert_close(run_windowed(model, x, 2 * PATCH_FRAMES), whole, atol=1e-4, rtol=1e-4)

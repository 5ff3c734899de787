"""``specstore export``: the exported model's logits are the checkpoint's, masked, for any
batch size and length; the JSON sidecar says what a user needs; bad input is one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from factories import LABELS, SPEC16, make_checkpoint
from torch import Tensor, nn

from specstore.common import ConfigError
from specstore.infer.engine.export import ExportError, export_model, sidecar
from specstore.infer.models.checkpoint import CheckpointError, load_checkpoint, save_checkpoint

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:DeprecationWarning")

WINDOWED = {"pooling": "meanstd", "freq_pooling": "keep", "input_time_pool": 2, "stem_freq_kernel": 5,
            "stats_head": True, "pool_window": 16}
"""The recipe's model (mean+std pooling, frequency rows kept, input time pooling) with a statistics head and a
pooling window that does not divide the test batches' frames: every part that reads lengths or frame counts."""

ARCHITECTURES = {
    "cnn": {},
    "cnn-windowed-stats": WINDOWED,
    "resnet-attention": {"arch": "resnet", "pooling": "attention", "blocks_per_stage": 1},
    "cnn-no-time-pool": {"time_pool": False, "time_kernel": 5},
}

BATCHES = [([37, 64, 150], 150), ([1, 9, 203, 33, 120], 203), ([7], 7)]
"""Padded batches: 3 clips padded to 150 frames, then another batch size and length (not a multiple of any
stride), then a single short clip."""


def _checkpoint(path: Path, *, extra: dict | None = None, **config: object) -> Path:
    """A small checkpoint whose every weight is random (the statistics head's too, which starts at zero), so a
    masking mistake anywhere shows in the logits."""
    make_checkpoint(path, extra=extra, **config)
    ckpt = load_checkpoint(path)
    gen = torch.Generator().manual_seed(1)
    for name, t in ckpt.state_dict.items():
        if t.is_floating_point() and "running" not in name:
            t.copy_(torch.randn(t.shape, generator=gen) * 0.3)
    save_checkpoint(ckpt, path)
    return path


def _batch(lengths: list[int], frames: int, seed: int = 0) -> tuple[Tensor, Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(len(lengths), 1, SPEC16.n_bins, frames, generator=gen) * 12.0 - 45.0
    lens = torch.tensor(lengths)
    return x * (torch.arange(frames) < lens[:, None, None, None]), lens


def _assert_same_logits(run, model: nn.Module) -> None:  # type: ignore[no-untyped-def]
    """``run(x, lengths)`` (the export) equals the model on each padded batch and on each clip alone."""
    for k, (lengths, frames) in enumerate(BATCHES):
        x, lens = _batch(lengths, frames, seed=k)
        with torch.no_grad():
            expected = model(x.clone(), lens)
            alone = torch.cat([model(x[i:i + 1, ..., :n].clone(), lens[i:i + 1]) for i, n in enumerate(lengths)])
        got = run(x, lens)
        tol = 1e-5 * max(1.0, float(expected.abs().max()))
        assert got.shape == (len(lengths), len(LABELS))
        torch.testing.assert_close(got, expected, atol=tol, rtol=0)
        torch.testing.assert_close(got, alone, atol=tol, rtol=0)  # the padding changes nothing


@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_torchscript_logits_equal_the_checkpoints_for_any_batch_and_length(arch: str, tmp_path: Path) -> None:
    ckpt = _checkpoint(tmp_path / "m.pt", **ARCHITECTURES[arch])
    res = export_model(ckpt, format="torchscript")
    assert res.path == tmp_path / "m.torchscript.pt" and res.max_difference is not None
    scripted = torch.jit.load(str(res.path))
    model = load_checkpoint(ckpt).build()

    def run(x: Tensor, lengths: Tensor) -> Tensor:
        with torch.no_grad():
            return scripted(x.clone(), lengths)

    _assert_same_logits(run, model)


@pytest.mark.slow  # torch.export's symbolic trace and decompositions: 10-40 s on 2 cores, whatever the model
def test_onnx_logits_equal_the_checkpoints_for_any_batch_and_length(tmp_path: Path) -> None:
    """On the model with every length-reading part (the TorchScript test covers the other architectures; every
    export also checks itself against the checkpoint)."""
    pytest.importorskip("onnxscript")
    ort = pytest.importorskip("onnxruntime")
    ckpt = _checkpoint(tmp_path / "m.pt", **WINDOWED)
    res = export_model(ckpt, tmp_path / "out" / "genre.onnx")
    assert res.path.is_file() and res.sidecar == tmp_path / "out" / "genre.onnx.json"
    session = ort.InferenceSession(str(res.path), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["x", "lengths"]
    assert session.get_inputs()[0].shape[0] == session.get_inputs()[1].shape[0]  # one batch axis
    assert all(isinstance(d, str) for d in (session.get_inputs()[0].shape[0], session.get_inputs()[0].shape[3]))

    def run(x: Tensor, lengths: Tensor) -> Tensor:
        return torch.from_numpy(session.run(["logits"], {"x": x.numpy(), "lengths": lengths.numpy()})[0])

    _assert_same_logits(run, load_checkpoint(ckpt).build())


def test_the_sidecar_says_what_a_user_needs(tmp_path: Path) -> None:
    ckpt = _checkpoint(tmp_path / "m.pt", extra={"calibration": {"method": "temperature", "temperature": 1.7}})
    res = export_model(ckpt, tmp_path / "m.ts", format="torchscript")
    side = json.loads(res.sidecar.read_text(encoding="utf-8"))
    assert side["labels"] == LABELS and side["file"] == "m.ts" and side["format"] == "torchscript"
    assert side["inputs"]["x"]["shape"] == ["batch", 1, SPEC16.n_bins, "frames"]
    assert side["inputs"]["lengths"]["dtype"] == "int64"
    assert side["features"]["mel"]["hop_length"] == SPEC16.hop_length
    assert {k: v for k, v in side["features"]["mel"].items() if k in SPEC16.to_dict()} == SPEC16.to_dict()
    assert side["temperature"] == 1.7 and side["scores"] == "softmax(logits / 1.7)"
    assert side["specstore_version"]
    plain = sidecar(load_checkpoint(_checkpoint(tmp_path / "p.pt")), "onnx", "p.onnx")
    assert plain["temperature"] is None and plain["calibration"] == "uncalibrated"
    tags = sidecar(load_checkpoint(_checkpoint(tmp_path / "t.pt", extra={"outputs": "tags"})), "onnx", "t.onnx")
    assert tags["scores"].startswith("sigmoid")
    assert "temperature" not in tags and "calibration" not in tags  # independent scores: no temperature


class ReadsTheLengths(nn.Module):
    """A user model that crops to its longest clip with a Python int: a trace would fix that crop."""

    def __init__(self, n_bins: int, n_classes: int) -> None:
        super().__init__()
        self.proj = nn.Linear(n_bins, n_classes)

    def forward(self, x: Tensor, lengths: Tensor) -> Tensor:
        return self.proj(x[:, 0, :, :int(lengths.max())].mean(dim=-1) / 40.0)


def test_an_export_that_would_compute_other_logits_is_refused(tmp_path: Path) -> None:
    from specstore.infer.models.checkpoint import Checkpoint
    from specstore.infer.models.contract import spec_of

    sizes = {"n_bins": SPEC16.n_bins, "n_classes": len(LABELS)}
    ckpt = Checkpoint.from_model(ReadsTheLengths(**sizes), LABELS, "mel", SPEC16,
                                 model_spec=spec_of(ReadsTheLengths(**sizes), sizes))
    save_checkpoint(ckpt, tmp_path / "u.pt")
    with pytest.raises(ExportError, match="gives logits .* away from the checkpoint's") as e:
        export_model(tmp_path / "u.pt", format="torchscript", trust_model_code=True)
    assert "\n" not in str(e.value) and not (tmp_path / "u.torchscript.pt").exists()
    from user_models import PoolsOverPadding

    ckpt = Checkpoint.from_model(PoolsOverPadding(**sizes), LABELS, "mel", SPEC16,
                                 model_spec=spec_of(PoolsOverPadding(**sizes), sizes))
    save_checkpoint(ckpt, tmp_path / "p.pt")
    with pytest.raises(ExportError, match="user_models:PoolsOverPadding .* does not mask its padding"):
        export_model(tmp_path / "p.pt", format="torchscript", trust_model_code=True)


def test_the_command_writes_the_file_and_bad_input_is_one_line(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    from specstore.serving.cli import main

    ckpt = _checkpoint(tmp_path / "m.pt")
    assert main(["export", str(ckpt), "--format", "torchscript"]) == 0
    assert (tmp_path / "m.torchscript.pt").is_file() and (tmp_path / "m.torchscript.pt.json").is_file()
    assert "m.torchscript.pt" in capsys.readouterr().err
    (tmp_path / "junk.pt").write_text("hi, not a checkpoint", encoding="utf-8")
    for argv, said in [([str(tmp_path / "none.pt")], "no checkpoint at"),
                       ([str(tmp_path / "junk.pt")], "is not a readable checkpoint"),
                       ([str(ckpt), "--out", str(ckpt)], "would overwrite the checkpoint")]:
        assert main(["export", *argv, "--format", "torchscript"]) == 2
        err = capsys.readouterr().err
        assert said in err and err.count("\n") == 1, err
    with pytest.raises(SystemExit) as stop:
        main(["export", str(ckpt), "--format", "tflite"])
    assert stop.value.code == 2 and "invalid choice: 'tflite'" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="unknown export format 'tflite'"):
        export_model(ckpt, format="tflite")
    with pytest.raises(CheckpointError, match="no checkpoint at"):
        export_model(tmp_path / "none.pt")


def test_a_shipped_model_exports_by_its_name_into_the_working_folder(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """``specstore export NAME`` takes a shipped model's name as classify does; the file goes to the working
    folder (never into the package), and a tagger's sidecar says sigmoid and carries no temperature."""
    import shipped_stub

    from specstore.serving.cli import main

    monkeypatch.chdir(tmp_path)
    with shipped_stub.registered() as name:
        assert main(["export", name, "--format", "torchscript"]) == 0
        side = json.loads((tmp_path / f"{name}.torchscript.pt.json").read_text(encoding="utf-8"))
        model, tags, _ = shipped_stub.load(name)
    assert side["labels"] == tags and side["scores"].startswith("sigmoid") and "temperature" not in side
    scripted = torch.jit.load(str(tmp_path / f"{name}.torchscript.pt"))
    x, lens = _batch([20, 64], 64)
    with torch.no_grad():
        torch.testing.assert_close(scripted(x.clone(), lens), model(x.clone(), lens), atol=1e-5, rtol=0)

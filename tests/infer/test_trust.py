"""A model file runs no code it was not trusted to run (infer/models/trust.py).

The model module used here writes a marker file when it is imported: if the
marker exists, code named by a checkpoint or a config file ran.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from factories import LABELS, SPEC16, make_separable_store

from specstore.infer.cli import main as infer_main
from specstore.infer.engine.predict import predict
from specstore.infer.evaluation.evaluate import evaluate
from specstore.infer.models.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from specstore.infer.models.contract import ModelSpec
from specstore.infer.models.trust import TRUST_ENV, UntrustedModelError, is_trusted
from specstore.infer.train import TrainConfig, train

ROOT = Path(__file__).resolve().parents[2]

MODULE = '''\
"""A model module that leaves a marker when imported (its top-level code runs)."""
from pathlib import Path

Path(__file__).with_name("MARKER").write_text("imported")

import torch
from torch import nn


class Net(nn.Module):
    def __init__(self, n_bins: int = 16, n_classes: int = 3) -> None:
        super().__init__()
        self.head = nn.Linear(n_bins, n_classes)

    def forward(self, x, lengths):
        keep = (torch.arange(x.shape[-1])[None, :] < lengths[:, None]).to(x.dtype)
        pooled = (x[:, 0] * keep[:, None, :]).sum(-1) / lengths[:, None].to(x.dtype)
        return self.head(pooled / 40.0)
'''


@pytest.fixture
def marked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, Path]:
    """A fresh importable module (unique name) that writes ``MARKER`` beside itself on import."""
    name = f"marked_{uuid.uuid4().hex[:8]}"
    folder = tmp_path / "code"
    folder.mkdir()
    (folder / f"{name}.py").write_text(MODULE, encoding="utf-8")
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.delenv(TRUST_ENV, raising=False)
    return name, folder / "MARKER"


def _checkpoint(path: Path, module: str) -> Path:
    """A checkpoint whose model is ``module:Net`` (written without importing the module)."""
    import torch

    state = {"head.weight": torch.zeros(3, 16), "head.bias": torch.zeros(3)}
    save_checkpoint(Checkpoint(ModelSpec(f"{module}:Net", {"n_bins": 16, "n_classes": 3}), list(LABELS), "mel",
                               {"mel": SPEC16}, state), path)
    return path


@pytest.mark.slow  # a fresh interpreter: a few seconds
def test_a_checkpoint_naming_a_module_is_refused_on_the_command_line(tmp_path: Path,
                                                                     marked: tuple[str, Path]) -> None:
    module, marker = marked
    store = make_separable_store(tmp_path / "s.zarr", n=6)
    ckpt = _checkpoint(tmp_path / "m.pt", module)
    proc = subprocess.run([sys.executable, "-m", "specstore", "infer", str(store), str(ckpt), "--out",
                           str(tmp_path / "p.csv"), "--no-progress"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={**_env(), "PYTHONPATH": f"{marker.parent}:{ROOT}"}, check=False)
    assert proc.returncode == 2, proc.stderr
    err = proc.stderr.strip()
    assert len(err.splitlines()) == 1 and err.startswith("specstore: error: ") and "--trust-model-code" in err
    assert not marker.exists() and not (tmp_path / "p.csv").exists()


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k != TRUST_ENV}


def test_every_way_to_load_a_checkpoint_refuses_untrusted_code(tmp_path: Path, marked: tuple[str, Path],
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    module, marker = marked
    store = make_separable_store(tmp_path / "s.zarr", n=6)
    ckpt = _checkpoint(tmp_path / "m.pt", module)
    with pytest.raises(UntrustedModelError, match="--trust-model-code"):
        load_checkpoint(ckpt).build()
    with pytest.raises(UntrustedModelError, match="trust_model_code=True"):
        ModelSpec(f"{module}:Net").build()
    with pytest.raises(UntrustedModelError):
        predict(store, ckpt, device="cpu", progress=False)
    with pytest.raises(UntrustedModelError):
        evaluate(store, ckpt, device="cpu", progress=False, split="all")
    for argv in (["predict", str(store), str(ckpt), "--out", str(tmp_path / "p.csv")],
                 ["eval", str(store), str(ckpt), "--out-dir", str(tmp_path / "r")],
                 ["plan", str(store), "--model", str(ckpt)]):
        assert infer_main([*argv, "--no-progress"]) == 2, argv
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "--trust-model-code" in err and str(ckpt) in err, err
    from specstore.pipeline.testing import write_music_like
    from specstore.serving.cli import main as specstore_main
    from specstore.serving.model import Classifier

    with pytest.raises(UntrustedModelError):
        Classifier(ckpt)
    audio = write_music_like(tmp_path / "a.wav", 1.0)
    assert specstore_main(["classify", str(audio), "--model", str(ckpt), "--device", "cpu", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--trust-model-code" in err, err
    assert not marker.exists()
    # trusted: by the flag
    assert infer_main(["predict", str(store), str(ckpt), "--out", str(tmp_path / "p.csv"), "--no-progress",
                       "--trust-model-code"]) == 0
    assert marker.exists()
    assert specstore_main(["classify", str(audio), "--model", str(ckpt), "--device", "cpu", "--no-progress",
                           "--json", "--trust-model-code"]) == 0
    assert '"top"' in capsys.readouterr().out


def test_the_allow_list_trusts_modules_and_packages(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                    marked: tuple[str, Path]) -> None:
    monkeypatch.setenv(TRUST_ENV, " mypkg , other.models")
    assert is_trusted("mypkg:Net") and is_trusted("mypkg.models.deep:Net") and is_trusted("other.models:Net")
    assert not is_trusted("mypkgx:Net") and not is_trusted("other:Net") and not is_trusted("other.modelsx:Net")
    assert is_trusted("x:Net", True) and is_trusted("x.y:Net", ["x"]) and is_trusted("x:Net", ["x:Net"])
    assert not is_trusted("x:Other", ["x:Net"])
    module, marker = marked
    store = make_separable_store(tmp_path / "s.zarr", n=6)
    ckpt = _checkpoint(tmp_path / "m.pt", module)
    monkeypatch.setenv(TRUST_ENV, module)
    assert predict(store, ckpt, device="cpu", progress=False).probs.shape == (6, 3)
    assert marker.exists()


def test_training_trusts_what_the_user_names_not_what_a_file_names(tmp_path: Path, marked: tuple[str, Path],
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    module, marker = marked
    store = make_separable_store(tmp_path / "s.zarr", n=12)
    config = tmp_path / "c.toml"
    config.write_text(f'arch = "{module}:Net"\nepochs = 1\ndevice = "cpu"\n', encoding="utf-8")
    assert infer_main(["train", str(store), str(tmp_path / "m.pt"), "--config", str(config), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert "the training config" in err and "--trust-model-code" in err and len(err.splitlines()) == 1
    with pytest.raises(UntrustedModelError):
        train(store, tmp_path / "m.pt", TrainConfig.from_file(config), progress=False)
    assert not marker.exists() and not (tmp_path / "m.pt").exists()
    # the same run with the flag, or with the import path named on the command line
    assert infer_main(["train", str(store), str(tmp_path / "m.pt"), "--config", str(config), "--no-progress",
                       "--trust-model-code"]) == 0
    assert marker.exists()
    assert infer_main(["train", str(store), str(tmp_path / "n.pt"), "--arch", f"{module}:Net", "--epochs", "1",
                       "--device", "cpu", "--crop-seconds", "0", "--no-progress"]) == 0
    # a run's MODEL.config.json is a config file too (its train_config), and names the same code
    assert infer_main(["train", str(store), str(tmp_path / "o.pt"), "--config", str(tmp_path / "n.config.json"),
                       "--no-progress"]) == 2
    assert "--trust-model-code" in capsys.readouterr().err


def test_a_model_module_that_cannot_be_imported_names_the_fix(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from specstore.common import ConfigError
    from specstore.infer.models.contract import resolve_class

    with pytest.raises(ConfigError) as missing:
        resolve_class("yourmodule_nowhere:YourNet", True)
    text = str(missing.value)
    assert "no module 'yourmodule_nowhere'" in text and "PYTHONPATH" in text and "pip install" in text
    assert "\n" not in text
    # a module that is there but fails inside (a dependency missing) says that instead
    name = f"broken_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text("import a_dependency_nobody_has\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match="No module named 'a_dependency_nobody_has'") as broken:
        resolve_class(f"{name}:Net", [name])
    assert "PYTHONPATH" not in str(broken.value)

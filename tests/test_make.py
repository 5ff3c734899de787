"""The Make targets pass an option only when its variable is set, and ARGS to every command (issues 21, 23)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from factories import make_separable_store

from infer.checkpoint import load_checkpoint

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def dry(*args: str, venv: str = "/nonexistent") -> list[str]:
    """The command a target would run (``make -n``), as argv words."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MAKEFLAGS", "MFLAGS", "MAKELEVEL"))}
    proc = subprocess.run(["make", "-n", "--no-print-directory", "-C", str(ROOT), *args, f"VENV={venv}"],
                          capture_output=True, text=True, timeout=60, env=env, check=False)
    assert proc.returncode == 0, proc.stderr
    line = next(x for x in proc.stdout.splitlines() if x.startswith(f"{venv}/bin/python -m "))
    return shlex.split(line)


@pytest.mark.parametrize(("target", "command"), [
    ("train", ["-m", "infer", "train", "s.zarr", "m.pt"]),
    ("infer", ["-m", "infer", "predict", "s.zarr", "m.pt"]),
    ("eval", ["-m", "infer", "eval", "s.zarr", "m.pt"]),
    ("plan", ["-m", "infer", "plan", "s.zarr"]),
    ("init-model", ["-m", "infer", "init", "s.zarr", "m.pt"]),
    ("features", ["-m", "pipeline.cli", "corpus", "s.zarr"]),
])
def test_nothing_is_passed_that_was_not_set(target: str, command: list[str]) -> None:
    assert dry(target, "STORE=s.zarr", "MODEL=m.pt", "CORPUS=corpus")[1:] == command
    assert dry(target, "STORE=s.zarr", "MODEL=m.pt", "CORPUS=corpus", "ARGS=--help -v")[-2:] == ["--help", "-v"]


def test_a_config_file_is_not_overridden() -> None:
    argv = dry("train", "STORE=s.zarr", "MODEL=m.pt", "CONFIG=c.toml")
    assert argv[1:] == ["-m", "infer", "train", "s.zarr", "m.pt", "--config", "c.toml"]
    argv = dry("train", "STORE=s.zarr", "MODEL=m.pt", "CONFIG=c.toml", "MAX_BATCH=8", "DEVICE=cpu")
    assert argv[-4:] == ["--device", "cpu", "--max-batch", "8"]


def test_values_are_quoted_for_the_shell() -> None:
    argv = dry("train", "STORE=my store.zarr", "MODEL=it's.pt", "ARCH=yourmodule:YourNet",
               'MODEL_ARGS={"width": 16, "name": "a b"}')
    assert argv[4:6] == ["my store.zarr", "it's.pt"]
    assert json.loads(argv[argv.index("--model-args") + 1]) == {"width": 16, "name": "a b"}
    argv = dry("features", "CORPUS=~/music/more", "STORE=s.zarr", "ARGS=--add-corpus --n-mels 64", "JOBS=2")
    assert argv[-5:] == ["--jobs", "2", "--add-corpus", "--n-mels", "64"]
    assert "--trust-model-code" in dry("infer", "STORE=s.zarr", "MODEL=m.pt", "TRUST_MODEL_CODE=1")


@pytest.mark.slow  # a real training run through make: a few seconds
def test_a_toml_max_batch_is_what_make_train_uses(tmp_path: Path) -> None:
    venv = ROOT / ".venv"
    if not (venv / "bin" / "python").exists():
        pytest.skip("needs `make install` (.venv)")
    store = make_separable_store(tmp_path / "s.zarr", n=24)
    config = tmp_path / "c.toml"
    config.write_text('max_batch = 4\nepochs = 1\nwidth = 4\ndepth = 2\ndevice = "cpu"\n', encoding="utf-8")
    model = tmp_path / "m.pt"
    argv = dry("train", f"STORE={store}", f"MODEL={model}", f"CONFIG={config}", venv=str(venv))
    assert not {"--max-batch", "--device", "--precision"} & set(argv)
    proc = subprocess.run([*argv, "--no-progress"], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    resolved = json.loads(model.with_name("m.config.json").read_text())["train_config"]
    assert resolved["max_batch"] == 4
    extra = load_checkpoint(model).extra
    assert extra["history"][0]["batches"] >= -(-extra["n_train"] // 4)  # no batch held more than 4 clips

"""The Make targets pass an option only when its variable is set, and ARGS to every command (issues 21, 23)."""

from __future__ import annotations

import json
import os
import re
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


# Every yes/no variable, the target that passes it and the flag it passes (issue 30, finding 1).
BOOLEANS = {"TRUST_MODEL_CODE": ("infer", "--trust-model-code"), "OVERWRITE": ("train", "--overwrite"),
            "BASELINES": ("eval", "--baselines"), "QUICK": ("bench", "--quick")}
ON = ["1", "yes", "true", "on", "YES", "True", "On", " 1 "]
OFF = ["0", "no", "false", "off", "NO", "False", "OFF", ""]


def _make(*args: str, env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("MAKEFLAGS", "MFLAGS", "MAKELEVEL")) and k not in BOOLEANS}
    env.update(env_extra or {})
    return subprocess.run(["make", "-n", "--no-print-directory", "-C", str(ROOT), *args, "VENV=/nonexistent"],
                          capture_output=True, text=True, timeout=60, env=env, check=False)


def test_every_yes_no_variable_of_the_makefile_is_tested() -> None:
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    listed = re.search(r"^BOOLEANS\s*:=(.*)$", text, re.M)
    assert listed is not None and set(listed.group(1).split()) == set(BOOLEANS)
    used = set(re.findall(r"\$\(call flag,(\w+),", text))
    assert used == set(BOOLEANS)
    # no variable is turned into a bare flag by being merely non-empty (the pattern that made "0" mean on)
    assert not re.findall(r"\$\(if \$\((\w+)\),--[\w-]+\)", text)


@pytest.mark.parametrize("spelling", ON + OFF)
@pytest.mark.parametrize("name", sorted(BOOLEANS))
def test_a_yes_no_variable_means_what_it_says(name: str, spelling: str) -> None:
    target, flag = BOOLEANS[name]
    on = spelling.strip().lower() in ("1", "yes", "true", "on")
    argv = dry(target, "STORE=s.zarr", "MODEL=m.pt", f"{name}={spelling}")
    assert (flag in argv) is on
    # make also reads the variable from the environment: the same rule holds there
    proc = _make(target, "STORE=s.zarr", "MODEL=m.pt", env_extra={name: spelling})
    assert proc.returncode == 0, proc.stderr
    assert (flag in proc.stdout.split()) is on


@pytest.mark.parametrize("value", ["maybe", "2", "yes please", "-1", "nope"])
@pytest.mark.parametrize("name", sorted(BOOLEANS))
def test_any_other_value_is_refused_in_one_line_before_anything_runs(name: str, value: str) -> None:
    target, _ = BOOLEANS[name]
    proc = _make(target, "STORE=s.zarr", "MODEL=m.pt", f"{name}={value}")
    assert proc.returncode != 0
    assert "/nonexistent/bin/python" not in proc.stdout  # nothing would have run
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and f"{name}={value} is not a yes/no value" in lines[0]
    assert all(w in lines[0] for w in ("1, yes, true or on", "0, no, false or off"))

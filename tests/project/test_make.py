"""The Make targets pass an option only when its variable is set, and ARGS to every command."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from factories import make_separable_store

from specstore.infer.models.checkpoint import load_checkpoint

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")

NO_PROBE = "TORCH_PIP=torch"
"""A dry run with a .venv to build probes pip and the GPU for the torch build (a second each): targets other than
install are tested without it."""


def dry(*args: str, venv: str = "/nonexistent") -> list[str]:
    """The command a target would run (``make -n``), as argv words."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MAKEFLAGS", "MFLAGS", "MAKELEVEL"))}
    proc = subprocess.run(["make", "-n", "--no-print-directory", "-C", str(ROOT), *args, f"VENV={venv}", NO_PROBE],
                          capture_output=True, text=True, timeout=60, env=env, check=False)
    assert proc.returncode == 0, proc.stderr
    line = next(x for x in proc.stdout.splitlines() if x.startswith(f"{venv}/bin/python -m "))
    return shlex.split(line)


@pytest.mark.parametrize(("target", "command"), [
    ("train", ["-m", "specstore", "train", "s.zarr", "m.pt"]),
    ("infer", ["-m", "specstore", "infer", "s.zarr", "m.pt"]),
    ("eval", ["-m", "specstore", "eval", "s.zarr", "m.pt"]),
    ("plan", ["-m", "specstore", "plan", "s.zarr"]),
    ("init-model", ["-m", "specstore", "init-model", "s.zarr", "m.pt"]),
    ("features", ["-m", "specstore", "features", "corpus", "s.zarr"]),
])
def test_nothing_is_passed_that_was_not_set(target: str, command: list[str]) -> None:
    assert dry(target, "STORE=s.zarr", "MODEL=m.pt", "CORPUS=corpus")[1:] == command
    assert dry(target, "STORE=s.zarr", "MODEL=m.pt", "CORPUS=corpus", "ARGS=--help -v")[-2:] == ["--help", "-v"]


def test_a_config_file_is_not_overridden() -> None:
    argv = dry("train", "STORE=s.zarr", "MODEL=m.pt", "CONFIG=c.toml")
    assert argv[1:] == ["-m", "specstore", "train", "s.zarr", "m.pt", "--config", "c.toml"]
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


# Every yes/no variable, the target that passes it and the flag it passes.
BOOLEANS = {"TRUST_MODEL_CODE": ("infer", "--trust-model-code"), "OVERWRITE": ("train", "--overwrite"),
            "BASELINES": ("eval", "--baselines"), "QUICK": ("bench", "--quick"), "RESTART": ("infer", "--restart")}
ON = ["1", "yes", "true", "on", "YES", "True", "On", " 1 "]
OFF = ["0", "no", "false", "off", "NO", "False", "OFF", ""]


def _make(*args: str, env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("MAKEFLAGS", "MFLAGS", "MAKELEVEL")) and k not in BOOLEANS}
    env.update(env_extra or {})
    return subprocess.run(["make", "-n", "--no-print-directory", "-C", str(ROOT), *args, "VENV=/nonexistent",
                           NO_PROBE], capture_output=True, text=True, timeout=60, env=env, check=False)


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


# -- the torch build make install chooses ----------------------------------------------------------------------
def _fake_wheel(folder: Path, version: str) -> None:
    """A minimal wheel of "torch" ``version`` (py3-none-any) that pip's resolver accepts as a candidate."""
    import zipfile

    folder.mkdir(parents=True, exist_ok=True)
    info = f"torch-{version}.dist-info"
    with zipfile.ZipFile(folder / f"torch-{version}-py3-none-any.whl", "w") as z:
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")


def _fake_nvidia_smi(folder: Path, gpu: bool) -> Path:
    """An ``nvidia-smi`` that lists one GPU (``gpu``) or fails as it does on a machine with no driver."""
    folder.mkdir(parents=True, exist_ok=True)
    tool = folder / "nvidia-smi"
    tool.write_text("#!/bin/sh\n" + ('echo "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)"\n' if gpu else
                                     'echo "NVIDIA-SMI has failed" >&2; exit 9\n'))
    tool.chmod(0o755)
    return tool


def _torch_install(tmp_path: Path, *, local_wheel: bool, gpu: bool, torch: str = "") -> str:
    """The pip command ``make -n install`` shows for torch, with pip's configuration limited to a find-links
    folder of our own (holding a CPU wheel or not) and no index contacted."""
    links = tmp_path / "links"
    links.mkdir(exist_ok=True)
    if local_wheel:
        _fake_wheel(links, "2.13.0+cpu")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "PIP_", "TORCH"))}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_FIND_LINKS=str(links), PIP_NO_INDEX="1")
    smi = _fake_nvidia_smi(tmp_path / "bin", gpu)
    args = ["make", "-n", "--no-print-directory", "-C", str(ROOT), "install", f"VENV={tmp_path / 'venv'}",
            f"PYTHON={sys.executable}", f"NVIDIA_SMI={smi}", *([f"TORCH={torch}"] if torch else [])]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=120, env=env, check=False)
    assert proc.returncode == 0, proc.stderr
    lines = [x for x in proc.stdout.splitlines() if "pip install" in x and "'torch=" in x]
    assert len(lines) == 1, proc.stdout
    return lines[0]


CPU_INDEX = "--extra-index-url https://download.pytorch.org/whl/cpu 'torch==2.13.0+cpu'"


@pytest.mark.parametrize("gpu", [False, True])
def test_install_takes_the_cpu_wheel_pip_already_offers_and_asks_no_other_index(tmp_path: Path, gpu: bool) -> None:
    line = _torch_install(tmp_path, local_wheel=True, gpu=gpu)
    assert line.endswith("pip install --quiet 'torch==2.13.0+cpu'")  # the pin the local wheel satisfies
    assert "download.pytorch.org" not in line


def test_install_without_a_local_wheel_or_a_gpu_takes_the_cpu_index(tmp_path: Path) -> None:
    assert _torch_install(tmp_path, local_wheel=False, gpu=False).endswith(CPU_INDEX)


def test_install_with_a_gpu_takes_the_registrys_cuda_build(tmp_path: Path) -> None:
    # === is exact: a CPU wheel 2.13.0+cpu that pip's configuration might offer cannot stand in for it
    assert _torch_install(tmp_path, local_wheel=False, gpu=True).endswith("pip install --quiet 'torch===2.13.0'")


def test_torch_variable_overrides_the_choice(tmp_path: Path) -> None:
    assert _torch_install(tmp_path, local_wheel=False, gpu=True, torch="cpu").endswith(CPU_INDEX)
    assert _torch_install(tmp_path, local_wheel=True, gpu=True, torch="cpu").endswith("'torch==2.13.0+cpu'")
    assert _torch_install(tmp_path, local_wheel=True, gpu=False, torch="cuda").endswith("'torch===2.13.0'")


def test_an_unknown_torch_build_is_one_line_before_anything_runs() -> None:
    proc = subprocess.run(["make", "-n", "--no-print-directory", "-C", str(ROOT), "install", "VENV=/nonexistent",
                           "TORCH=rocm"], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode != 0 and "/nonexistent" not in proc.stdout
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "TORCH=rocm is not a torch build: use cpu or cuda" in lines[0]


def test_readme_says_which_torch_build_install_picks() -> None:
    text = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    for said in ("TORCH=cpu", "TORCH=cuda", "download.pytorch.org/whl/cpu", "nvidia-smi"):
        assert said in text, said

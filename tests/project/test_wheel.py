"""The wheel installs one package, ``specstore``, and works from a folder that shadows the old bare names.

The slow test builds a wheel from a clean clone of HEAD (no network: ``--no-build-isolation``, ``--no-index``),
installs it with ``--no-deps`` into a fresh venv whose dependencies come from this project's site-packages through a
``.pth`` path line (a path line adds the directory but runs none of the ``.pth`` files in it, so the project's
editable-install finder is not active there), and runs it from a folder holding ``store.py``, ``pipeline.py`` and
``infer.py`` that raise when imported.  The fast tests import every module of the checkout's ``specstore`` in a
clean interpreter.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import zipfile
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
BARE = ("store", "pipeline", "infer", "serving", "democorpus", "realcorpus")
"""The repository's folders: importable only as ``specstore.<name>``, never under their bare names."""
HEAVY = ("torch", "librosa", "zarr")
"""What ``import specstore`` must not load (its face is lazy)."""
SHADOWS = ("store", "pipeline", "infer", "serving")
"""The user's own modules in the working folder: the issue's three, and ``serving.py``, another old bare name."""
PACKAGE_DATA = (
    "specstore/store/FORMAT.md",
    "specstore/serving/page.html",
    "specstore/infer/models/pretrained/musicnn/models.json",
    "specstore/infer/models/pretrained/musicnn/msd.npz",
    "specstore/infer/models/pretrained/musicnn/mtt.npz",
    "specstore/infer/models/pretrained/musicnn/LICENSE.md",
    "specstore/infer/models/pretrained/musicnn/ATTRIBUTION.md",
)


def _clean_env() -> dict[str, str]:
    """The environment without the caller's PYTHON* settings (PYTHONPATH would put the checkout back on the path)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PIP_", "VIRTUAL_ENV"))}
    env.update(PYTHONNOUSERSITE="1", PYTHONDONTWRITEBYTECODE="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    return env


def _run(args: list[str | Path], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run ``args`` in ``cwd``; a non-zero exit fails the test with the command's output."""
    proc = subprocess.run([str(a) for a in args], cwd=cwd, env=_clean_env(), capture_output=True, text=True,
                          timeout=timeout, check=False)
    assert proc.returncode == 0, f"{args} exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def _json_from(script: str, python: str | Path, cwd: Path, isolated: bool = True) -> dict[str, Any]:
    """What ``script`` prints as its last line, read as JSON; ``isolated``: run by ``python -I`` (neither the
    working folder nor PYTHONPATH on sys.path)."""
    out = _run([python, *(["-I"] if isolated else []), "-c", textwrap.dedent(script)], cwd).stdout
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


# --- in the checkout: fast ---------------------------------------------------------------------------------------

IMPORT_ALL = """
    import importlib, json, pkgutil, sys
    sys.path.insert(0, {root!r})  # the checkout itself (as pytest's rootdir is): its bare folders are on the path
    import specstore
    heavy = sorted({{m.split(".")[0] for m in sys.modules}} & set({heavy!r}))
    errors, names = [], []
    for info in pkgutil.walk_packages(specstore.__path__, "specstore.", onerror=lambda name: errors.append(name)):
        if info.name.rsplit(".", 1)[-1] == "__main__":  # runs its command on import; what it imports is walked
            continue
        names.append(info.name)
        try:
            importlib.import_module(info.name)
        except BaseException as e:
            errors.append(f"{{info.name}}: {{type(e).__name__}}: {{e}}")
    bare = sorted(m for m in sys.modules if m.split(".")[0] in {bare!r})
    print(json.dumps({{"file": specstore.__file__, "heavy": heavy, "names": names, "errors": errors, "bare": bare}}))
"""


def test_importing_all_of_specstore_loads_no_bare_name(tmp_path: Path) -> None:
    """Every module of ``specstore`` (walked with pkgutil through the links) imports, in a clean interpreter, and
    none is loaded a second time under a bare name (``store``, ``infer``, ...)."""
    got = _json_from(IMPORT_ALL.format(root=str(ROOT), heavy=HEAVY, bare=BARE), sys.executable, tmp_path)
    assert Path(str(got["file"])).resolve() == ROOT / "specstore" / "__init__.py"
    names = set(got["names"])
    assert {f"specstore.{name}" for name in BARE} <= names
    assert {"specstore.cli", "specstore.infer.models.shipped", "specstore.serving.app"} <= names
    assert got["errors"] == []
    assert got["bare"] == []


def test_import_specstore_loads_no_torch_librosa_or_zarr(tmp_path: Path) -> None:
    script = f"""
        import json, sys
        sys.path.insert(0, {str(ROOT)!r})
        import specstore
        loaded = {{m.split(".")[0] for m in sys.modules}}
        print(json.dumps({{"heavy": sorted(loaded & set({HEAVY!r})), "bare": sorted(loaded & set({BARE!r}))}}))
    """
    assert _json_from(script, sys.executable, tmp_path) == {"heavy": [], "bare": []}


# --- from a wheel: slow ------------------------------------------------------------------------------------------

INSTALLED = """
    import json, sys
    import specstore
    after_face = sorted({{m.split(".")[0] for m in sys.modules}} & set({heavy!r}))
    import specstore.store, specstore.infer, specstore.pipeline, specstore.serving
    bare = sorted(m for m in sys.modules if m.split(".")[0] in {bare!r})
    import importlib, pkgutil
    errors = []
    for info in pkgutil.walk_packages(specstore.__path__, "specstore.", onerror=lambda name: errors.append(name)):
        if info.name.rsplit(".", 1)[-1] != "__main__":
            try:
                importlib.import_module(info.name)
            except BaseException as e:
                errors.append(f"{{info.name}}: {{type(e).__name__}}: {{e}}")
    bare_after_all = sorted(m for m in sys.modules if m.split(".")[0] in {bare!r})
    from importlib import resources
    page = resources.files("specstore.serving").joinpath("page.html")
    fmt = resources.files("specstore.store").joinpath("FORMAT.md")
    from specstore.infer.models.pretrained import PRETRAINED_DIR
    from specstore.infer.models.shipped import load_shipped
    ckpt = load_shipped("musicnn-msd")
    print(json.dumps({{
        "file": specstore.__file__,
        "after_face": after_face,
        "bare": bare,
        "errors": errors,
        "bare_after_all": bare_after_all,
        "editable_finders": sorted(m for m in sys.modules if m.startswith("__editable__")),
        "specstore_files": sorted({{str(getattr(m, "__file__", None) or "") for name, m in list(sys.modules.items())
                                    if name == "specstore" or name.startswith("specstore.")}}),
        "page": [str(page), "<html" in page.read_text(encoding="utf-8").lower()],
        "format": [str(fmt), fmt.is_file()],
        "pretrained": str(PRETRAINED_DIR),
        "labels": len(ckpt.label_names),
        "outputs": ckpt.outputs,
        "tensors": len(ckpt.state_dict),
    }}))
"""


def _site_packages(python: Path) -> Path:
    out = _run([python, "-I", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], python.parent)
    return Path(out.stdout.strip())


@pytest.mark.slow
def test_the_wheel_installs_one_package_that_works_beside_shadowing_files(tmp_path: Path) -> None:
    git = shutil.which("git")
    if git is None:
        pytest.skip("git is not installed: the wheel is built from a clean clone of the repository")

    # a clean clone of HEAD: what is committed, not what lies in the working tree
    src = tmp_path / "src"
    _run([git, "clone", "--quiet", ROOT, src], tmp_path)
    dist = tmp_path / "dist"
    _run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
          "--wheel-dir", dist, src], tmp_path, timeout=300)
    wheels = sorted(dist.glob("specstore-*.whl"))
    assert len(wheels) == 1, sorted(p.name for p in dist.iterdir())
    wheel = wheels[0]

    with zipfile.ZipFile(wheel) as zf:
        members = zf.namelist()
        dist_info = {m.split("/")[0] for m in members if m.split("/")[0].endswith(".dist-info")}
        assert len(dist_info) == 1, dist_info
        top_level = zf.read(f"{dist_info.pop()}/top_level.txt").decode().split()
    roots = {m.split("/")[0] for m in members if not m.split("/")[0].endswith(".dist-info")}
    assert roots == {"specstore"}, roots
    assert top_level == ["specstore"], top_level
    assert not set(PACKAGE_DATA) - set(members), sorted(set(PACKAGE_DATA) - set(members))
    # every module of the repository's folders is in the wheel (a folder without __init__.py would be left out)
    committed = {f"specstore/{p.relative_to(src).as_posix()}" for name in BARE for p in (src / name).rglob("*.py")}
    assert not committed - set(members), sorted(committed - set(members))

    # a fresh environment: the wheel, and the project's dependencies through a path line (no editable finder)
    env = tmp_path / "env"
    _run([sys.executable, "-m", "venv", "--without-pip", env], tmp_path)
    python = env / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", python, "install", "--quiet", "--no-deps", "--no-index", wheel],
         tmp_path)
    site = _site_packages(python)
    installed = {p.name for p in site.iterdir()}
    assert {p for p in installed if not p.endswith(".dist-info")} == {"specstore"}, installed
    deps = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
    (site / "project_dependencies.pth").write_text("".join(f"{d}\n" for d in deps), encoding="utf-8")

    # the working folder holds the user's own store.py, pipeline.py and infer.py, each failing when imported
    work = tmp_path / "work"
    work.mkdir()
    for name in SHADOWS:
        (work / f"{name}.py").write_text(f"raise RuntimeError('the user\\'s own {name}.py was imported')\n",
                                         encoding="utf-8")
    shadowed = subprocess.run([str(python), "-c", "import store"], cwd=work, env=_clean_env(), capture_output=True,
                              text=True, timeout=60, check=False)
    assert shadowed.returncode != 0 and "the user's own store.py" in shadowed.stderr  # the shadows do bite

    # without -I: `python -c` puts the working folder first on sys.path, as a notebook's kernel does
    got = _json_from(INSTALLED.format(heavy=HEAVY, bare=BARE), python, work, isolated=False)
    assert Path(got["file"]) == site / "specstore" / "__init__.py", got["file"]  # the installed copy, not ROOT
    assert got["editable_finders"] == []
    assert got["specstore_files"] and all(f.startswith(str(site) + os.sep) for f in got["specstore_files"]), \
        [f for f in got["specstore_files"] if not f.startswith(str(site) + os.sep)]
    assert got["after_face"] == [], got["after_face"]
    assert got["bare"] == [], got["bare"]
    assert got["errors"] == [], got["errors"]  # every installed module imports beside the shadows
    assert got["bare_after_all"] == [], got["bare_after_all"]
    assert got["page"] == [str(site / "specstore" / "serving" / "page.html"), True]
    assert got["format"] == [str(site / "specstore" / "store" / "FORMAT.md"), True]
    assert got["pretrained"] == str(site / "specstore" / "infer" / "models" / "pretrained" / "musicnn")
    assert (got["labels"], got["outputs"]) == (50, "tags")
    assert got["tensors"] > 0

    # the installed commands, from the same folder
    verbs = _run([env / "bin" / "specstore", "--help"], work).stdout
    assert verbs.startswith("usage: specstore VERB") and "classify" in verbs
    assert _run([python, "-m", "specstore", "--help"], work).stdout == verbs
    tags = _run([env / "bin" / "specstore", "classify", "--list-tags", "--model", "musicnn-msd"], work)
    assert len(tags.stdout.split("\n")) >= 50 and "rock" in tags.stdout.split("\n"), tags.stdout
    assert "# musicnn-msd: 50 tags" in tags.stderr, tags.stderr


def test_a_copy_of_the_repository_without_its_links_still_imports(tmp_path: Path) -> None:
    """A copy that dropped ``specstore/``'s links (an archive, a file-only copy, as a GPU machine may get) finds the
    folders beside ``specstore/``: ``make gpu-check`` runs from such a checkout, not installed."""
    copy = tmp_path / "repo"
    (copy / "specstore").mkdir(parents=True)
    for name in ("__init__.py", "cli.py", "__main__.py"):
        shutil.copy(ROOT / "specstore" / name, copy / "specstore" / name)
    for folder in ("common", "store", "pipeline", "infer", "serving", "democorpus", "realcorpus"):
        shutil.copytree(ROOT / folder, copy / folder, ignore=shutil.ignore_patterns("__pycache__"))
    code = ("import sys, specstore, specstore.store, specstore.infer.options.defaults; "
            "print(specstore.store.__name__, specstore.store.__file__, "
            "sorted(m for m in sys.modules if m.split('.')[0] in ('store', 'infer', 'common')))")
    # -S: no site, so the project's editable install (a finder that maps specstore to this checkout) is not
    # active; the dependencies come from the project's site-packages as a plain path
    site_packages = sysconfig.get_paths()["purelib"]
    done = subprocess.run([sys.executable, "-S", "-c", code], cwd=copy, capture_output=True, text=True, timeout=120,
                          check=False, env={**os.environ, "PYTHONPATH": os.pathsep.join([str(copy), site_packages])})
    assert done.returncode == 0, done.stderr[-2000:]
    name, where, bare = done.stdout.split(" ", 2)
    assert name == "specstore.store" and where.startswith(str(copy / "store")) and bare.strip() == "[]"

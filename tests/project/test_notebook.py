"""examples/explore_store.ipynb runs top to bottom: on a given store (with a checkpoint, and without
labels), and in fresh-clone mode where it builds its own small store (into a temporary SPECSTORE_WORKDIR)."""

from __future__ import annotations

import base64
import csv
import re
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from nbformat import NotebookNode

from specstore import pipeline
from specstore.infer.cli import main as infer_main
from specstore.pipeline.testing import write_music_like

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "examples" / "explore_store.ipynb"
CELL_TIMEOUT = 180  # seconds per cell; the demo build takes about 10 s on 2 cores
ENV = ("SPECSTORE", "SPECSTORE_MODEL", "SPECSTORE_PREDICTIONS", "SPECSTORE_WORKDIR")
PNG = b"\x89PNG\r\n\x1a\n"


def run_notebook(monkeypatch: pytest.MonkeyPatch, cwd: Path, **env: str) -> NotebookNode:
    """Execute the notebook in a fresh python3 kernel (this interpreter) with ``env`` as its SPECSTORE_* variables."""
    for name in ENV:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    nb = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(nb, timeout=CELL_TIMEOUT, kernel_name="python3",
                   resources={"metadata": {"path": str(cwd)}}).execute()  # raises CellExecutionError on error
    assert not [o for c in nb.cells for o in c.get("outputs", []) if o.output_type == "error"]
    return nb


def cell(nb: NotebookNode, cid: str) -> NotebookNode:
    return next(c for c in nb.cells if c.get("id") == cid)


def text(c: NotebookNode) -> str:
    """Everything printed (stdout) and every plain-text result of a cell."""
    parts = [o.text for o in c.outputs if o.output_type == "stream" and o.name == "stdout"]
    parts += [o.data["text/plain"] for o in c.outputs if "text/plain" in o.get("data", {})]
    return "\n".join(parts)


def pngs(c: NotebookNode) -> list[bytes]:
    return [base64.b64decode(o.data["image/png"]) for o in c.outputs if "image/png" in o.get("data", {})]


def htmls(c: NotebookNode) -> list[str]:
    return [o.data["text/html"] for o in c.outputs if "text/html" in o.get("data", {})]


def assert_store_sections(nb: NotebookNode, n_clips: int) -> None:
    summary = text(cell(nb, "open-store"))
    assert "specstore at" in summary and re.search(rf"clips:\s+{n_clips} ", summary)
    assert f"<specstore {n_clips} clips" in summary  # the store's repr as the cell's result
    for cid, count in (("show-clip", 1), ("durations", 1), ("labels", 1)):
        images = pngs(cell(nb, cid))
        assert len(images) == count and all(p.startswith(PNG) and len(p) > 5000 for p in images), cid


def build_corpus(root: Path, labels: list[str | None]) -> Path:
    """One short music-like file per entry: in a folder named for its label, or at the top when None."""
    for k, label in enumerate(labels):
        folder = root / label if label else root
        write_music_like(folder / f"clip{k}.{('wav', 'flac')[k % 2]}", 2.0 + 0.5 * k, seed=k)
    return root


def test_notebook_is_saved_clean() -> None:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(c.outputs == [] and c.execution_count is None for c in code)
    source = "\n".join(c.source for c in nb.cells)
    assert "%matplotlib inline" in source
    assert not re.search(r"""["'](/|~|[A-Za-z]:\\)""", source), "no absolute paths in the notebook"
    assert len({c.get("id") for c in nb.cells}) == len(nb.cells)


@pytest.mark.parametrize("given", ["checkpoint", "predictions"])
def test_notebook_on_a_given_store(given: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    corpus = build_corpus(tmp_path / "corpus", ["jazz", "rock", "jazz", "rock", None])
    store = tmp_path / "given.zarr"
    pipeline.extract(corpus, str(store), jobs=1, progress=False)
    model = tmp_path / "untrained.pt"
    assert infer_main(["init", str(store), str(model)]) == 0
    env = {"SPECSTORE_MODEL": str(model)}
    if given == "predictions":  # a CSV from `make infer`; it takes precedence over the checkpoint
        csv_path = tmp_path / "predictions.csv"
        assert infer_main(["predict", str(store), str(model), "--out", str(csv_path), "--topk", "1",
                           "--no-progress"]) == 0
        env["SPECSTORE_PREDICTIONS"] = str(csv_path)
    capsys.readouterr()
    work = tmp_path / "work"

    nb = run_notebook(monkeypatch, ROOT, SPECSTORE=str(store), SPECSTORE_WORKDIR=str(work), **env)

    assert cell(nb, "build-demo").outputs == []  # nothing built
    assert_store_sections(nb, 5)
    assert "'jazz': 2, 'rock': 2, '(unlabelled)': 1" in text(cell(nb, "labels"))
    pred = text(cell(nb, "predictions"))
    assert "on 4 labelled clips (1 unlabelled skipped)" in pred
    assert "trained epochs" not in pred  # nothing trained: the given model or CSV was used
    if given == "predictions":
        assert f"predictions from {csv_path}" in pred and "clips/s" not in pred
    else:
        assert "5 clips (5 distinct)" in pred
    conf = cell(nb, "confusion")
    assert len(pngs(conf)) == 1 and "precision" in htmls(conf)[0]
    tables = htmls(cell(nb, "most-confused"))
    assert len(tables) == 2 and "clips with the lowest true-class probability" in tables[0]
    assert sum(t.count("/clip") for t in tables) >= 4  # clip paths listed
    if given == "predictions":  # top-1 CSV: a wrong prediction's true class is only bounded, marked <=
        rows = list(csv.DictReader(csv_path.read_text(encoding="utf-8").splitlines()))
        wrong = sum(r["truth"] not in ("", r["pred"]) for r in rows)
        assert tables[0].count("&lt;=") == wrong
    worst = cell(nb, "worst-clip")
    assert len(pngs(worst)) == 1
    assert not work.exists()  # with a model or predictions given, the notebook writes nothing


def test_relative_paths_are_taken_from_the_launch_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`SPECSTORE=data/x.zarr jupyter lab examples/`: the kernel runs in examples/, the path is meant from the
    folder Jupyter was started in (the PWD the kernel inherits)."""
    launch = tmp_path / "project"
    corpus = build_corpus(launch / "corpus", ["jazz", "rock"])
    pipeline.extract(corpus, str(launch / "data" / "rel.zarr"), jobs=1, progress=False)
    kernel_dir = launch / "examples"
    kernel_dir.mkdir()
    monkeypatch.setenv("PWD", str(launch))

    nb = run_notebook(monkeypatch, kernel_dir, SPECSTORE="data/rel.zarr", SPECSTORE_WORKDIR=str(tmp_path / "w"))

    assert str(launch / "data" / "rel.zarr") in text(cell(nb, "open-store"))
    assert_store_sections(nb, 2)


def test_notebook_skips_the_confusion_section_without_labels(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    corpus = build_corpus(tmp_path / "corpus", [None, None])
    store = tmp_path / "unlabelled.zarr"
    pipeline.extract(corpus, str(store), jobs=1, progress=False)

    nb = run_notebook(monkeypatch, ROOT, SPECSTORE=str(store), SPECSTORE_WORKDIR=str(tmp_path / "work"))

    assert_store_sections(nb, 2)
    assert "no labelled clips" in text(cell(nb, "predictions"))
    for cid in ("confusion", "most-confused", "worst-clip"):
        assert cell(nb, cid).outputs == [], cid
    assert not (tmp_path / "work").exists()


def test_notebook_on_a_fresh_clone_builds_a_small_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo_work = ROOT / "data" / "notebook"
    existed = repo_work.exists()
    work = tmp_path / "work"

    # Jupyter starts kernels in the notebook's folder: run it from there
    nb = run_notebook(monkeypatch, NOTEBOOK.parent, SPECSTORE_WORKDIR=str(work))

    built = text(cell(nb, "build-demo"))
    assert "decoded" in built and "bad files    0" in built
    assert (work / "store.zarr").is_dir() and (work / "model.pt").is_file()
    summary = text(cell(nb, "open-store"))
    n_clips = int(re.search(r"clips:\s+(\d+) ", summary).group(1))
    assert n_clips >= 2
    assert_store_sections(nb, n_clips)
    pred = text(cell(nb, "predictions"))
    assert "trained epochs" in pred and f"on {n_clips} labelled clips" in pred
    conf = cell(nb, "confusion")
    assert len(pngs(conf)) == 1 and len(htmls(conf)) == 1
    assert len(htmls(cell(nb, "most-confused"))) == 2
    assert len(pngs(cell(nb, "worst-clip"))) == 1
    assert repo_work.exists() == existed  # the tests never write into the repository's data/

"""`make bench QUICK=1`: the benchmark smoke run works end to end and writes well-formed results.

Runs ``python -m benchmarks --quick`` in a fresh interpreter (as make
does) into a temporary folder, never over ``docs/``, and checks the schema
of both files.  The quick run's values are meaningless (tiny sizes, one
repeat); what is checked is that every figure is there, that ``met`` agrees
with ``value``, ``op`` and ``target``, and that the doc shows each figure.
Also: a rerun of the model grid in the same work folder trains afresh.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]

#: Figures every run must produce (the GPU ones are null without CUDA).
EXPECTED = {
    "extract_jobs1_time_vs_naive", "extract_jobs1_vs_decode_floor", "extract_checksum_cost", "extract_memory_growth_2h",
    "plan_uniform_fixed4", "plan_uniform_bucketed", "plan_uniform_ours", "plan_uniform_training",
    "plan_uniform_training_reshuffle", "plan_lognormal_fixed4", "plan_lognormal_bucketed", "plan_lognormal_ours",
    "plan_lognormal_training", "plan_lognormal_training_reshuffle",
    "infer_uniform_vs_fixed4", "infer_uniform_vs_dense", "infer_lognormal_vs_fixed4", "infer_lognormal_vs_dense",
    "infer_memory_growth", "read_raw_p50_vs_npy", "read_raw_p99_vs_npy", "scan_raw_vs_npy",
    "read_zstd_p50_vs_npy", "scan_zstd_vs_npy", "size_zstd_vs_raw",
    "gpu_infer_vs_fixed4", "gpu_memory_peak_vs_budget", "gpu_oom_retries",
    "library_train_vs_plain", "library_sampler_vs_lhotse", "library_lhotse_over_budget",
    "library_sampler_over_budget", "library_workers_anon_per_store_byte", "library_workers_anon_vs_store",
    "library_prefetch_vs_workers1", "library_prefetch_vs_workers2",
    "serve_errors", "serve_peak_memory",
    "model_tiny_accuracy", "model_tiny_margin",
}


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    out = tmp_path_factory.mktemp("bench")
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "--quick", "--out-dir", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    return out, proc


def test_quick_run_writes_both_files(quick_run: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    out, proc = quick_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (out / "benchmarks.json").is_file()
    assert (out / "benchmarks.md").is_file()


def test_every_figure_has_value_target_met(quick_run: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    out, proc = quick_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads((out / "benchmarks.json").read_text())
    assert doc["quick"] is True and doc["command"] == "make bench QUICK=1"
    for key in ("cpu_model", "cores", "ram_gib", "versions"):
        assert doc["machine"][key], key
    for lib in ("torch", "numpy", "zarr", "librosa"):
        assert doc["machine"]["versions"][lib] not in ("", "n/a"), lib
    assert len(doc["load_before"]) == 3 and len(doc["load_after"]) == 3
    figures = doc["figures"]
    cores = doc["machine"]["cores"]
    expected = set(EXPECTED) | ({f"extract_jobs{cores}_speedup", f"extract_jobs{cores}_vs_naive_jobs{cores}"}
                                if cores > 1 else set())
    assert expected <= set(figures), sorted(expected - set(figures))
    for key, f in figures.items():
        for field in ("value", "target", "met", "unit", "description"):
            assert field in f, (key, field)
        assert f["met"] is None or isinstance(f["met"], bool), key
        if f["value"] is None:  # not measured: must say why, and claim nothing
            assert f["met"] is None and f["note"], key
            continue
        assert isinstance(f["value"], (int, float)) and math.isfinite(f["value"]), key
        if f["target"] is None:
            assert f["met"] is None, key
        else:
            assert f["op"] in (">=", "<="), key
            want = f["value"] >= f["target"] if f["op"] == ">=" else f["value"] <= f["target"]
            assert f["met"] is want, key
    # the planner's efficiencies are fractions; the summary counts what the figures say
    for key in ("plan_uniform_ours", "plan_lognormal_fixed4"):
        assert 0.0 < figures[key]["value"] <= 1.0
    summary = doc["summary"]
    assert set(summary["missed"]) == {k for k, f in figures.items() if f["met"] is False}
    assert summary["met"] == sum(1 for f in figures.values() if f["met"] is True)


def test_markdown_shows_every_figure(quick_run: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    out, proc = quick_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    md = (out / "benchmarks.md").read_text()
    doc = json.loads((out / "benchmarks.json").read_text())
    assert "| figure | value | target | met |" in md
    assert "make bench QUICK=1" in md and doc["machine"]["cpu_model"] in md
    for key in doc["figures"]:
        assert f"`{key}`" in md, key


def test_runner_rejects_unknown_group() -> None:
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "--only", "nonsense"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 2 and "unknown group" in proc.stderr


def test_merge_reruns_one_group_and_keeps_the_others(
    quick_run: tuple[Path, subprocess.CompletedProcess[str]], tmp_path: Path
) -> None:
    import shutil

    out, proc = quick_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    before = json.loads((out / "benchmarks.json").read_text())
    for name in ("benchmarks.json", "benchmarks.md"):
        shutil.copy(out / name, tmp_path / name)
    again = subprocess.run([sys.executable, "-m", "benchmarks", "--quick", "--only", "plan", "--merge", "--out-dir",
                            str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert again.returncode == 0, again.stderr[-3000:]
    after = json.loads((tmp_path / "benchmarks.json").read_text())
    assert list(after["figures"]) == list(before["figures"])  # every figure, in the same order
    plan = after["figures"]["plan_uniform_ours"]["group"]
    assert after["groups"][plan]["measured"] == after["started"]
    for name, g in after["groups"].items():
        if name != plan:
            assert g["measured"] == before["started"] and g["method"] == before["groups"][name]["method"], name
    kept = [k for k, f in after["figures"].items() if f["group"] != plan]
    assert all(after["figures"][k] == before["figures"][k] for k in kept)
    md = (tmp_path / "benchmarks.md").read_text()
    assert "--merge" in md and f"measured {before['started']}" in md
    for key in after["figures"]:
        assert f"`{key}`" in md, key


def test_a_grid_rerun_trains_afresh_instead_of_resuming_the_finished_run(tmp_path: Path) -> None:
    """`infer.train` resumes a finished run of the same configuration (training nothing), so a rerun of the
    model grid in the same work folder would time 0 s; ``fresh_model_path`` removes the earlier run first."""
    from factories import make_separable_store

    from benchmarks.bench_model import fresh_model_path
    from infer.train import TrainConfig, resume_path_for, train

    config = TrainConfig(epochs=1, width=4, depth=2, max_batch=8, crop_seconds=None, val_fraction=0.25, device="cpu")
    store = make_separable_store(tmp_path / "s.zarr", n=24)
    model = tmp_path / "m.pt"
    assert train(store, model, config, progress=False, overwrite=True).epochs_run == 1
    assert resume_path_for(model).is_file()
    assert train(store, model, config, progress=False, overwrite=True).epochs_run == 0  # resumed: nothing trained
    path = fresh_model_path(model)
    assert path == model and not model.exists() and not resume_path_for(model).exists()
    again = train(store, path, config, progress=False, overwrite=True)
    assert again.epochs_run == 1 and again.resumed_from == 0
    assert fresh_model_path(tmp_path / "none.pt") == tmp_path / "none.pt"  # nothing there: nothing to remove

"""`make bench QUICK=1`: the benchmark smoke run works end to end and writes well-formed results.

Runs ``python -m benchmarks --quick`` in a fresh interpreter (as make
does) into a temporary folder, never over ``docs/``, and checks the schema
of both files.  The quick run's values are meaningless (tiny sizes, one
repeat); what is checked is that every figure is there, that ``met`` agrees
with ``value``, ``op`` and ``target``, and that the doc shows each figure.
Also: a rerun of the model grid in the same work folder trains afresh; a group whose dependency is missing
is skipped with one line; a merge keeps the "measured DATE" of the groups it keeps even when it
starts in the same minute as the run it merges.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import importlib.util
import json
import logging
import math
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]

#: Figures every run must produce (the GPU ones are null without CUDA).
EXPECTED = {
    "extract_jobs1_time_vs_naive", "extract_jobs1_vs_decode_floor", "extract_checksum_cost", "extract_memory_growth_2h",
    "extract_melcqt_jobs1_vs_decode_floor", "extract_jobs1_vs_librosa_load", "extract_jobs1_vs_lhotse",
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
    *(f"decode_{ext}_pyav_vs_soundfile" for ext in ("wav", "flac", "ogg", "mp3", "aiff")),
    *(f"decode_{ext}_pyav_{what}" for ext in ("m4a", "wma", "aac") for what in ("speed", "memory")),
    "scale_commit1_small_ms", "scale_commit1_large_ms", "scale_commit1_growth",
    "scale_build_projected_today_s", "scale_build_projected_cheap_s",
    *(f"scale_{what}_{size}{unit}" for size in ("small", "large")
      for what, unit in (("commit1000", "_ms"), ("segments", ""), ("compact", "_s"), ("open", "_s"),
                         ("validate", "_s"), ("len", ""), ("plan", "_s"), ("writer_peak", "_mb"), ("build", "_s"))),
    "cluster_vs_bare_scaling", "cluster_speedup", "cluster_bare_scaling", "cluster_startup_s",
    "cluster_journal_overhead", "cluster_csv_identical",
}
#: The figures of the quick model group, which is skipped where its renderer is missing (fluidsynth, a SoundFont).
MODEL_QUICK = {"model_tiny_accuracy", "model_tiny_margin"}


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
    expected = set(EXPECTED) | ({f"extract_jobs{cores}_speedup", f"extract_jobs{cores}_vs_naive_jobs{cores}",
                                 f"extract_jobs{cores}_vs_bare_scaling", f"extract_jobs{cores}_vs_bare_scaling_longer"}
                                if cores > 1 else set())
    assert set(doc["skipped"]) <= {"model"}, doc["skipped"]
    if "model" in doc["skipped"]:  # this machine lacks the renderer: said in one line how to get it
        assert "make realcorpus-deps" in doc["skipped"]["model"] or "music21" in doc["skipped"]["model"]
        expected -= MODEL_QUICK
        assert not MODEL_QUICK & set(figures)
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
    assert {g["run"] for g in before["groups"].values()} == {before["run"]}
    for name in ("benchmarks.json", "benchmarks.md"):
        shutil.copy(out / name, tmp_path / name)
    again = subprocess.run([sys.executable, "-m", "benchmarks", "--quick", "--only", "plan", "--merge", "--out-dir",
                            str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert again.returncode == 0, again.stderr[-3000:]
    after = json.loads((tmp_path / "benchmarks.json").read_text())
    assert list(after["figures"]) == list(before["figures"])  # every figure, in the same order
    plan = after["figures"]["plan_uniform_ours"]["group"]
    assert after["groups"][plan]["measured"] == after["started"]
    assert after["groups"][plan]["run"] == after["run"] != before["run"]
    for name, g in after["groups"].items():
        if name != plan:
            assert g["measured"] == before["started"] and g["method"] == before["groups"][name]["method"], name
            assert g["run"] == before["run"], name
    kept = [k for k, f in after["figures"].items() if f["group"] != plan]
    assert all(after["figures"][k] == before["figures"][k] for k in kept)
    md = (tmp_path / "benchmarks.md").read_text()
    assert "--merge" in md and f"measured {before['started']}" in md
    for key in after["figures"]:
        assert f"`{key}`" in md, key


def test_a_grid_rerun_trains_afresh_instead_of_resuming_the_finished_run(tmp_path: Path) -> None:
    """`specstore.infer.train` resumes a finished run of the same configuration (training nothing), so a rerun of the
    model grid in the same work folder would time 0 s; ``fresh_model_path`` removes the earlier run first."""
    from factories import make_separable_store

    from benchmarks.bench_model import fresh_model_path
    from specstore.infer.options.run_options import RunOptions
    from specstore.infer.train import TrainConfig, resume_path_for, train

    config = TrainConfig(epochs=1, width=4, depth=2, run=RunOptions(max_batch=8, device="cpu"), crop_seconds=None,
                         val_fraction=0.25)
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


# -- a merge in the same minute, a group whose dependency is missing --------------------------------------

def _frozen_clock(monkeypatch: pytest.MonkeyPatch, when: dt.datetime) -> None:
    """``python -m benchmarks`` sees the time ``when`` (every run starts in the same minute)."""
    from benchmarks import __main__ as bench_main

    class Frozen(dt.datetime):
        @classmethod
        def now(cls, tz: dt.tzinfo | None = None) -> Frozen:
            return cls.fromtimestamp(when.timestamp(), tz)

    monkeypatch.setattr(bench_main, "datetime", types.SimpleNamespace(datetime=Frozen, UTC=dt.UTC))


def test_a_merge_in_the_same_minute_still_marks_the_groups_it_keeps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The report marks a kept group "measured DATE" by the run that measured it, not by comparing minutes:
    a ``--merge`` that starts in the minute of the run it merges used to drop the marker (and the provenance)."""
    from benchmarks.__main__ import main

    _frozen_clock(monkeypatch, dt.datetime(2031, 5, 6, 7, 8, 9, tzinfo=dt.UTC))
    assert main(["--quick", "--only", "plan", "--out-dir", str(tmp_path), "--workdir", str(tmp_path / "w1")]) == 0
    before = json.loads((tmp_path / "benchmarks.json").read_text())
    assert before["started"] == "2031-05-06 07:08 UTC"
    assert main(["--quick", "--only", "gpu", "--merge", "--out-dir", str(tmp_path),
                 "--workdir", str(tmp_path / "w2")]) == 0
    after = json.loads((tmp_path / "benchmarks.json").read_text())
    assert after["started"] == before["started"]  # the same minute
    plan = before["figures"]["plan_uniform_ours"]["group"]
    gpu = after["figures"]["gpu_oom_retries"]["group"]
    md = (tmp_path / "benchmarks.md").read_text()
    headings = [line for line in md.splitlines() if line.startswith("### ")]
    kept = [h for h in headings if h.startswith(f"### {plan[:1].upper() + plan[1:]} (")]
    rerun = [h for h in headings if h.startswith(f"### {gpu[:1].upper() + gpu[1:]} (")]
    assert len(kept) == 1 and kept[0].endswith(f", measured {before['started']})"), headings
    assert len(rerun) == 1 and "measured" not in rerun[0], headings
    assert "were kept from an earlier run (`--merge`)" in md
    assert after["groups"][plan]["run"] == before["run"] != after["run"] == after["groups"][gpu]["run"]


def test_a_quick_run_without_the_renderer_skips_the_model_group_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Right after ``make install`` there is no csound-soundfont (and maybe a fluidsynth from elsewhere): the
    quick model group is skipped with one line naming ``make realcorpus-deps``, not a RealCorpusError traceback."""
    import specstore.realcorpus.render as render
    from benchmarks.__main__ import main

    real_which = shutil.which
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: "/usr/bin/fluidsynth" if name == "fluidsynth"
                        else real_which(name, *a, **k))  # fluidsynth is there, the SoundFont is not
    sf = render.SOUNDFONTS["csoundgm"]
    monkeypatch.setitem(render.SOUNDFONTS, "csoundgm", dataclasses.replace(sf, path=str(tmp_path / "none.sf2")))
    caplog.set_level(logging.INFO)
    assert main(["--quick", "--only", "model", "--out-dir", str(tmp_path / "out"),
                 "--workdir", str(tmp_path / "w")]) == 0
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(said) == 1 and "model skipped" in said[0] and "csound-soundfont" in said[0], said
    assert "make realcorpus-deps" in said[0] and "\n" not in said[0]
    doc = json.loads((tmp_path / "out" / "benchmarks.json").read_text())
    assert list(doc["skipped"]) == ["model"] and not doc["figures"]
    assert "Not run here: `model` (missing csound-soundfont" in (tmp_path / "out" / "benchmarks.md").read_text()


def test_group_selection_skips_only_what_cannot_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import specstore.realcorpus.render as render
    from benchmarks.__main__ import GROUPS, select_groups

    monkeypatch.setattr(render, "fluidsynth_path", lambda: None)
    runnable, skipped = select_groups(list(GROUPS), quick=True)
    assert runnable == [g for g in GROUPS if g != "model"] and list(skipped) == ["model"]
    assert skipped["model"].startswith("missing fluidsynth") and "make realcorpus-deps" in skipped["model"]
    assert select_groups(list(GROUPS), quick=False) == (list(GROUPS), {})  # the full grid reads rendered corpora
    monkeypatch.setattr(render, "fluidsynth_path", lambda: "/usr/bin/fluidsynth")
    for name, sf in list(render.SOUNDFONTS.items()):  # every SoundFont present
        (tmp_path / name).write_bytes(b"")
        monkeypatch.setitem(render.SOUNDFONTS, name, dataclasses.replace(sf, path=str(tmp_path / name)))
    if importlib.util.find_spec("music21") is not None:
        assert select_groups(["plan", "model"], quick=True) == (["plan", "model"], {})


def test_a_partial_rerun_of_the_model_grid_keeps_the_corpora_it_did_not_measure() -> None:
    """``MODEL_CORPORA=small`` measures one corpus: ``--merge`` replaces that corpus's figures and keeps the
    others of the group, each noted with the date it was measured (a whole-group replace would drop them)."""
    from benchmarks.bench_common import Figure, GroupResult
    from benchmarks.bench_report import merged

    def fig(key: str, value: float) -> Figure:
        return Figure(key, key, value, "fraction", "how")

    old = {"started": "2026-12-03 14:48 UTC", "figures": {
        "model_full_accuracy": {**fig("model_full_accuracy", 0.94).to_dict(), "group": "Model quality"},
        "model_small_accuracy": {**fig("model_small_accuracy", 0.86).to_dict(), "group": "Model quality"}},
        "groups": {"Model quality": {"measured": "2026-12-03 14:48 UTC"}}}
    new = GroupResult("Model quality", [fig("model_small_accuracy", 0.9)], partial=True)
    (group,) = merged(old, [new])
    assert {f.key: f.value for f in group.figures} == {"model_small_accuracy": 0.9, "model_full_accuracy": 0.94}
    assert next(f for f in group.figures if f.key == "model_full_accuracy").note == "(measured 2026-12-03 14:48 UTC)"
    again = {"started": "2026-12-04 15:35 UTC", "figures": {
        f.key: {**f.to_dict(), "group": "Model quality"} for f in group.figures}, "groups": {"Model quality": {}}}
    (twice,) = merged(again, [GroupResult("Model quality", [fig("model_small_accuracy", 0.8)], partial=True)])
    assert next(f for f in twice.figures if f.key == "model_full_accuracy").note == "(measured 2026-12-03 14:48 UTC)"
    (whole,) = merged(old, [GroupResult("Model quality", [fig("model_small_accuracy", 0.9)])])
    assert [f.key for f in whole.figures] == ["model_small_accuracy"]  # a whole rerun replaces the group

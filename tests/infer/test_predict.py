"""`make infer`: checkpoints, spec checks, prediction over a store, the CSV, windowing, the CLI."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
import torch
from factories import make_checkpoint as _make_checkpoint
from factories import make_store as _make_store

from specstore.infer.cli import main as infer_main
from specstore.infer.data.collate import collate
from specstore.infer.engine.predict import predict
from specstore.infer.engine.runtime import RunOptions, distinct_rows
from specstore.infer.models.checkpoint import (
    Checkpoint,
    CheckpointError,
    check_store_matches,
    load_checkpoint,
    save_checkpoint,
)
from specstore.store import FeatureSpec, IndexRow, create_store, open_store

SPEC = FeatureSpec.mel(n_bins=16)
LABELS = ["ambient", "jazz", "rock"]


def make_store(path: Path, lengths: list[int], seed: int = 0, spec: FeatureSpec = SPEC) -> Path:
    return _make_store(path, lengths=lengths, seed=seed, specs={"mel": spec}, mean=-40.0)


def make_checkpoint(path: Path, spec: FeatureSpec = SPEC, seed: int = 0, **cfg) -> Path:
    return _make_checkpoint(path, spec=spec, seed=seed, extra={"epoch": 3}, **cfg)


def alone_probs(ckpt_path: Path, store_path: Path) -> np.ndarray:
    """Reference: every clip run alone, unpadded, in float32."""
    ck = load_checkpoint(ckpt_path)
    model = ck.build("cpu")
    s = open_store(store_path)
    out = []
    with torch.no_grad():
        for i in range(len(s)):
            b = collate([np.asarray(s[i], dtype=np.float32)])
            out.append(torch.softmax(model(b.x, b.lengths), dim=1)[0].numpy())
    return np.stack(out)


def test_checkpoint_round_trip(tmp_path: Path) -> None:
    p = make_checkpoint(tmp_path / "m.pt")
    ck = load_checkpoint(p)
    assert ck.label_names == LABELS and ck.feature == "mel" and ck.spec == SPEC and ck.extra == {"epoch": 3}
    model = ck.build()
    again = Checkpoint.from_model(model, LABELS, "mel", SPEC)
    save_checkpoint(again, tmp_path / "m2.pt")
    ck2 = load_checkpoint(tmp_path / "m2.pt")
    assert ck2.config == ck.config
    for k, v in ck.state_dict.items():
        assert torch.equal(v, ck2.state_dict[k])
    x = torch.randn(2, 1, 16, 50) * 10 - 40
    with torch.no_grad():
        assert torch.equal(model(x, torch.tensor([50, 31])), ck2.build()(x, torch.tensor([50, 31])))


def test_checkpoint_is_pickle_free(tmp_path: Path) -> None:
    import pickletools
    import zipfile
    p = make_checkpoint(tmp_path / "m.pt")
    with zipfile.ZipFile(p) as z:
        data = z.read([n for n in z.namelist() if n.endswith("data.pkl")][0])
    # only torch's own tensor rebuild functions and plain containers: no classes of this project
    globals_ = {arg.split(" ")[0] for op, arg, _ in pickletools.genops(data) if op.name == "GLOBAL"}
    assert globals_ and all(m.startswith(("torch", "collections")) for m in globals_), globals_
    evil = tmp_path / "evil.pt"
    torch.save({"format": "specstore-checkpoint", "x": Path("/")}, evil)  # an arbitrary object
    with pytest.raises(CheckpointError, match="not a specstore checkpoint.*may be unsafe") as err:
        load_checkpoint(evil)
    assert "weights_only" not in str(err.value)  # never advice to load it unsafely


@pytest.mark.parametrize("content", [b"", b"garbage" * 10, None])
def test_missing_or_corrupt_checkpoint_is_one_line(tmp_path: Path, content: bytes | None, capsys) -> None:
    store = make_store(tmp_path / "s.zarr", [20, 30])
    p = tmp_path / "m.pt"
    if content is not None:
        p.write_bytes(content)
    assert infer_main(["predict", str(store), str(p), "--out", str(tmp_path / "p.csv"), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and ("no checkpoint" in err or "not a readable checkpoint" in err)


def test_spec_mismatch_names_the_difference(tmp_path: Path, capsys) -> None:
    store = make_store(tmp_path / "s.zarr", [20, 30])
    other = FeatureSpec.mel(n_bins=16, hop_length=256)
    ck = make_checkpoint(tmp_path / "m.pt", spec=other)
    with pytest.raises(CheckpointError, match="hop_length: 256 != 512"):
        check_store_matches(load_checkpoint(ck), open_store(store))
    assert infer_main(["predict", str(store), str(ck), "--no-progress", "--out", str(tmp_path / "p.csv")]) == 2
    err = capsys.readouterr().err
    assert "hop_length: 256 != 512" in err and len(err.strip().splitlines()) == 1
    assert infer_main(["predict", str(tmp_path / "none.zarr"), str(ck), "--no-progress"]) == 2
    assert "no store at" in capsys.readouterr().err


def test_predictions_equal_alone_and_csv_contents(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    lengths = rng.integers(1, 400, size=37).tolist()
    store = make_store(tmp_path / "s.zarr", lengths)
    ck = make_checkpoint(tmp_path / "m.pt")
    res = predict(store, ck, tmp_path / "p.csv", device="cpu", budget_mb=2, max_batch=16, topk=2, progress=False)
    ref = alone_probs(ck, store)
    np.testing.assert_allclose(res.probs, ref, atol=1e-4)
    assert res.stats.batches >= 3 and 0.5 < res.stats.efficiency <= 1 and res.stats.oom_retries == 0
    s = open_store(store)
    with open(tmp_path / "p.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["path"] for r in rows] == s.paths
    for r, p, lab in zip(rows, ref, s.labels, strict=False):
        order = np.argsort(-p)
        assert r["pred"] == LABELS[order[0]]
        assert float(r["prob"]) == pytest.approx(p[order[0]], abs=1e-4)
        pairs = [x.split(":") for x in r["topk"].split(";")]
        assert [n for n, _ in pairs] == [LABELS[j] for j in order[:2]]
        assert [float(q) for _, q in pairs] == pytest.approx(p[order[:2]], abs=1e-4)
        assert r["truth"] == LABELS[lab]


def test_over_long_clip_runs_in_windows_not_dropped(tmp_path: Path) -> None:
    store = make_store(tmp_path / "s.zarr", [30, 40, 6000])
    # one-frame receptive field in time: windowed == whole, exactly
    ck = make_checkpoint(tmp_path / "m.pt", time_kernel=1)

    def budget_for(frames: int, path: Path) -> float:  # a budget that fits `frames` frames of one clip
        from specstore.infer.engine.cost import measure_cost_per_frame
        cost = measure_cost_per_frame(load_checkpoint(path).build(), SPEC.n_bins)
        return (cost.fixed_bytes + cost.bytes_per_frame * frames) / 2**20

    res = predict(store, ck, device="cpu", budget_mb=budget_for(1000, ck), progress=False)
    assert res.stats.windowed == 1
    np.testing.assert_allclose(res.probs, alone_probs(ck, store), atol=1e-4)
    # the default model is close too (its receptive field is covered by the windows' context)
    ck3 = make_checkpoint(tmp_path / "m3.pt")
    res3 = predict(store, ck3, device="cpu", budget_mb=budget_for(1000, ck3), progress=False)
    assert res3.stats.windowed == 1
    np.testing.assert_allclose(res3.probs, alone_probs(ck3, store), atol=1e-4)


def test_duplicates_predicted_once_and_unlabelled_truth_empty(tmp_path: Path) -> None:
    store = make_store(tmp_path / "s.zarr", [50, 60, 70])
    w = create_store(store, {"mel": SPEC})
    w.commit(rows=[IndexRow("zz/copy.wav", "h1", None)])
    s = open_store(store)
    rows, content = distinct_rows(np.arange(len(s)), s.hashes)
    assert len(rows) == 3 and content[s.paths.index("zz/copy.wav")] == content[s.hashes.index("h1")]
    res = predict(store, make_checkpoint(tmp_path / "m.pt"), tmp_path / "p.csv", device="cpu", progress=False)
    i, j = s.paths.index("zz/copy.wav"), s.hashes.index("h1")
    np.testing.assert_array_equal(res.probs[i], res.probs[j])
    assert res.truth[i] is None and res.stats.distinct == 3 and res.stats.clips == 4
    with open(tmp_path / "p.csv", newline="") as f:
        assert [r["truth"] for r in csv.DictReader(f) if r["path"] == "zz/copy.wav"] == [""]


def test_cli_init_plan_predict(tmp_path: Path, capsys) -> None:
    store = make_store(tmp_path / "s.zarr", list(range(20, 400, 15)))
    assert infer_main(["init", str(store), str(tmp_path / "m.pt")]) == 0
    assert infer_main(["plan", str(store), "--model", str(tmp_path / "m.pt"), "--budget-mb", "8",
                       "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "efficiency" in out and "budget 8 MiB" in out
    assert (
        infer_main(
            [
                "predict",
                str(store),
                str(tmp_path / "m.pt"),
                "--out",
                str(tmp_path / "p.csv"),
                "--device",
                "cpu",
                "--budget-mb",
                "16",
                "--no-progress",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "clips/s" in out and "padding efficiency" in out and "OOM retries 0" in out
    assert sum(1 for _ in open(tmp_path / "p.csv")) == len(open_store(store)) + 1


def test_options_validation() -> None:
    with pytest.raises(ValueError, match="precision"):
        RunOptions(precision="int8")
    with pytest.raises(ValueError):
        predict("unused.zarr", "unused.pt", topk=0)


def test_unknown_below_answers_unknown_and_keeps_the_top_k(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--unknown-below P``: ``pred`` is ``unknown`` where the top probability is below P; prob and topk as
    without it; 0, above 1 and nan are one-line errors."""
    store = make_store(tmp_path / "s.zarr", [40, 60, 80, 100, 120, 140])
    ck = make_checkpoint(tmp_path / "m.pt")
    base = ["predict", str(store), str(ck), "--device", "cpu", "--no-progress", "--topk", "2"]
    assert infer_main([*base, "--out", str(tmp_path / "plain.csv")]) == 0
    with open(tmp_path / "plain.csv", newline="") as f:
        plain = list(csv.DictReader(f))
    probs = sorted({float(r["prob"]) for r in plain})
    assert len(probs) > 1
    p = (probs[0] + probs[1]) / 2  # between two shown values, so the 4-decimal rounding cannot decide
    assert infer_main([*base, "--out", str(tmp_path / "u.csv"), "--unknown-below", str(p)]) == 0
    with open(tmp_path / "u.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["path"], r["prob"], r["topk"]) for r in rows] == [(r["path"], r["prob"], r["topk"]) for r in plain]
    assert [r["pred"] for r in rows] == ["unknown" if float(r["prob"]) < p else r["pred"] for r in plain]
    assert "unknown" in [r["pred"] for r in rows] and any(r["pred"] != "unknown" for r in rows)
    capsys.readouterr()
    for bad in ("0", "1.5", "nan", "x"):
        with pytest.raises(SystemExit) as e:
            infer_main([*base, "--unknown-below", bad])
        assert e.value.code == 2
        assert capsys.readouterr().err.strip().splitlines()[-1].endswith(
            f"argument --unknown-below: must be a probability in (0, 1], got {bad!r}")


def test_the_engine_prices_a_batch_by_device_and_make_infer_plans_with_it(tmp_path: Path) -> None:
    """The planner's price of a batch is the engine's: the options', or the device's own (a CPU's is 64 padded
    frames), and ``plan`` shows the batches ``predict`` runs."""
    from specstore.infer.batching.budget import CPU_BATCH_OVERHEAD_FRAMES
    from specstore.infer.batching.planner import plan_batches
    from specstore.infer.engine.runtime import Engine

    lengths = [120, 64, 60, 30, 9, 7, 100, 40]
    store, ckpt = make_store(tmp_path / "s.zarr", lengths), make_checkpoint(tmp_path / "m.pt")
    cpu = Engine(RunOptions(device="cpu", progress=False))
    assert cpu.batch_overhead_frames == CPU_BATCH_OVERHEAD_FRAMES
    assert Engine(RunOptions(device="cpu", batch_overhead_frames=1024.0)).batch_overhead_frames == 1024.0
    model = cpu.prepare(load_checkpoint(ckpt).build())
    budget = cpu.budget(model, SPEC.n_bins)
    plan = cpu.plan(model, np.array(lengths), SPEC.n_bins, budget)
    assert [b.tolist() for b in plan.batches] == [
        b.tolist() for b in plan_batches(np.array(lengths), budget, batch_overhead_frames=64.0).batches]
    res = predict(store, ckpt, device="cpu", progress=False, max_batch=16)
    full = predict(store, ckpt, device="cpu", progress=False, max_batch=16, batch_overhead_frames=1024.0)
    assert (res.stats.batches, full.stats.batches) == (plan.n_batches, 1)  # the price decides; answers do not move
    assert res.stats.efficiency == pytest.approx(plan.efficiency) and res.stats.efficiency > full.stats.efficiency
    np.testing.assert_allclose(res.probs, full.probs, rtol=0, atol=1e-6)


def test_clip_logits_runs_the_plan_it_is_given(tmp_path: Path) -> None:
    from specstore.common import ConfigError
    from specstore.infer.batching.planner import Plan
    from specstore.infer.data.clip_source import ArrayDataset
    from specstore.infer.engine.runtime import Engine

    engine = Engine(RunOptions(device="cpu", progress=False))
    model = engine.prepare(load_checkpoint(make_checkpoint(tmp_path / "m.pt")).build())
    rng = np.random.default_rng(0)
    clips = [rng.normal(-40, 10, (16, n)).astype(np.float32) for n in (50, 8, 47, 9)]
    budget = engine.budget(model, 16)
    lengths = np.array([c.shape[1] for c in clips])
    mixed = Plan(lengths, [np.array([0, 1]), np.array([2, 3])], np.zeros(0, dtype=np.int64), budget)
    got = engine.clip_logits(model, ArrayDataset(clips), plan=mixed)
    assert (got.batches, got.computed_frames) == (2, mixed.computed_frames)  # as given, not planned again
    windowed = Plan(lengths, [np.array([1, 3])], np.array([2, 0]), budget)  # two left for windows
    again = engine.clip_logits(model, ArrayDataset(clips), plan=windowed)
    assert (again.batches, again.windowed) == (1, 2)
    np.testing.assert_allclose(again.logits, got.logits, rtol=0, atol=1e-5)
    with pytest.raises(ConfigError, match="other clips"):
        engine.clip_logits(model, ArrayDataset(clips[:3]), plan=mixed)


def test_the_live_budget_follows_the_free_gpu_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """``Engine.live_budget``: a CPU's budget is fixed; on CUDA the byte figure is the free memory now, the cost per
    frame the one measured, and free memory below one frame's batch keeps the budget."""
    from specstore.infer.batching.budget import Budget
    from specstore.infer.engine.runtime import Engine

    engine = Engine(RunOptions(device="cpu", progress=False))
    budget = Budget(64 << 20, 1024.0, max_batch=4, source="measured at start-up")
    assert engine.live_budget(budget) is budget
    engine.device = torch.device("cuda")  # what the engine asks of the device, stood in for
    monkeypatch.setattr(engine, "memory", lambda: (32 << 20, "free now"))
    live = engine.live_budget(budget)
    assert (live.budget_bytes, live.source, live.cost_per_frame, live.max_batch) == (32 << 20, "free now", 1024.0, 4)
    monkeypatch.setattr(engine, "memory", lambda: (100, "almost none"))
    assert engine.live_budget(budget) is budget

"""The batch-constraint interface: a memory budget and a fixed batch size cut clips through the same two calls."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from factories import make_checkpoint

from specstore.infer.batching.budget import Budget, PlanError
from specstore.infer.batching.constraints import BatchConstraint, BudgetBatches, FixedBatch
from specstore.infer.batching.planner import plan_batches
from specstore.infer.engine.runtime import RowLogits, RunOptions, RunStats
from specstore.infer.engine.windows import tile_spans, windows_for
from specstore.serving.batcher import Batcher
from specstore.serving.model import Classifier, ClipResults
from specstore.serving.policy import BatchPolicy

# 1 MiB per frame-clip: a batch of B clips padded to T frames fits when B * T <= 64
BUDGET = Budget(budget_bytes=64 << 20, cost_per_frame=float(1 << 20), max_batch=4, frame_align=1)


def test_both_kinds_are_constraints() -> None:
    assert isinstance(BudgetBatches(BUDGET), BatchConstraint) and isinstance(FixedBatch(2), BatchConstraint)


def test_a_budget_plans_as_the_planner_does() -> None:
    lengths = np.array([2, 15, 3, 16, 2, 14, 3, 15, 100])
    batches = BudgetBatches(BUDGET)
    ours, planner = batches.plan(lengths, batch_overhead_frames=8.0), plan_batches(lengths, BUDGET,
                                                                                batch_overhead_frames=8.0)
    assert [b.tolist() for b in ours.batches] == [b.tolist() for b in planner.batches]
    assert ours.too_long.tolist() == planner.too_long.tolist() == [8]
    assert batches.full(4, 1) and batches.full(2, 30) and not batches.full(1, 30)


def test_a_fixed_batch_keeps_arrival_order_and_leaves_clips_too_long_alone() -> None:
    plan = FixedBatch(2, BUDGET).plan(np.array([5, 40, 100, 6, 1, 7]))
    assert [b.tolist() for b in plan.batches] == [[0, 1], [3, 4], [5]] and plan.too_long.tolist() == [2]
    assert [b.tolist() for b in FixedBatch(2).plan(np.array([5, 40, 100])).batches] == [[0, 1], [2]]
    assert FixedBatch(2).full(2, 10**6) and not FixedBatch(2).full(1, 1)
    with pytest.raises(PlanError):
        FixedBatch(0)


def test_run_stats_efficiency_and_the_logits_figures() -> None:
    assert RunStats().efficiency == 1.0
    assert RunStats(real_frames=3, computed_frames=4).efficiency == 0.75
    res = RowLogits(logits=np.zeros((2, 3), np.float32), batches=2, real_frames=9, computed_frames=12, windowed=1)
    assert res.run_stats() == RunStats(batches=2, real_frames=9, computed_frames=12, windowed=1)
    assert res.efficiency == 0.75


@pytest.mark.parametrize("length", [1, 3, 4, 7, 8, 9, 20])
def test_tiles_are_whole_windows_covering_the_clip(length: int) -> None:
    tiles = tile_spans(length, 4)
    assert tiles[0][0] == 0 and tiles[-1][1] == length
    assert all(stop - start == min(4, length) for start, stop in tiles)
    assert [start for start, _ in tiles[:-1]] == [start for start, _ in windows_for(length, 4)[:len(tiles) - 1]]


def test_the_engine_cuts_batches_by_any_constraint_and_the_answers_do_not_change(tmp_path: Path) -> None:
    clf = Classifier(make_checkpoint(tmp_path / "m.pt"), RunOptions(device="cpu", progress=False))
    rng = np.random.default_rng(2)
    lengths = [40, 12, 38, 11, 39, 13]
    clips = [rng.normal(-40, 10, (16, n)).astype(np.float32) for n in lengths]
    planned = clf.run(clips)
    fixed = clf.run(clips, constraint=FixedBatch(2, clf.budget))
    np.testing.assert_allclose(fixed.probs, planned.probs, atol=1e-5)
    plan = BudgetBatches(clf.budget).plan(np.array(lengths), batch_overhead_frames=clf.batch_overhead_frames)
    assert planned.run == RunStats(distinct=6, batches=plan.n_batches, real_frames=plan.real_frames,
                                   computed_frames=plan.computed_frames, peak_bytes=planned.run.peak_bytes,
                                   budget_bytes=clf.budget.budget_bytes)
    pairs = FixedBatch(2, clf.budget).plan(np.array(lengths))  # arrival order: long and short clips mixed
    assert fixed.run.batches == 3 and fixed.run.computed_frames == pairs.computed_frames > plan.computed_frames


def test_the_server_runs_a_fixed_batch_as_it_closed_it(tmp_path: Path) -> None:
    clf = Classifier(make_checkpoint(tmp_path / "m.pt"), RunOptions(device="cpu", progress=False))
    rng = np.random.default_rng(3)
    clips = [rng.normal(-40, 10, (16, n)).astype(np.float32) for n in (40, 12, 38, 11)]
    seen: list[tuple[list[int], RunStats]] = []
    run = clf.run

    def recording(batch: list[np.ndarray], **options: Any) -> ClipResults:
        res = run(batch, **options)
        seen.append(([c.shape[1] for c in batch], res.run))
        return res

    clf.run = recording  # type: ignore[method-assign]

    async def serve() -> list[np.ndarray]:
        batcher = Batcher(clf, BatchPolicy(batching="fixed", fixed_size=2, max_delay=30.0))
        await batcher.start()
        try:
            return await asyncio.gather(*(batcher.classify(c) for c in clips))
        finally:
            await batcher.stop()

    probs = asyncio.run(serve())
    assert [lengths for lengths, _ in seen] == [[40, 12], [38, 11]]  # arrival order, whatever the lengths
    assert all(stats.batches == 1 and stats.computed_frames == 2 * clf.budget.align(max(lengths))
               for lengths, stats in seen)
    np.testing.assert_allclose(np.stack(probs), clf.run(clips).probs, atol=1e-5)

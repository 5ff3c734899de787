"""Tests for infer.planner: budget never exceeded, every clip planned once, padding small."""

from __future__ import annotations

import itertools
import math
from collections import Counter

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from specstore.infer.batching.budget import Budget
from specstore.infer.batching.planner import Plan, PlanError, plan_batches, shuffled_training_plan
from specstore.infer.batching.planner_baselines import bucketed_batches, fixed_batches

FRAMES_PER_SECOND = 22050 / 512  # 43.07 frames/s, the default hop
COST = 33 * 2**20 / 1000  # bytes per clip-frame: ~33 MiB per 1000 frames (4-layer CNN, float32)
GIB = 2**30


def corpus(kind: str, n: int, seed: int = 0) -> np.ndarray:
    """Clip lengths in frames: uniform 15-240 s, or log-normal with median 60 s, sigma 0.9."""
    rng = np.random.default_rng(seed)
    if kind == "uniform":
        seconds = rng.uniform(15.0, 240.0, n)
    else:
        seconds = np.exp(rng.normal(np.log(60.0), 0.9, n))
    return np.maximum(1, np.round(seconds * FRAMES_PER_SECOND)).astype(np.int64)


def check_plan(
    plan: Plan, lengths: np.ndarray, *, budget: int, cost: float, max_batch: int, overhead: int, align: int
) -> None:
    """The invariants every budgeted plan must satisfy."""
    padded = -(-lengths // align) * align
    seen = np.concatenate([*plan.batches, plan.too_long]) if plan.batches else plan.too_long
    assert np.array_equal(np.sort(seen), np.arange(len(lengths))), "every id exactly once"
    for batch in plan.batches:
        assert 1 <= len(batch) <= max_batch
        longest = int(padded[batch].max())
        assert len(batch) * longest * cost + overhead <= budget
    alone = padded * cost + overhead
    assert np.array_equal(np.sort(plan.too_long), np.flatnonzero(alone > budget)), (
        "too_long = exactly the clips that fit nowhere"
    )
    assert plan.max_window % align == 0
    assert plan.max_window * cost + overhead <= budget
    assert (plan.max_window + align) * cost + overhead > budget, "max_window is the largest aligned window"


budget_cases = st.tuples(
    st.lists(st.integers(min_value=1, max_value=20_000), min_size=0, max_size=120),
    st.integers(min_value=1, max_value=64),  # max_batch
    st.floats(min_value=0.5, max_value=5000.0),  # cost per frame
    st.integers(min_value=1, max_value=16),  # frame_align
    st.integers(min_value=0, max_value=50_000),  # fixed overhead
    st.integers(min_value=1, max_value=200_000),  # frames the budget should roughly hold
)


@settings(max_examples=150, deadline=None)
@given(
    budget_cases, st.sampled_from(["sorted", "training", "bucketed"]), st.sampled_from([0.0, 64.0, 1024.0, math.inf])
)
@example(([], 1, 0.5000000000000001, 2, 1, 2), "sorted", 0.0)  # 2 x cost + 1 rounds to exactly the budget: it fits
def test_budget_never_exceeded_and_every_clip_once(case: tuple, planner: str, overhead_frames: float) -> None:
    lengths_list, max_batch, cost, align, overhead, frames = case
    lengths = np.array(lengths_list, dtype=np.int64)
    budget = int(overhead + frames * cost)
    if 1 * align * cost + overhead > budget:  # Budget's own float rule (Budget.bytes): no aligned frame fits
        with pytest.raises(PlanError):
            Budget(budget, cost, fixed_overhead=overhead, frame_align=align)
        return
    b = Budget(budget, cost, fixed_overhead=overhead, max_batch=max_batch, frame_align=align)
    if planner == "sorted":
        plan = plan_batches(lengths, b, batch_overhead_frames=overhead_frames)
    elif planner == "training":
        plan = shuffled_training_plan(lengths, b, seed=3, epoch=1, batch_overhead_frames=overhead_frames)
    else:
        plan = bucketed_batches(lengths, b, num_buckets=7)
    check_plan(plan, lengths, budget=budget, cost=cost, max_batch=max_batch, overhead=overhead, align=align)


def brute_force_best(sorted_padded: list[int], *, max_batch: int, fits, per_batch: float) -> float:
    """Min over all contiguous partitions of the sorted order of computed frames + per_batch * batches."""
    n = len(sorted_padded)
    best = math.inf
    for cuts in itertools.product([False, True], repeat=n - 1):
        bounds = [0, *[i + 1 for i, c in enumerate(cuts) if c], n]
        total = 0.0
        for a, b in itertools.pairwise(bounds):
            k, longest = b - a, max(sorted_padded[a:b])
            if k > max_batch or not fits(k, longest):
                total = math.inf
                break
            total += k * longest + per_batch
        best = min(best, total)
    return best


@pytest.mark.parametrize("seed", range(6))
def test_sorted_plan_is_optimal_among_contiguous_partitions(seed: int) -> None:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 400, size=11)
    cost, budget, max_batch, per_batch = 10.0, 10_000, 5, 150.0
    plan = plan_batches(lengths, Budget(budget, cost, max_batch=max_batch), batch_overhead_frames=per_batch)
    got = plan.computed_frames + per_batch * plan.n_batches
    ordered = sorted(lengths.tolist(), reverse=True)
    best = brute_force_best(ordered, max_batch=max_batch, fits=lambda k, m: k * m * cost <= budget, per_batch=per_batch)
    assert got == pytest.approx(best)


def test_infinite_batch_price_gives_the_fewest_batches() -> None:
    lengths = corpus("lognormal", 3000)
    b = Budget(8 * GIB, COST, frame_align=16)
    fewest = plan_batches(lengths, b, batch_overhead_frames=math.inf)
    default = plan_batches(lengths, b)
    # Greedy fill from the longest clip: every batch but the last is as full as the budget allows.
    assert fewest.n_batches == math.ceil(len(lengths) / 16) or all(
        len(b) == 16 or (len(b) + 1) * fewest.padded_length(b) * COST > 8 * GIB for b in fewest.batches[:-1]
    )
    assert fewest.n_batches <= default.n_batches
    assert default.efficiency >= fewest.efficiency


@pytest.mark.parametrize("kind", ["uniform", "lognormal"])
@pytest.mark.parametrize("budget_gib", [1, 4, 40])
def test_sorted_plan_efficiency_beats_baselines(kind: str, budget_gib: int) -> None:
    lengths = corpus(kind, 4000, seed=1)
    b = Budget(budget_gib * GIB, COST, frame_align=16)
    ours = plan_batches(lengths, b)
    buckets = bucketed_batches(lengths, b, num_buckets=10)
    fixed = fixed_batches(lengths, batch_size=4)
    assert ours.efficiency >= 0.99
    assert ours.efficiency > buckets.efficiency > fixed.efficiency
    assert fixed.efficiency < 0.8  # arrival order pads heavily: the problem the planner solves
    # Batches are not trivially small: full batches where lengths are dense.
    assert np.mean([len(b) for b in ours.batches]) > 0.8 * np.mean([len(b) for b in buckets.batches])


@pytest.mark.parametrize("kind", ["uniform", "lognormal"])
def test_training_plans_shuffle_keep_efficiency_and_are_deterministic(kind: str) -> None:
    lengths = corpus(kind, 3000, seed=2)
    b = Budget(4 * GIB, COST, max_batch=16, frame_align=16)
    plans = [shuffled_training_plan(lengths, b, seed=7, epoch=e) for e in range(3)]
    for plan in plans:
        assert plan.efficiency >= 0.95
        check_plan(plan, lengths, budget=4 * GIB, cost=COST, max_batch=16, overhead=0, align=16)
    as_sets = [{tuple(sorted(b.tolist())) for b in p.batches} for p in plans]
    assert as_sets[0] != as_sets[1] and as_sets[1] != as_sets[2], "batches change between epochs"
    first_batches = [tuple(p.batches[0].tolist()) for p in plans]
    assert len(set(first_batches)) == 3
    again = shuffled_training_plan(lengths, b, seed=7, epoch=1)
    assert all(np.array_equal(a, b) for a, b in zip(again.batches, plans[1].batches, strict=True))
    # Batch order is shuffled: not sorted by length like the inference plan.
    longest = [int(lengths[b].max()) for b in plans[0].batches]
    assert longest != sorted(longest, reverse=True)
    # Jitter mixes neighbours: the batches are not the sorted plan's batches...
    sorted_plan = plan_batches(lengths, Budget(4 * GIB, COST, frame_align=16))
    sorted_sets = {tuple(sorted(b.tolist())) for b in sorted_plan.batches}
    assert len(as_sets[0] & sorted_sets) < 0.5 * len(sorted_sets)
    # ...while without jitter they are (same batch price; ties between equal lengths
    # are broken at random), in a shuffled order.
    plain = shuffled_training_plan(lengths, b, seed=7, epoch=0, jitter=0.0, batch_overhead_frames=1024.0)

    def length_multiset(plan: Plan) -> Counter:
        return Counter(tuple(sorted(lengths[b].tolist())) for b in plan.batches)

    assert length_multiset(plain) == length_multiset(sorted_plan)


def test_inference_plan_runs_longest_first_and_is_sorted_within_length_order() -> None:
    lengths = corpus("uniform", 500)
    plan = plan_batches(lengths, Budget(GIB, COST))
    longest = [int(lengths[b].max()) for b in plan.batches]
    assert longest == sorted(longest, reverse=True)


def test_too_long_clips_are_listed_not_dropped() -> None:
    cost, align = 100.0, 16
    lengths = np.array([10, 2000, 50, 999, 1000, 1001, 5000])
    budget = 100_000  # 1000 frames alone
    plan = plan_batches(lengths, Budget(budget, cost, frame_align=align))
    assert plan.max_window == 992  # floor(1000 / 16) * 16
    # 999 and 1000 pad to 1008 frames (> 992): too long as well.
    assert sorted(plan.too_long.tolist()) == [1, 3, 4, 5, 6]
    assert plan.too_long.tolist() == [6, 1, 5, 4, 3]  # longest first
    assert sorted(np.concatenate(plan.batches).tolist()) == [0, 2]
    assert "too long" in plan.describe()


def test_fixed_overhead_counts_against_budget() -> None:
    lengths = np.full(10, 100)
    plan = plan_batches(lengths, Budget(1000 * 10 + 500, 10.0, fixed_overhead=500, max_batch=16))
    assert [len(b) for b in plan.batches] == [10]
    plan = plan_batches(lengths, Budget(1000 * 10 + 499, 10.0, fixed_overhead=500, max_batch=16))
    assert max(len(b) for b in plan.batches) == 9


def test_fixed_batches_keep_arrival_order() -> None:
    lengths = np.array([5, 1, 9, 3, 7, 2, 8])
    plan = fixed_batches(lengths, batch_size=3)
    assert [b.tolist() for b in plan.batches] == [[0, 1, 2], [3, 4, 5], [6]]
    assert plan.computed_frames == 3 * 9 + 3 * 7 + 8
    assert plan.efficiency == pytest.approx(lengths.sum() / plan.computed_frames)


def test_bad_input_raises_plan_error() -> None:
    with pytest.raises(PlanError, match="fewer than 1 frame"):
        plan_batches(np.array([3, 0, 5]), Budget(10**6, 1.0))
    with pytest.raises(PlanError, match="below one batch"):
        plan_batches(np.array([3]), Budget(10, 100.0))
    with pytest.raises(PlanError, match="cost_per_frame"):
        plan_batches(np.array([3]), Budget(10, 0.0))
    with pytest.raises(PlanError, match="1-D"):
        plan_batches(np.ones((2, 2), dtype=int), Budget(10**6, 1.0))
    with pytest.raises(PlanError, match="whole frame"):
        plan_batches(np.array([1.5, 2.0]), Budget(10**6, 1.0))


def test_describe_reports_batches_and_efficiency() -> None:
    lengths = corpus("lognormal", 300)
    plan = plan_batches(lengths, Budget(GIB // 4, COST, frame_align=16))
    text = plan.describe(top=3)
    assert f"in {plan.n_batches} batches" in text
    assert f"{plan.efficiency:.2%}" in text
    assert text.count(" clips x ") == 3
    assert "MiB" in text


def test_empty_corpus_gives_empty_plan() -> None:
    plan = plan_batches(np.zeros(0, dtype=np.int64), Budget(GIB, COST))
    assert plan.batches == [] and len(plan.too_long) == 0 and plan.efficiency == 1.0

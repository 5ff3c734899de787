"""The online batcher's rule for closing batches (pure: queue + budget + clock -> batches)."""

from __future__ import annotations

from typing import Any

import pytest

from specstore.common import ConfigError
from specstore.infer.batching.budget import Budget
from specstore.serving.policy import BatchPolicy, Closed, Waiting
from specstore.serving.policy import ready_batches as closed_batches

# 1 MiB per frame-clip: a batch of B clips padded to T frames fits when B * T <= 64
BUDGET = Budget(budget_bytes=64 << 20, cost_per_frame=float(1 << 20), max_batch=4, frame_align=1)


def queue(*lengths: int, since: float = 0.0) -> list[Waiting]:
    return [Waiting(k, n, since + 0.001 * k) for k, n in enumerate(lengths)]


def ready_batches(*args: Any, **kwargs: Any) -> list[list[int]]:
    """The keys of the batches the policy closes, each checked against the plan it comes with."""
    closed: list[Closed] = closed_batches(*args, **kwargs)
    for c in closed:  # the plan is the batch as closed: its clips in key order, one batch or one left for windows
        assert c.plan.n_batches + len(c.plan.too_long) == 1
        assert [b.tolist() for b in c.plan.batches] in ([list(range(len(c.keys)))], [])
        assert len(c.plan.lengths) == len(c.keys)
    return [c.keys for c in closed]


def test_waits_while_batches_can_still_fill() -> None:
    assert ready_batches(queue(10, 11), BUDGET, BatchPolicy(max_delay=0.05), now=0.01) == []


def test_closes_a_batch_at_max_batch() -> None:
    got = ready_batches(queue(10, 10, 10, 10, 10), BUDGET, BatchPolicy(max_delay=1.0), now=0.01)
    assert len(got) == 1 and len(got[0]) == 4


def test_closes_a_batch_the_next_clip_would_push_over_the_budget() -> None:
    # two clips of 30 frames: 2 x 30 = 60 fits, a third (90) would not -> full at 2
    got = ready_batches(queue(30, 30), BUDGET, BatchPolicy(max_delay=1.0), now=0.01)
    assert got == [[0, 1]]
    assert all(BUDGET.fits(len(b), 30) for b in got)


def test_everything_goes_once_the_oldest_has_waited_max_delay() -> None:
    q = queue(10, 12, 3)
    policy = BatchPolicy(max_delay=0.05)
    assert ready_batches(q, BUDGET, policy, now=0.049) == []
    got = ready_batches(q, BUDGET, policy, now=0.05)
    assert sorted(k for b in got for k in b) == [0, 1, 2]


def test_a_clip_too_long_for_any_batch_goes_alone_at_once() -> None:
    got = ready_batches(queue(10, 100), BUDGET, BatchPolicy(max_delay=1.0), now=0.0)
    assert got == [[1]]


def test_batches_are_length_binned_and_within_budget() -> None:
    lengths = [2, 15, 3, 16, 2, 14, 3, 15]
    got = ready_batches(queue(*lengths), BUDGET, BatchPolicy(max_delay=0.0), now=1.0)
    assert sorted(k for b in got for k in b) == list(range(len(lengths)))
    for b in got:
        frames = [lengths[k] for k in b]
        assert BUDGET.fits(len(b), max(frames)) and len(b) <= BUDGET.max_batch
        assert max(frames) - min(frames) <= 2  # short and long clips are not mixed


def test_ready_batches_come_oldest_first() -> None:
    q = [Waiting(0, 30, 5.0), Waiting(1, 30, 5.0), Waiting(2, 10, 1.0), Waiting(3, 10, 1.0),
         Waiting(4, 10, 1.0), Waiting(5, 10, 1.0)]
    got = ready_batches(q, BUDGET, BatchPolicy(max_delay=10.0), now=6.0)
    assert got == [[2, 3, 4, 5], [0, 1]]


def test_fixed_batches_take_the_oldest_clips_whatever_their_lengths() -> None:
    policy = BatchPolicy(batching="fixed", fixed_size=2, max_delay=1.0)
    q = queue(5, 40, 6, 1, 7)
    assert ready_batches(q, BUDGET, policy, now=0.01) == [[0, 1], [2, 3]]
    assert ready_batches(q, BUDGET, policy, now=2.0) == [[0, 1], [2, 3], [4]]


def test_policy_checks_its_settings() -> None:
    with pytest.raises(ConfigError, match="batching"):
        BatchPolicy(batching="count")
    with pytest.raises(ConfigError, match="max_delay"):
        BatchPolicy(max_delay=-1)


def test_a_cheap_batch_splits_to_save_padding() -> None:
    roomy = Budget(budget_bytes=1 << 40, cost_per_frame=1.0, max_batch=8)
    q = queue(100, 60, 98)
    due = BatchPolicy(max_delay=0.0)
    assert len(ready_batches(q, roomy, due, now=1.0)) == 1  # the planner's default: 40 padded frames < 1024
    got = ready_batches(q, roomy, due, now=1.0, batch_overhead_frames=8.0)
    assert sorted(sorted(b) for b in got) == [[0, 2], [1]]


def test_each_closed_batch_carries_its_clips_as_planned() -> None:
    waiting = queue(10, 100, 11)
    got = closed_batches(waiting, BUDGET, BatchPolicy(max_delay=0.0), now=1.0)
    by_keys = {tuple(c.keys): c.plan for c in got}
    assert set(by_keys) == {(1,), (2, 0)}  # the long clip alone; the two short ones together, longest first
    alone, pair = by_keys[(1,)], by_keys[(2, 0)]
    assert alone.lengths.tolist() == [100] and alone.too_long.tolist() == [0] and alone.n_batches == 0
    assert pair.lengths.tolist() == [11, 10] and [b.tolist() for b in pair.batches] == [[0, 1]]
    assert pair.budget is BUDGET and pair.computed_frames == 22

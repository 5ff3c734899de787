"""Cutting clips into batches: the one cost rule, the planner and the constraints a run cuts by.

:mod:`~specstore.infer.batching.budget` (:class:`Budget`: what one batch may
cost, the padding rule), :mod:`~specstore.infer.batching.planner`
(length-binned batches under a budget), :mod:`~specstore.infer.batching.constraints`
(what a run cuts by: :class:`BudgetBatches` adapts a budget to the planner,
:class:`FixedBatch` is the baseline) and
:mod:`~specstore.infer.batching.planner_baselines` (the planners it is measured
against).  Pure numpy: no torch.
"""

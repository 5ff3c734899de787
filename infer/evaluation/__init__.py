"""Scoring a model: the report, its metrics and figures, and the simple baselines beside it.

:mod:`~specstore.infer.evaluation.evaluate` (what ``make eval`` runs; on one process or a cluster),
:mod:`~specstore.infer.evaluation.report` (``report.json``, ``report.txt``, ``heldout.csv``),
:mod:`~specstore.infer.evaluation.metrics` (scikit-learn's, with bootstrap
intervals), :mod:`~specstore.infer.evaluation.plots` and
:mod:`~specstore.infer.evaluation.baselines`.
"""

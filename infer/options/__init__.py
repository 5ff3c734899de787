"""The inference side's settings: torch-free dataclasses every command line is generated from.

:mod:`~specstore.infer.options.defaults` (the run defaults in one home),
:mod:`~specstore.infer.options.run_options` (:class:`RunOptions`: device,
precision, memory budget, batch size and its price, threads),
:mod:`~specstore.infer.options.run_args` (the run options every command that
runs a model offers, generated once), :mod:`~specstore.infer.options.cli_options`
(predict, plan, init, eval and cross-validation options) and
:mod:`~specstore.infer.options.export_options`.  Nothing in this folder imports
torch (``tests/project/test_fast_start.py`` checks it), so ``--help`` and a bad value
answer at once.
"""

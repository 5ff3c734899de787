"""The run options on a command line: the one generator every command that runs a model uses.

``predict``, ``plan``, ``eval``, ``classify`` and ``serve`` offer the
same run options (:data:`COMMAND_FIELDS`: device, precision, memory budget
and margin, batch size, threads, the planner's price of a batch), each made
from its :class:`~specstore.infer.options.run_options.RunOptions` field by
:func:`specstore.common.options.add_options` (name, default, bounds and help
live there) and read back by :func:`run_options_given`.  ``train`` and
``cv`` take only this machine's (:data:`MACHINE_FIELDS`) here: the rest
are the recipe's (:class:`~specstore.infer.train.config.TrainConfig`).
An option not given is absent from the parsed namespace, so
:class:`RunOptions` fills in its default.  Pure: no torch.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from specstore.common.options import add_options, given
from specstore.infer.options.run_options import RunOptions

__all__ = ["COMMAND_FIELDS", "MACHINE_FIELDS", "add_run_options", "run_options_given"]

COMMAND_FIELDS = ("device", "precision", "budget_mb", "margin_mb", "max_batch", "threads", "batch_overhead_frames")
"""The run options a command that runs a model offers.  Not here: ``loader_workers`` (a training recipe's),
``channels_last`` (the device decides) and ``progress`` (``--no-progress`` or the terminal decides)."""

MACHINE_FIELDS = ("margin_mb", "threads")
"""The run options of this machine: ``train`` and ``cv`` take them from the command line, and the rest from the
recipe, which the checkpoint records."""


def add_run_options(parser: argparse.ArgumentParser, names: Sequence[str] = COMMAND_FIELDS) -> None:
    """One option per run option in ``names`` (in :class:`RunOptions`' field order), absent unless given."""
    unknown = set(names) - set(COMMAND_FIELDS)
    if unknown:
        raise ValueError(f"not run options of a command: {', '.join(sorted(unknown))}")
    add_options(parser, RunOptions, names)


def run_options_given(args: argparse.Namespace, *, progress: bool = True) -> RunOptions:
    """The :class:`RunOptions` of the run options ``args`` holds (the rest keep their defaults), checked: a bad value
    is one line (:class:`~specstore.common.ConfigError`) before torch is imported."""
    return RunOptions(**given(args, RunOptions, COMMAND_FIELDS), progress=progress)

"""The inference side's errors, gathered in one module: each a :class:`specstore.common.errors.SpecstoreError`,
so every command prints it as one line (:func:`specstore.common.cli.run_cli`).

This module belongs to no room (:mod:`specstore.infer`): it imports nothing but
:mod:`specstore.common`, so every room may import it.  Listed by the room that raises them:

* models: :class:`ModelConfigError`, :class:`RegistryError`, :class:`UntrustedModelError`,
  :class:`CheckpointError`, :class:`PretrainedError`;
* batching: :class:`PlanError`;
* data: :class:`CollateError`, :class:`SplitError`;
* engine: :class:`DeviceError`, :class:`WindowError`, :class:`PredictionsError`, :class:`ExportError`;
* evaluation: :class:`EvaluateError`, :class:`PlotError`;
* train: :class:`TrainError`, :class:`CrossValError`.

The modules that raise them import them from here (and export them under their old names too).
"""

from __future__ import annotations

from specstore.common.errors import ConfigError, SpecstoreError

__all__ = [
    "CheckpointError", "CollateError", "CrossValError", "DeviceError", "EvaluateError", "ExportError",
    "ModelConfigError", "PlanError", "PlotError", "PredictionsError", "PretrainedError", "RegistryError", "SplitError",
    "TrainError", "UntrustedModelError", "WindowError",
]


# -- models ---------------------------------------------------------------------------------------
class ModelConfigError(ConfigError):
    """A model configuration is invalid (bad value or unknown field)."""


class RegistryError(ConfigError):
    """A part is registered twice under one name with different builders, or looked up but unknown."""


class UntrustedModelError(ConfigError):
    """A file names model code (an import path) that the caller has not trusted; one line naming the flag."""


class CheckpointError(SpecstoreError):
    """A checkpoint is missing, unreadable, or does not fit the store; one-line message."""


class PretrainedError(ConfigError):
    """A shipped model that is unknown, missing or whose file does not match its recorded checksum."""


# -- batching -------------------------------------------------------------------------------------
class PlanError(ConfigError):
    """Bad planner input (lengths < 1 frame, non-positive budget or cost, budget below one frame)."""


# -- data -----------------------------------------------------------------------------------------
class CollateError(ConfigError):
    """The arrays cannot form one batch (empty, wrong rank, mixed n_bins, too long for pad_to)."""


class SplitError(ConfigError):
    """Bad split parameters, or a split asked of a checkpoint that recorded none."""


# -- engine ---------------------------------------------------------------------------------------
class DeviceError(SpecstoreError):
    """The requested device is not available; one-line message."""


class WindowError(ConfigError):
    """Bad window parameters (window shorter than the alignment, hop out of range)."""


class PredictionsError(SpecstoreError, ValueError):
    """Predictions that cannot be read or joined to the store; one-line message.

    :mod:`specstore.infer.explore` calls it ``ExploreError``.
    """


class ExportError(SpecstoreError):
    """A model cannot be exported, or its export does not compute the checkpoint's logits; one-line message."""


# -- evaluation -----------------------------------------------------------------------------------
class EvaluateError(SpecstoreError, ValueError):
    """Nothing to evaluate (no labelled clips), or a split the checkpoint cannot reproduce."""


class PlotError(SpecstoreError, RuntimeError):
    """A figure cannot be drawn: matplotlib missing, or the axes given do not fit the request."""


# -- train ----------------------------------------------------------------------------------------
class TrainError(ConfigError):
    """Training cannot start or continue (no labels, nothing to train on, bad config, diverged)."""


class CrossValError(ConfigError):
    """Cross-validation cannot run (too few folds or groups, a fold without two labels)."""

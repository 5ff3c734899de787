"""The options of the inference commands that are not run options or training options, one dataclass each.

Each field is one option of ``python -m specstore.infer <command>`` (its default and
help here, :mod:`specstore.common.options` makes the option), so no command line
spells a default of its own.  The run options are
:class:`~specstore.infer.options.run_options.RunOptions`, the training options
:class:`~specstore.infer.train.config.TrainConfig`.  Pure: no torch.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from specstore.common import ConfigError
from specstore.common.limits import bounded, field_limit
from specstore.common.options import described, option
from specstore.infer.models.config import ARCHS, ModelConfig
from specstore.infer.options.defaults import EVAL_SPLITS, MAX_SEED


def check_unknown_below(p: float | None) -> float | None:
    """``p`` if it is None (off) or a probability in (0, 1]; else :class:`~specstore.common.ConfigError`, one
    line."""
    if p is None:
        return None
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 < p <= 1.0:  # nan fails the comparison
        raise ConfigError(f"unknown_below must be a probability in (0, 1], got {p!r}")
    return float(p)


def parse_unknown_below(text: str) -> float:
    """``--unknown-below``'s parser: a probability in (0, 1] (nan, 0 and above 1 refused)."""
    try:
        p = check_unknown_below(float(text))
    except (ValueError, ConfigError):
        raise argparse.ArgumentTypeError(f"must be a probability in (0, 1], got {text!r}") from None
    assert p is not None
    return p


UNKNOWN_BELOW_HELP = ("answer `unknown` when the top probability is below P (0 < P <= 1); the top-k list is kept "
                      "as it is")
"""``--unknown-below``'s help, shared by ``predict`` and ``specstore classify``."""

LABELS_HELP = ("list only these of the model's labels (comma-separated, e.g. rock,jazz,blues), for a tagger's "
               "tags as for a classifier's genres; a label the model lacks is refused")
"""``--labels``' help, shared by ``predict`` and ``specstore classify``."""

__all__ = ["CvOptions", "EvalOptions", "InitOptions", "PlanOptions", "PredictOptions", "check_unknown_below",
           "parse_unknown_below"]

MAX_TOPK = field_limit(ModelConfig, "n_classes").upper
"""Most labels a clip lists: as many as a model may have (:class:`~specstore.infer.models.config.ModelConfig`'s
``n_classes``)."""


@dataclass(frozen=True)
class PredictOptions:
    """``predict``: where the predictions go and how many labels each clip lists."""

    out: str = option("predictions.csv", "CSV to write, replaced atomically; a FIFO or /dev/stdout is written "
                                         "straight through (to /dev/stdout, the summary goes to stderr)")
    topk: int = described(bounded(5, 1, MAX_TOPK, "labels listed per clip, at most as many as a model may have"),
                          "labels listed per clip")
    unknown_below: float | None = option(None, UNKNOWN_BELOW_HELP + " (the CSV's pred column carries it)",
                                         parse=parse_unknown_below, metavar="P", shown="off")
    labels: str | None = option(None, LABELS_HELP, metavar="A,B,...", shown="all")


@dataclass(frozen=True)
class PlanOptions:
    """``plan``: the model whose memory cost to plan for, and how many of the largest batches to list."""

    model: str | None = option(None, "checkpoint whose memory cost to plan for", shown="the default CNN")
    top: int = described(bounded(5, 0, 10_000, "lines of the plan printed, one per batch"),
                         "largest batches to list")


@dataclass(frozen=True)
class InitOptions:
    """``init``: the untrained checkpoint's architecture, feature and seed."""

    arch: str = option("cnn", "architecture", choices=ARCHS)
    feature: str | None = option(None, "feature to classify", shown="the store's default")
    seed: int = described(bounded(0, 0, MAX_SEED, "a 32-bit seed, as training's"), "weight initialisation seed")


@dataclass(frozen=True)
class EvalOptions:
    """``eval``: where the report goes and which clips it scores."""

    out_dir: str = option("reports", "folder for the report files")
    split: str = option("auto", "auto: the held-out split on the store the model was trained on, every clip "
                                "elsewhere; all, or the training / held-out split the checkpoint recorded",
                        choices=EVAL_SPLITS)


@dataclass(frozen=True)
class CvOptions:
    """``cv``: where the fold models and figures go, and how many folds."""

    out_dir: str = option("reports/cv", "folder for the fold models, cv.csv and cv.json")
    folds: int = described(bounded(5, 2, 1000, "each fold trains a model on the other folds: 1000 trainings is "
                                               "days of work, and fewer groups than folds is refused anyway"),
                           "number of folds")

"""The inference side's commands: ``predict``, ``plan``, ``init``, ``train``, ``eval``.

``python -m specstore.infer <command> ...`` runs any of them; each is also a console
command of its own (``specstore-infer``, ``specstore-plan``,
``specstore-init-model``, ``specstore-train``, ``specstore-eval``), and the
Make targets call these.  Every failure a user can cause (missing store or
checkpoint, spec mismatch, no GPU, a store without labels, a bad option) is
one line on stderr, ``specstore: error: ...``, and exit status 2
(:func:`specstore.common.run_cli`).

The parsers, the option checks and the path checks (a missing store or
checkpoint) need no torch: torch, zarr and the models are imported inside
each command, after them, so ``--help`` and a mistyped path answer at once
(``tests/project/test_fast_start.py``).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from specstore.common import ConfigError, run_cli, setup_logging
from specstore.common.atomic import check_output_path, output_target
from specstore.common.options import add_options, given
from specstore.infer.models.config import ModelConfig
from specstore.infer.models.trust import Trust, add_trust_argument
from specstore.infer.options.cli_options import CvOptions, EvalOptions, InitOptions, PlanOptions, PredictOptions
from specstore.infer.options.cluster_options import ClusterOptions
from specstore.infer.options.defaults import PLAIN_MODEL
from specstore.infer.options.run_args import COMMAND_FIELDS, MACHINE_FIELDS, add_run_options, run_options_given
from specstore.infer.options.run_options import RunOptions, check_run_option
from specstore.store import StoreError
from specstore.store.presence import check_store_present

from .train.config import TrainConfig, add_config_arguments, config_from_args

__all__ = ["COMMANDS", "build_parser", "main"]


def _add_run_args(p: argparse.ArgumentParser, *, training: bool = False) -> None:
    """The run options (:func:`specstore.infer.options.run_args.add_run_options`; training takes only this
    machine's, the rest from its recipe), then ``--no-progress`` and ``--verbose``."""
    add_run_options(p, MACHINE_FIELDS if training else COMMAND_FIELDS)
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("-v", "--verbose", action="store_true", help="log the plan and debug details")


def _run_options(args: argparse.Namespace) -> RunOptions:
    return run_options_given(args, progress=not args.no_progress)


def _machine(args: argparse.Namespace) -> dict[str, Any]:
    """``threads`` and ``margin_mb`` of ``train``/``cv`` (None when not given), checked against
    :class:`RunOptions`' bounds before any data is read (the run options are made only once the store is
    open and the recipe resolved)."""
    values = {name: getattr(args, name, None) for name in MACHINE_FIELDS}
    for name, value in values.items():
        check_run_option(name, value)
    return values


def _check_checkpoint(model: str | None) -> None:
    """A checkpoint path that is not a file is one line before torch is imported (loading it would say the
    same, seconds later); an import path ``package.module:Class`` (:mod:`specstore.infer.models.contract`) is
    left to the loader, and a shipped model's name (:mod:`specstore.infer.models.shipped`) is taken as it is."""
    from specstore.infer.models.shipped import is_shipped, no_checkpoint_hint

    if model is not None and ":" not in model and not Path(model).is_file() and not is_shipped(model):
        raise ConfigError(f"no checkpoint at {Path(model)} ({no_checkpoint_hint()})")


# -- the commands ------------------------------------------------------------------------------------

def cmd_predict(args: argparse.Namespace) -> int:
    options = _run_options(args)
    cluster = ClusterOptions(**given(args, ClusterOptions))
    check_store_present(args.store)
    _check_checkpoint(args.model)
    from specstore.infer.engine.predict import predict
    from specstore.infer.models.calibration import UNCALIBRATED

    res = predict(args.store, args.model, args.out, topk=args.topk, unknown_below=args.unknown_below,
                  labels=args.labels, options=options, cluster=cluster,
                  trust_model_code=args.trust_model_code)
    say = sys.stderr if args.out and output_target(args.out).fd == 1 else sys.stdout  # --out /dev/stdout: CSV only
    print(res.stats.line(), file=say)
    if res.outputs == "tags":  # a tagger's independent sigmoid scores take no temperature
        print("scores: independent sigmoids (a tagger; not temperature-scaled)", file=say)
    else:
        print(f"probabilities: {res.calibration}" + (" (the model held out no validation clips to fit a temperature "
                                                      "on)" if res.calibration == UNCALIBRATED
                                                      else " (softmax of logits / T)"), file=say)
    if args.out:
        print(f"predictions: {args.out}", file=say)
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    options = _run_options(args)  # bad options first, before the store is opened
    check_store_present(args.store)
    _check_checkpoint(args.model)
    from specstore.infer.engine.runtime import Engine
    from specstore.infer.models.shipped import resolve_checkpoint
    from specstore.store import open_store

    from .models import build_model

    s = open_store(args.store)
    engine = Engine(options)
    if args.model:
        ckpt = resolve_checkpoint(args.model)
        model = ckpt.build(trust_model_code=args.trust_model_code)
        n_bins = ckpt.n_bins
    else:
        n_bins = s.spec.n_bins
        model = build_model(ModelConfig(**PLAIN_MODEL, n_bins=n_bins, n_classes=max(len(s.label_names), 1)))
    model = engine.prepare(model)
    plan = engine.plan(model, s.lengths, n_bins)
    print(f"{len(s)} clips on {engine.device}")
    print(plan.describe(top=args.top))
    return 0


def cmd_init(args: argparse.Namespace) -> int:
    check_store_present(args.store)
    from specstore.store import open_store

    s = open_store(args.store)
    if not s.label_names:
        raise StoreError(f"{args.store} has no labels; a classifier needs label names")
    feature = args.feature or s.default_feature
    if feature not in s.specs:
        raise StoreError(f"store has no feature {feature!r}; it has {', '.join(s.specs)}")
    config = ModelConfig(**PLAIN_MODEL, arch=args.arch, n_bins=s.specs[feature].n_bins, n_classes=len(s.label_names))
    import torch

    from specstore.infer.models.checkpoint import Checkpoint, save_checkpoint

    from .models import build_model

    torch.manual_seed(args.seed)
    model = build_model(config)
    save_checkpoint(Checkpoint.from_model(model, s.label_names, feature, s.specs[feature],
                                          extra={"note": "randomly initialised, not trained"}), args.model)
    print(f"wrote an untrained {args.arch} checkpoint for {len(s.label_names)} labels to {args.model}")
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    machine = _machine(args)
    base = TrainConfig.from_file(args.config) if args.config else None
    config = config_from_args(args, base)
    # --arch on the command line is the user naming the code; an arch from --config FILE needs the flag.
    trust: Trust = True if args.trust_model_code else [args.arch] if hasattr(args, "arch") else False
    check_output_path(args.model, what="MODEL", stream=False)
    check_store_present(args.store)
    import dataclasses
    import os

    from .train.choice import choose_backbone, record_choice
    from .train.transfer import train_transfer

    choice = choose_backbone(args.store, args.model, config, progress=not args.no_progress)
    if choice.backbone is not None and choice.combine:
        from .train.ensemble import train_sum

        both = train_sum(args.store, args.model, config, choice.backbone, progress=not args.no_progress,
                         **machine, overwrite=args.overwrite)
        record_choice(args.model, choice)
        print(both.summary() + f"\n  backbone (auto): {choice.why}")
        return 0
    if choice.backbone is not None:
        done = train_transfer(args.store, args.model, dataclasses.replace(config, backbone=choice.backbone),
                              progress=not args.no_progress, threads=machine["threads"], overwrite=args.overwrite,
                              rules={"backbone": choice.why} if choice.why else None)
        print(done.summary())
        return 0
    from .train.loop import train

    result = train(args.store, args.model, dataclasses.replace(config, backbone=None,
                                                                feature=config.feature or choice.feature),
                   progress=not args.no_progress,
                   **machine, overwrite=args.overwrite, trust_model_code=trust)
    if os.environ.get("RANK", "0") == "0":  # under torchrun rank 0 alone records the choice and prints the summary
        record_choice(args.model, choice)
        print(result.summary() + (f"\n  backbone (auto): {choice.why}" if choice.why else ""))
    return 0


def cmd_cv(args: argparse.Namespace) -> int:
    threads = _machine(args)["threads"]
    base = TrainConfig.from_file(args.config) if args.config else None
    config = config_from_args(args, base)
    trust: Trust = True if args.trust_model_code else [args.arch] if hasattr(args, "arch") else False
    check_store_present(args.store)
    from specstore.infer.train.crossval import cross_validate

    result = cross_validate(args.store, args.out_dir, config, folds=args.folds, progress=not args.no_progress,
                            threads=threads, overwrite=args.overwrite, trust_model_code=trust)
    print(result.line())
    print(f"per clip: {args.out_dir}/cv.csv; figures: {args.out_dir}/cv.json")
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    options = _run_options(args)
    cluster = ClusterOptions(**given(args, ClusterOptions))
    check_store_present(args.store)
    _check_checkpoint(args.model)
    if args.baseline_store is not None:
        check_store_present(args.baseline_store)
    from specstore.infer.evaluation.evaluate import evaluate

    report = evaluate(args.store, args.model, args.out_dir, split=args.split, baselines=args.baselines,
                      baseline_store=args.baseline_store, options=options, cluster=cluster,
                      trust_model_code=args.trust_model_code)
    print(report.summary())
    print(report.calibration_line())
    if report.n_unlabelled or report.n_unknown_label:
        print(f"skipped {report.n_unlabelled} unlabelled clips; {report.n_unknown_label} clips have labels the "
              f"model does not know ({', '.join(report.unknown_labels) or '-'}), counted as errors")
    print(f"report: {report.files.get('text')} ({report.files.get('json')}, "
          f"{report.files.get('confusion', 'no confusion.png: matplotlib missing')}); clips scored: "
          f"{report.files.get('clips')}")
    return 0


# -- parsers ---------------------------------------------------------------------------------------

def _predict_parser(p: argparse.ArgumentParser) -> None:
    p.description = ("Classify every indexed path of STORE with MODEL in length-binned, memory-budgeted batches; "
                     "write a CSV path,pred,prob,topk,truth,calibration (a tagger's: path,tags,truth).")
    p.add_argument("store", help="feature store (path or URL)")
    p.add_argument("model", help="checkpoint (.pt) from `make train` or `init`")
    add_options(p, PredictOptions, absent=False)
    add_trust_argument(p, "a checkpoint")
    _add_run_args(p)
    add_options(p.add_argument_group("on a cluster (dask or ray; resumable)"), ClusterOptions)


def _plan_parser(p: argparse.ArgumentParser) -> None:
    p.description = "Print the batch plan for STORE (and MODEL's measured memory cost) without running the model."
    p.add_argument("store", help="feature store (path or URL)")
    add_options(p, PlanOptions, absent=False)
    add_trust_argument(p, "the --model checkpoint")
    _add_run_args(p)


def _init_parser(p: argparse.ArgumentParser) -> None:
    p.description = "Write a randomly initialised checkpoint for STORE's labels and feature (no training)."
    p.add_argument("store", help="labelled feature store (path or URL)")
    p.add_argument("model", help="checkpoint path to write")
    add_options(p, InitOptions, absent=False)


def _train_parser(p: argparse.ArgumentParser) -> None:
    p.description = ("Train a classifier on the labelled clips of STORE; the model at the end of the schedule (or, "
                     "with --select best, at the best validation epoch) goes to MODEL, with MODEL's .resume.pt, "
                     ".metrics.csv and .config.json next to it. Options left auto are derived from the training "
                     "data (infer/train/recipe.py); the run prints each rule and the held-out figures of the model "
                     "and of its two experts (the CNN and the band-statistics logistic regression). Rerunning "
                     "the same command continues an interrupted run. Options may also come from --config FILE "
                     "(TOML or JSON with the option names as keys, e.g. crop_seconds = 10); options on the command "
                     "line override the file.")
    p.add_argument("store", help="feature store with labels (path or URL)")
    p.add_argument("model", help="checkpoint to write (e.g. models/genre.pt)")
    p.add_argument("--config", metavar="FILE", help="training options from a .toml or .json file")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing MODEL that this configuration cannot resume")
    add_trust_argument(p, "a --config file (--arch given on the command line is trusted for this run)")
    add_config_arguments(p)
    _add_run_args(p, training=True)


def _cv_parser(p: argparse.ArgumentParser) -> None:
    p.description = ("Judge a training recipe on STORE's labelled clips alone, by grouped k-fold cross-validation: "
                     "the clips are cut into folds by work (a manifest's group column) or content, the recipe "
                     "trains once per fold on the other folds and predicts the fold it did not see. Prints the "
                     "out-of-fold accuracy with a bootstrap interval beside a logistic-regression baseline on the "
                     "same folds; choose recipes this way and keep the test set for the final figure. Takes every "
                     "training option; each fold's model goes to OUT_DIR/fold-<k>.pt (rerun to resume).")
    p.add_argument("store", help="feature store with labels (path or URL): the training data")
    add_options(p, CvOptions, absent=False)
    p.add_argument("--config", metavar="FILE", help="training options from a .toml or .json file")
    p.add_argument("--overwrite", action="store_true", help="replace fold models from another configuration")
    add_trust_argument(p, "a --config file (--arch given on the command line is trusted for this run)")
    add_config_arguments(p)
    _add_run_args(p, training=True)


def _eval_parser(p: argparse.ArgumentParser) -> None:
    p.description = ("Evaluate MODEL on the labelled clips of STORE: accuracy, top-k, per-class precision/recall/F1 "
                     "and a confusion matrix, written to --out-dir as report.json, report.txt and confusion.png, "
                     "with heldout.csv listing the clips scored (path, content hash, label, prediction). "
                     "On the store the model was trained on, only the held-out split is scored unless --split says "
                     "otherwise.")
    p.add_argument("store", help="labelled feature store (path or URL)")
    p.add_argument("model", help="checkpoint (.pt) from `make train`")
    add_options(p, EvalOptions, absent=False)
    p.add_argument("--baselines", action="store_true",
                   help="also fit simple baselines (logistic regression, 5-NN on per-band mean/std/delta) on the "
                        "model's training clips and report them beside the model, with bootstrap intervals")
    p.add_argument("--baseline-store", metavar="STORE",
                   help="the store whose labelled clips the baselines learn from (default: the model's training "
                        "store, its training split)")
    add_trust_argument(p, "a checkpoint")
    _add_run_args(p)
    add_options(p.add_argument_group("on a cluster (dask or ray; resumable, the same report)"), ClusterOptions)


COMMANDS: dict[str, tuple[str, str, Callable[[argparse.ArgumentParser], None],
                          Callable[[argparse.Namespace], int]]] = {
    "predict": ("specstore infer", "predict every indexed path; write a CSV", _predict_parser, cmd_predict),
    "plan": ("specstore plan", "print the batch plan without running the model", _plan_parser, cmd_plan),
    "init": ("specstore init-model", "write a randomly initialised checkpoint", _init_parser, cmd_init),
    "train": ("specstore train", "train a classifier (resumes if interrupted)", _train_parser, cmd_train),
    "eval": ("specstore eval", "accuracy, top-k, per-class P/R/F1, confusion matrix", _eval_parser, cmd_eval),
    "cv": ("specstore cv", "grouped k-fold cross-validation of a training recipe", _cv_parser, cmd_cv),
}
"""command -> (console command, one-line help, parser builder, implementation)."""

_INTERRUPTED = {
    "train": "interrupted; rerun the same command to resume after the last finished epoch",
    "cv": "interrupted; rerun the same command to resume with the unfinished fold",
}


def build_parser() -> argparse.ArgumentParser:
    """The ``python -m specstore.infer`` parser: one sub-command per entry of :data:`COMMANDS`."""
    parser = argparse.ArgumentParser(prog="python -m specstore.infer",
                                     description="Train, run and evaluate classifiers on a specstore feature store.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (_, help_text, build, run) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text)
        build(p)
        p.set_defaults(func=run)
    return parser


def _run(args: argparse.Namespace) -> int:
    setup_logging(logging.INFO if getattr(args, "verbose", False) else logging.WARNING)
    return run_cli(lambda: int(args.func(args)), interrupted=_INTERRUPTED.get(args.command, "interrupted"),
                   verbose=getattr(args, "verbose", False))


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m specstore.infer COMMAND ...``."""
    return _run(build_parser().parse_args(argv))


def _console(command: str) -> Callable[[Sequence[str] | None], int]:
    """The console command for one sub-command (``specstore-train ...`` = ``python -m specstore train ...``)."""
    prog, help_text, build, run = COMMANDS[command]

    def entry(argv: Sequence[str] | None = None) -> int:
        p = argparse.ArgumentParser(prog=prog, description=help_text)
        build(p)
        p.set_defaults(func=run, command=command)
        return _run(p.parse_args(argv))

    entry.__name__ = f"{command}_main"
    entry.__doc__ = f"``{prog}``: {help_text}."
    return entry


predict_main = _console("predict")
plan_main = _console("plan")
init_main = _console("init")
train_main = _console("train")
eval_main = _console("eval")
cv_main = _console("cv")


if __name__ == "__main__":
    sys.exit(main())

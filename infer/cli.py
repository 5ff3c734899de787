"""``make infer`` / ``make plan`` / ``make init-model`` / ``make train`` / ``make eval``: the command line.

``python -m infer.cli predict STORE MODEL --out predictions.csv``,
``python -m infer.cli train STORE MODEL --epochs 30``,
``python -m infer.cli eval STORE MODEL --out-dir reports/`` and friends;
every failure a user can cause (missing store or checkpoint, spec mismatch,
no GPU, a store without labels) is one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import logging
import sys

from store import StoreError, open_store

from .checkpoint import Checkpoint, CheckpointError, load_checkpoint, save_checkpoint
from .collate import CollateError
from .device import DeviceError, choose_device, memory_budget
from .models import ModelConfig, ModelConfigError, build_model
from .planner import PlanError
from .evaluate import evaluate
from .predict import PredictOptions, _autocast_dtype, make_plan, predict
from .train import TrainConfig, train

#: Prefix of the one-line error messages.
PROG = "specstore"

USER_ERRORS = (StoreError, CheckpointError, DeviceError, PlanError, CollateError, ModelConfigError, ValueError,
               FileNotFoundError)


def _add_budget_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="auto", help="auto (CUDA if available), cpu, cuda, cuda:N (default auto)")
    p.add_argument("--budget-mb", type=float, default=None,
                   help="memory for one batch, MiB (CPU default 2048; CUDA: free memory minus the margin)")
    p.add_argument("--margin-mb", type=float, default=None, help="GPU memory kept free, MiB (default 1536)")
    p.add_argument("--max-batch", type=int, default=16, help="most clips in one batch (default 16)")
    p.add_argument("--precision", default="auto", choices=("auto", "fp32", "bf16", "fp16"),
                   help="auto: bf16/fp16 autocast on CUDA, fp32 on CPU (default auto)")


def cmd_predict(args: argparse.Namespace) -> int:
    res = predict(args.store, args.model, args.out, options=PredictOptions(
        device=args.device, budget_mb=args.budget_mb, margin_mb=args.margin_mb, max_batch=args.max_batch,
        topk=args.topk, precision=args.precision, threads=args.threads, progress=not args.no_progress))
    print(res.stats.line())
    if args.out:
        print(f"predictions: {args.out}")
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    s = open_store(args.store)
    device = choose_device(args.device)
    if args.model:
        ckpt = load_checkpoint(args.model)
        model = ckpt.build(device)
    else:
        model = build_model(ModelConfig(n_bins=s.spec.n_bins, n_classes=max(len(s.label_names), 1))).eval()
    budget = memory_budget(device, args.budget_mb, args.margin_mb)
    plan, cost = make_plan(model, s.lengths, device, budget.bytes, args.max_batch,
                           _autocast_dtype(args.precision, device))
    print(f"{len(s)} clips, budget {budget.bytes / 2**20:.0f} MiB ({budget.source}), "
          f"cost {cost.bytes_per_frame / 1024:.1f} KiB per padded clip-frame + {cost.fixed_bytes / 2**20:.1f} MiB fixed")
    print(plan.describe(top=args.top))
    return 0


def cmd_init(args: argparse.Namespace) -> int:
    s = open_store(args.store)
    if not s.label_names:
        raise StoreError(f"{args.store} has no labels; a classifier needs label names")
    feature = args.feature or s.default_feature
    if feature not in s.specs:
        raise StoreError(f"store has no feature {feature!r}; it has {', '.join(s.specs)}")
    config = ModelConfig(arch=args.arch, n_bins=s.specs[feature].n_bins, n_classes=len(s.label_names))
    import torch
    torch.manual_seed(args.seed)
    model = build_model(config)
    save_checkpoint(Checkpoint.from_model(model, s.label_names, feature, s.specs[feature],
                                          extra={"note": "randomly initialised, not trained"}), args.model)
    print(f"wrote an untrained {args.arch} checkpoint for {len(s.label_names)} labels to {args.model}")
    return 0


def _crop(value: str) -> float | None:
    """``--crop-seconds``: a positive number, or 0/none for whole clips."""
    if value.strip().lower() in ("0", "none", "whole"):
        return None
    return float(value)


def cmd_train(args: argparse.Namespace) -> int:
    config = TrainConfig(
        epochs=args.epochs, lr=args.lr, weight_decay=args.weight_decay, max_batch=args.max_batch,
        budget_mb=args.budget_mb, crop_seconds=args.crop_seconds, time_masks=args.time_masks,
        time_mask_frames=args.time_mask_frames, freq_masks=args.freq_masks, freq_mask_bins=args.freq_mask_bins,
        val_fraction=args.val_fraction, seed=args.seed, class_weighted=args.class_weighted,
        label_smoothing=args.label_smoothing, arch=args.arch, width=args.width, depth=args.depth,
        dropout=args.dropout, feature=args.feature, device=args.device, precision=args.precision)
    try:
        result = train(args.store, args.model, config, progress=not args.no_progress, threads=args.threads,
                       margin_mb=args.margin_mb)
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted; rerun the same command to resume after the last finished epoch",
              file=sys.stderr)
        return 130
    print(result.line())
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    report = evaluate(args.store, args.model, args.out_dir, split=args.split, options=PredictOptions(
        device=args.device, budget_mb=args.budget_mb, margin_mb=args.margin_mb, max_batch=args.max_batch,
        precision=args.precision, threads=args.threads, progress=not args.no_progress))
    print(report.summary())
    if report.n_unlabelled or report.n_unknown_label:
        print(f"skipped {report.n_unlabelled} unlabelled clips; {report.n_unknown_label} clips have labels the "
              f"model does not know ({', '.join(report.unknown_labels) or '-'}), counted as errors")
    print(f"report: {report.files.get('text')} ({report.files.get('json')}, "
          f"{report.files.get('confusion', 'no confusion.png: matplotlib missing')})")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m infer.cli",
                                     description="Classify clips of a feature store with a masked CNN.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log the plan and debug details")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("predict", help="predict every indexed path; write a CSV",
                       description="Length-binned, memory-budgeted prediction. Writes path,pred,prob,topk,truth.")
    p.add_argument("store", help="feature store (path or URL)")
    p.add_argument("model", help="checkpoint (.pt) from `make train` or `init`")
    p.add_argument("--out", default="predictions.csv", help="CSV to write (default predictions.csv)")
    p.add_argument("--topk", type=int, default=5, help="labels listed per clip (default 5)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: all cores)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    _add_budget_args(p)
    p.set_defaults(func=cmd_predict)

    p = sub.add_parser("plan", help="print the batch plan without running the model")
    p.add_argument("store")
    p.add_argument("--model", default=None, help="checkpoint whose memory cost to plan for (default: the default CNN)")
    p.add_argument("--top", type=int, default=5, help="largest batches to list")
    _add_budget_args(p)
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("init", help="write a randomly initialised checkpoint for a store (no training)")
    p.add_argument("store")
    p.add_argument("model", help="checkpoint path to write")
    p.add_argument("--arch", default="cnn", choices=("cnn", "resnet"))
    p.add_argument("--feature", default=None, help="feature to classify (default: the store's default)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_init)

    d = TrainConfig()
    p = sub.add_parser("train", help="train a classifier on a store's labelled clips (resumes if interrupted)",
                       description="Train a masked CNN on the labelled clips of STORE; the best checkpoint "
                                   "(validation accuracy) goes to MODEL, a resume file next to it. Rerunning "
                                   "the same command continues an interrupted run. The batch memory budget "
                                   "defaults to 1024 MiB on CPU (--budget-mb).")
    p.add_argument("store", help="feature store with labels (path or URL)")
    p.add_argument("model", help="checkpoint to write (e.g. models/genre.pt)")
    p.add_argument("--epochs", type=int, default=d.epochs, help=f"passes over the training clips (default {d.epochs})")
    p.add_argument("--lr", type=float, default=d.lr, help=f"peak learning rate of AdamW (default {d.lr:g})")
    p.add_argument("--weight-decay", type=float, default=d.weight_decay, help=f"(default {d.weight_decay:g})")
    p.add_argument("--crop-seconds", type=_crop, default=d.crop_seconds,
                   help=f"random crop per clip and epoch, seconds; 0 = whole clips (default {d.crop_seconds:g})")
    p.add_argument("--time-masks", type=int, default=d.time_masks, help=f"SpecAugment time masks per clip "
                   f"(default {d.time_masks}; 0 disables)")
    p.add_argument("--time-mask-frames", type=int, default=d.time_mask_frames,
                   help=f"widest time mask, frames (default {d.time_mask_frames})")
    p.add_argument("--freq-masks", type=int, default=d.freq_masks, help=f"SpecAugment frequency masks per clip "
                   f"(default {d.freq_masks}; 0 disables)")
    p.add_argument("--freq-mask-bins", type=int, default=d.freq_mask_bins,
                   help=f"widest frequency mask, bins (default {d.freq_mask_bins})")
    p.add_argument("--val-fraction", type=float, default=d.val_fraction,
                   help=f"share of contents held out for validation, by content hash (default {d.val_fraction:g})")
    p.add_argument("--seed", type=int, default=d.seed, help=f"split and training seed (default {d.seed})")
    p.add_argument("--class-weighted", action="store_true", help="weight the loss by inverse class frequency")
    p.add_argument("--label-smoothing", type=float, default=d.label_smoothing, help="(default 0)")
    p.add_argument("--arch", default=d.arch, choices=("cnn", "resnet"), help=f"(default {d.arch})")
    p.add_argument("--width", type=int, default=d.width, help=f"channels of the first block (default {d.width})")
    p.add_argument("--depth", type=int, default=d.depth, help=f"blocks / stages (default {d.depth})")
    p.add_argument("--dropout", type=float, default=d.dropout, help=f"before the head (default {d.dropout:g})")
    p.add_argument("--feature", default=None, help="feature to train on (default: the store's default)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: all cores)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    _add_budget_args(p)
    p.set_defaults(func=cmd_train, max_batch=d.max_batch)

    p = sub.add_parser("eval", help="accuracy, top-5, per-class P/R/F1, confusion matrix -> OUT_DIR",
                       description="Evaluate MODEL on the labelled clips of STORE; writes report.json, report.txt "
                                   "and confusion.png to --out-dir.")
    p.add_argument("store", help="labelled feature store (path or URL)")
    p.add_argument("model", help="checkpoint (.pt) from `make train`")
    p.add_argument("--out-dir", default="reports", help="folder for the report files (default reports)")
    p.add_argument("--split", default="all", choices=("all", "val", "train"),
                   help="all clips, or the training / held-out split recorded in the checkpoint (default all)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: all cores)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    _add_budget_args(p)
    p.set_defaults(func=cmd_eval)

    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args))
    except USER_ERRORS as e:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(f"{PROG}: error: {msg}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

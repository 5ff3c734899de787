"""The default recipe on a grid of corpora: `make train`'s defaults against the simple baselines, side by side.

Each corpus of the grid is a training manifest and a test manifest of other
works (or other contents).  Both are extracted into stores, `specstore.infer.train`
runs with its defaults (no flags, as a user's `make train` does: every
``auto`` option resolved from that training set), and `specstore.infer.evaluation.evaluate`
scores the test store with the simple baselines of `specstore.infer.evaluation.baselines` fitted on
the same training clips, side by side, with bootstrap intervals.  Nothing
here is chosen on a test figure: the recipe was fixed before (by grouped
cross-validation on training data, docs/model.md), and these are reports.

The grid (``MODEL_CORPORA=full,long`` runs some of them):

* ``full``: the development corpus (`make realcorpus`, 1635 / 215 clips);
* ``small``: its first, smaller version (`RC_SIZE=small`, 225 / 93);
* ``long``: few works with long clips, another seed (`RC_SIZE=long`, seed 1:
  184 / 74 clips of 45-150 s), the shape of a user's first corpus;
* ``few-works``: the full corpus's training works cut to 30 clips per class,
  whole works (:func:`specstore.realcorpus.variants.few_works`), its test set;
* ``fewest-works``: the same cut to 20 clips per class (about 130 clips), the
  low end of the corpora the recipe adapts to;
* ``soundfont-shift``: trained on two SoundFonts, tested on the other two
  (:func:`specstore.realcorpus.variants.soundfont_shift`);
* ``demo``: the synthetic demo corpus, a seeded quarter of its files (by
  content) as the test set.

Beside each corpus's default row, a head on the shipped ``musicnn-msd`` backbone trains on the same stores
(:mod:`.bench_backbone`: accuracy with its interval, minutes with the backbone's pass), and the backbone's
throughput and memory per clip are measured side by side with the default CNN's.

Training time: the full corpus within 15 minutes on 2 cores, and every
corpus of about 200 clips or fewer (small, long, few-works, fewest-works,
demo) within 5.  Beside the grid, :func:`train_step_layout` times one
training step in the two memory layouts side by side (the engine trains in
channels-last on CPU).

A corpus that is not rendered is reported as not measured, with the
command that renders it.  ``--quick`` renders the generator's tiny corpus
instead (seconds; needs fluidsynth) and trains one small epoch: its values
exercise the path and mean nothing.
"""

from __future__ import annotations

import csv
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .bench_common import ROOT, CpuWindow, Figure, GroupResult, log, median, rotated

DATA = ROOT / "data"


@dataclass(frozen=True)
class Corpus:
    """One corpus of the grid: how to get its manifests, what renders it, its time budget (minutes)."""

    name: str
    title: str
    manifests: Callable[[Path], tuple[Path, Path]]
    render: str
    minutes: float | None = None
    accuracy: float | None = None


def _rendered(root: Path, render: str) -> Path:
    if not (root / "train.csv").is_file():
        raise FileNotFoundError(f"no corpus at {root} (render it: {render})")
    return root


def _own(env: str, default: str, render: str) -> Callable[[Path], tuple[Path, Path]]:
    def manifests(work: Path) -> tuple[Path, Path]:
        root = _rendered(Path(os.environ.get(env, DATA / default)), render)
        return root / "train.csv", root / "test.csv"
    return manifests


def _full_corpus() -> Path:
    """The rendered full corpus (``$REALCORPUS``, default data/realcorpus), which the cut corpora come from."""
    return _rendered(Path(os.environ.get("REALCORPUS", DATA / "realcorpus")), "make realcorpus")


def _few_works(name: str, per_class: int) -> Callable[[Path], tuple[Path, Path]]:
    def manifests(work: Path) -> tuple[Path, Path]:
        from specstore.realcorpus.variants import few_works

        return few_works(_full_corpus(), work / name, per_class=per_class)
    return manifests


def _shift(work: Path) -> tuple[Path, Path]:
    from specstore.realcorpus.variants import soundfont_shift

    return soundfont_shift(_full_corpus(), work / "soundfont-shift")


def _demo(work: Path) -> tuple[Path, Path]:
    """The demo corpus (generated when missing), a seeded quarter of its files by content as the test set."""
    import hashlib

    from specstore.infer.data.split import split_score

    root = DATA / "demo-corpus"
    if not (root / ".complete").is_file():
        from specstore.democorpus import generate_corpus

        root = work / "demo-corpus"
        generate_corpus(root)
    rows = {"train": [], "test": []}  # type: dict[str, list[list[str]]]
    for f in sorted(p for p in root.glob("*/*") if p.is_file()):
        key = hashlib.sha256(f.read_bytes()).hexdigest()
        rows["test" if split_score(key, 7) < 0.25 else "train"].append([str(f.resolve()), f.parent.name, ""])
    out = []
    for split in ("train", "test"):
        path = work / "demo" / f"{split}.csv"
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w", newline="", encoding="utf-8") as fh:
            w = csv.writer(fh, lineterminator="\n")
            w.writerow(["path", "label", "group"])
            w.writerows(rows[split])
        out.append(path)
    return out[0], out[1]


GRID = (
    Corpus("full", "realcorpus full (1635 / 215 clips)", _own("REALCORPUS", "realcorpus", "make realcorpus"),
           "make realcorpus", minutes=15.0, accuracy=0.95),
    Corpus("small", "realcorpus small (225 / 93 clips)", _own("RC_SMALL", "rc-small", "make realcorpus "
           "REALCORPUS=data/rc-small RC_SIZE=small"), "make realcorpus REALCORPUS=data/rc-small RC_SIZE=small",
           minutes=5.0),
    Corpus("long", "realcorpus long, seed 1 (184 / 74 clips of 45-150 s)", _own("RC_LONG", "rc-long",
           "python -m specstore realcorpus data/rc-long --size long --seed 1"),
           "python -m specstore realcorpus data/rc-long --size long --seed 1", minutes=5.0),
    Corpus("few-works", "realcorpus full, 30 training clips per class (whole works)", _few_works("few-works", 30),
           "make realcorpus", minutes=5.0),
    Corpus("fewest-works", "realcorpus full, 20 training clips per class (whole works)",
           _few_works("fewest-works", 20), "make realcorpus", minutes=5.0),
    Corpus("soundfont-shift", "realcorpus full, trained on 2 SoundFonts, tested on the other 2", _shift,
           "make realcorpus"),
    Corpus("demo", "the synthetic demo corpus, a quarter of the files held out", _demo, "(generated)", minutes=5.0),
)


def _not_measured(corpus: Corpus, reason: str) -> list[Figure]:
    return [Figure(f"model_{corpus.name}_accuracy", f"{corpus.title}: default recipe, held-out accuracy", None,
                   "fraction", reason, note=reason),
            Figure(f"model_{corpus.name}_margin", f"{corpus.title}: accuracy minus the best simple baseline", None,
                   "points", reason, target=0.05, op=">=", note=reason)]


def fresh_model_path(model: Path) -> Path:
    """``model`` with any earlier run at that path removed (its checkpoint and resume state), so that training
    starts afresh: `specstore.infer.train` resumes a matching finished run, which would time nothing."""
    from specstore.infer.train import resume_path_for

    for old in (model, resume_path_for(model)):
        old.unlink(missing_ok=True)
    return model


def _measure(corpus: Corpus, work: Path, config: Any, train_csv: Path, test_csv: Path) -> list[Figure]:
    from specstore import pipeline
    from specstore.infer.evaluation.evaluate import evaluate
    from specstore.infer.train import train

    from .bench_backbone import available, backbone_feature, transfer_figures

    stores, backbone_stores = {}, {}
    missing = available()  # the transfer row needs the backbone and stores of its feature
    for split, manifest in (("train", train_csv), ("test", test_csv)):
        stores[split] = work / f"{corpus.name}-{split}.zarr"
        pipeline.extract(manifest, stores[split], features=("mel", "cqt"), progress=False)
        if missing is None:  # the backbone's input has its own frame grid (16 kHz, hop 256): stores of their own
            backbone_stores[split] = work / f"{corpus.name}-{split}-{backbone_feature()}.zarr"
            pipeline.extract(manifest, backbone_stores[split], features=(backbone_feature(),), progress=False)
    model = fresh_model_path(work / f"{corpus.name}.pt")
    t0 = time.perf_counter()
    result = train(stores["train"], model, config, progress=False, overwrite=True)
    minutes = (time.perf_counter() - t0) / 60
    report = evaluate(stores["test"], model, split="all", baselines=True,
                      baseline_store=stores["train"], device="cpu", progress=False)
    best = max(report.baselines, key=lambda b: b["accuracy"])
    lo, hi = report.accuracy_ci
    details: dict[str, Any] = {
        "train_clips": result.n_train + result.n_val, "test_clips": report.n_clips, "accuracy_ci": [lo, hi],
        "macro_f1": round(report.macro_f1, 4),
        "baselines": {b["name"]: {"accuracy": round(b["accuracy"], 4), "ci": [round(x, 3) for x in b["accuracy_ci"]]}
                      for b in report.baselines},
        "recipe": result.extra.get("recipe", {}).get("rules", {}), "held_out": result.extra.get("held_out"),
        "stats_head": result.extra.get("stats_head", {}).get("C"), "train_minutes": round(minutes, 2)}
    log.info("%s: accuracy %.3f [%.3f, %.3f], best baseline %.3f %s, %.1f min", corpus.name, report.accuracy, lo,
             hi, best["accuracy"], best["accuracy_ci"], minutes)
    name, title = corpus.name, corpus.title
    figures = [
        Figure(f"model_{name}_accuracy", f"{title}: default recipe, held-out accuracy", round(report.accuracy, 4),
               "fraction", f"{report.n_clips} test clips, 95% bootstrap interval {lo:.3f}-{hi:.3f}, macro-F1 "
               f"{report.macro_f1:.3f}", target=corpus.accuracy, op=">=" if corpus.accuracy else None,
               details=details),
        Figure(f"model_{name}_margin", f"{title}: accuracy minus the best simple baseline",
               round(report.accuracy - best["accuracy"], 4), "points",
               f"best baseline: {best['name']} {best['accuracy']:.3f} ({best['accuracy_ci'][0]:.3f}-"
               f"{best['accuracy_ci'][1]:.3f}), same test clips", target=0.05, op=">="),
        Figure(f"model_{name}_over_baseline_ci", f"{title}: accuracy minus the best baseline's lower CI bound",
               round(report.accuracy - best["accuracy_ci"][0], 4), "points",
               "never below the baseline's interval", target=0.0, op=">="),
    ]
    if corpus.minutes is not None:
        figures.append(Figure(f"model_{name}_train_minutes", f"{title}: default `make train` wall time",
                              round(minutes, 2), "min", "infer.train with its defaults, 2 cores",
                              target=corpus.minutes, op="<="))
    figures += (transfer_figures(name, title, backbone_stores, work) if missing is None else
                [Figure(f"model_{name}_transfer_accuracy", f"{title}: a head on musicnn-msd, held-out accuracy",
                        None, "fraction", missing, note=missing)])
    return figures


def train_step_layout(*, steps: int, repeats: int, n_bins: int = 212, frames: int = 416) -> Figure:
    """Seconds per training step of the default CNN in the contiguous layout / in channels-last (the engine's CPU
    default), side by side: the same batch (16 crops of 10 s: ``frames`` frames of
    ``n_bins`` mel+cqt rows), forward, backward and AdamW step through ``specstore.infer.train.steps.forward_backward``,
    ``repeats`` interleaved repeats of ``steps`` steps, order rotated; the ratio is the median of per-repeat
    ratios (> 1: channels-last is faster)."""
    import torch

    from specstore.infer.engine.runtime import Engine, RunOptions
    from specstore.infer.models import ModelConfig, build_model
    from specstore.infer.options.defaults import PLAIN_MODEL
    from specstore.infer.train.steps import forward_backward

    generator = torch.Generator().manual_seed(0)
    x = torch.randn(16, 1, n_bins, frames, generator=generator) * 20.0 - 40.0
    lengths = torch.full((16,), frames, dtype=torch.int64)
    y = torch.arange(16) % 6
    variants = {}
    for name, channels_last in (("contiguous", False), ("channels_last", True)):
        engine = Engine(RunOptions(device="cpu", channels_last=channels_last, progress=False))
        torch.manual_seed(0)
        net = engine.prepare(build_model(ModelConfig(**PLAIN_MODEL, n_bins=n_bins, n_classes=6)), train=True)
        optimizer = torch.optim.AdamW(net.parameters(), lr=1e-3)
        scaler = torch.amp.GradScaler("cpu", enabled=False)
        variants[name] = (engine, net, optimizer, scaler)

    def run(name: str, n: int) -> None:
        engine, net, optimizer, scaler = variants[name]
        for _ in range(n):
            optimizer.zero_grad(set_to_none=True)
            forward_backward(net, engine, x, lengths, y, weights=None, label_smoothing=0.0, scaler=scaler)
            scaler.step(optimizer)

    for name in variants:  # warm-up: oneDNN picks its kernels on the first steps
        run(name, 2)
    times: dict[str, list[float]] = {k: [] for k in variants}
    for r in range(repeats):
        for name in rotated(list(variants), r):
            with CpuWindow() as w:
                run(name, steps)
            times[name].append(w.wall / steps)
    ratio = median([c / cl for c, cl in zip(times["contiguous"], times["channels_last"], strict=True)])
    details = {"steps": steps, "repeats": repeats, "batch": [16, 1, n_bins, frames], "threads": torch.get_num_threads(),
               "seconds_per_step": {k: [round(t, 3) for t in v] for k, v in times.items()}}
    log.info("training step layout: contiguous / channels-last %.2fx", ratio)
    return Figure("model_train_step_channels_last", "Training step: contiguous / channels-last (CPU)",
                  round(ratio, 3), "x", "seconds per training step of the default CNN on one batch of 16 10 s "
                  "crops, float32, the contiguous layout / channels-last (the engine's CPU layout for training "
                  "and inference); > 1: channels-last is faster", details=details)


def run(work: Path, *, quick: bool) -> GroupResult:
    from specstore.infer.options.run_options import RunOptions
    from specstore.infer.train import TrainConfig

    from .bench_backbone import backbone_throughput

    work.mkdir(parents=True, exist_ok=True)
    figures: list[Figure] = []
    if quick:
        tiny = Corpus("tiny", "realcorpus tiny", lambda w: (w / "rc-tiny" / "train.csv", w / "rc-tiny" / "test.csv"),
                      "make realcorpus-deps")
        if shutil.which("fluidsynth") is None:
            reason = "not measured: the tiny development corpus needs fluidsynth (make realcorpus-deps)"
            return GroupResult("Model quality", _not_measured(tiny, reason), method=reason)
        from specstore.realcorpus.generate import generate

        generate(work / "rc-tiny", size="tiny", jobs=2, progress=False)
        cpu = RunOptions(device="cpu")
        figures = _measure(tiny, work, TrainConfig(epochs=1, width=8, depth=2, run=cpu), *tiny.manifests(work))
        figures.append(train_step_layout(steps=1, repeats=1, n_bins=32, frames=64))
        figures += backbone_throughput(n_clips=2, seconds=3.0, repeats=1)
        return GroupResult("Model quality", figures, method="quick: the tiny corpus, one epoch (meaningless)")
    figures.append(train_step_layout(steps=8, repeats=5))
    figures += backbone_throughput(n_clips=16, seconds=30.0, repeats=3)
    wanted = [c.strip() for c in os.environ.get("MODEL_CORPORA", "").split(",") if c.strip()]
    for corpus in GRID:
        if wanted and corpus.name not in wanted:
            continue
        try:
            train_csv, test_csv = corpus.manifests(work)
        except FileNotFoundError as e:
            figures += _not_measured(corpus, f"not measured: {e}")
            continue
        figures += _measure(corpus, work, TrainConfig(run=RunOptions(device="cpu")), train_csv, test_csv)
    method = ("Each corpus's training and test manifests (other works, or other contents, in the test set) are "
              "extracted into two stores; `specstore.train` runs with the defaults of `make train` (every auto option "
              "resolved from that training set); `specstore.evaluate(split='all', baselines=True)` scores the test "
              "store with the baselines fitted on the same training clips. Intervals are percentile bootstraps over "
              "test clips (2000 resamples). The recipe was fixed by grouped cross-validation on training data "
              "before these runs; no figure here chose anything.")
    if wanted:
        method += (f" This run measured {', '.join(wanted)} (MODEL_CORPORA); a figure noted '(measured DATE)' was "
                   "kept from an earlier run.")
    return GroupResult("Model quality", figures, method=method, partial=bool(wanted))

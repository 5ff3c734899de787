"""The default recipe on real music: `make train`'s defaults against simple baselines on the development corpus.

The development corpus (`make realcorpus`, docs/realcorpus.md) holds real
compositions rendered to audio and split by work.  Its train and test CSVs
are extracted into two stores, `infer.train` runs with its defaults (no
flags, as a user's `make train` does), and `infer.evaluate` scores the test
works with the simple baselines of `infer.baselines` fitted on the same
training clips, side by side, with bootstrap intervals.

Without the corpus (``data/realcorpus``, or ``REALCORPUS=...``) the figures
are reported as not measured, with the command that makes it.  ``--quick``
renders the generator's tiny corpus instead (seconds; needs fluidsynth) and
trains one small epoch: its values exercise the path and mean nothing.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

from .bench_common import ROOT, Figure, GroupResult, log

KEYS = [
    ("model_realcorpus_accuracy", "Default recipe: held-out accuracy on the development corpus", "fraction",
     0.95, ">="),
    ("model_realcorpus_margin", "Default recipe: accuracy minus the best simple baseline", "points", 0.10, ">="),
    ("model_realcorpus_macro_f1", "Default recipe: held-out macro-F1", "fraction", None, None),
    ("model_realcorpus_best_baseline", "Best simple baseline: held-out accuracy", "fraction", None, None),
    ("model_realcorpus_train_minutes", "Default `make train` on the development corpus: wall time", "min",
     15.0, "<="),
]


def _not_measured(reason: str) -> GroupResult:
    return GroupResult("Model quality", [Figure(k, t, None, u, reason, note=reason) for k, t, u, _, _ in KEYS],
                       method=reason)


def run(work: Path, *, quick: bool) -> GroupResult:
    import pipeline
    from infer.evaluate import evaluate
    from infer.train import TrainConfig, train

    work.mkdir(parents=True, exist_ok=True)
    if quick:
        if shutil.which("fluidsynth") is None:
            return _not_measured("not measured: the tiny development corpus needs fluidsynth (make realcorpus-deps)")
        from realcorpus.generate import generate

        corpus = work / "rc-tiny"
        generate(corpus, size="tiny", jobs=2, progress=False)
        config = TrainConfig(epochs=1, width=8, depth=2, device="cpu")
    else:
        corpus = Path(os.environ.get("REALCORPUS", ROOT / "data" / "realcorpus"))
        if not (corpus / "train.csv").is_file():
            return _not_measured(f"not measured: no development corpus at {corpus} (run `make realcorpus`, about "
                                 "16 minutes on 2 cores)")
        config = TrainConfig(device="cpu")
    stores = {}
    for split in ("train", "test"):
        stores[split] = work / f"rc-{split}.zarr"
        pipeline.extract(corpus / f"{split}.csv", stores[split], features=("mel", "cqt"), progress=False)
    t0 = time.perf_counter()
    result = train(stores["train"], work / "rc.pt", config, progress=False, overwrite=True)
    minutes = (time.perf_counter() - t0) / 60
    report = evaluate(stores["test"], work / "rc.pt", split="all", baselines=True, baseline_store=stores["train"],
                      device="cpu", progress=False)
    best = max(report.baselines, key=lambda b: b["accuracy"])
    details: dict[str, Any] = {
        "test_clips": report.n_clips, "accuracy_ci": [round(x, 3) for x in report.accuracy_ci],
        "baselines": {b["name"]: round(b["accuracy"], 3) for b in report.baselines},
        "best_epoch": result.best_epoch, "epochs": len(result.history), "corpus": str(corpus),
        "config": {k: v for k, v in result.config.to_dict().items() if v != getattr(TrainConfig(), k)}}
    log.info("default recipe: accuracy %.3f (%s), best baseline %.3f", report.accuracy, report.accuracy_ci,
             best["accuracy"])
    figures = [
        Figure(KEYS[0][0], KEYS[0][1], round(report.accuracy, 4), "fraction",
               f"`make train` defaults, test works of the development corpus ({report.n_clips} clips), "
               f"95% bootstrap interval {report.accuracy_ci[0]:.3f}-{report.accuracy_ci[1]:.3f}",
               target=0.95, op=">=", details=details),
        Figure(KEYS[1][0], KEYS[1][1], round(report.accuracy - best["accuracy"], 4), "points",
               f"model accuracy - {best['name']} ({best['accuracy']:.3f}, interval "
               f"{best['accuracy_ci'][0]:.3f}-{best['accuracy_ci'][1]:.3f}), both on the same test clips",
               target=0.10, op=">="),
        Figure(KEYS[2][0], KEYS[2][1], round(report.macro_f1, 4), "fraction", "macro-F1 over the 6 styles"),
        Figure(KEYS[3][0], KEYS[3][1], round(best["accuracy"], 4), "fraction",
               "logistic regression / 5-NN on per-band mean, std and delta of the mel (and CQT) bands, fitted on "
               "the same training clips"),
        Figure(KEYS[4][0], KEYS[4][1], round(minutes, 2), "min",
               "infer.train with its defaults on the training store (validation included), 2 cores",
               target=15.0, op="<="),
    ]
    method = ("The development corpus's train.csv and test.csv (split by work) are extracted into two stores; "
              "`infer.train` runs with the defaults of `make train`; `infer.evaluate(split='all', baselines=True)` "
              "scores the test store with the baselines fitted on the training store. Baselines and model see the "
              "same test clips; intervals are percentile bootstraps over the clips (2000 resamples).")
    return GroupResult("Model quality", figures, method=method)

"""Simple baselines on two stores (train, test): is a corpus too easy?

Per clip, statistics of every stored band over time (mean, standard deviation, mean
absolute frame-to-frame change), standardised on the train store, then logistic
regression and 5-nearest neighbours (scikit-learn, which librosa brings).  A useful
development corpus scores well below 1.0 here.

    python -m realcorpus.baselines data/rc-train.zarr data/rc-test.zarr
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from store import ConfigError, open_store, run_cli

__all__ = ["clip_stats", "baselines", "main"]

STATS = {"mean+std": ("mean", "std"), "mean+std+delta": ("mean", "std", "delta")}


def clip_stats(store, feature: str, parts: Sequence[str]) -> np.ndarray:
    """(clips, bands x len(parts)) per-clip band statistics of ``feature``."""
    arr = store.feature(feature)
    rows = []
    for i in range(len(store.lengths)):
        x = np.asarray(arr[i], dtype=np.float32)
        v = []
        if "mean" in parts:
            v.append(x.mean(axis=1))
        if "std" in parts:
            v.append(x.std(axis=1))
        if "delta" in parts:
            v.append(np.abs(np.diff(x, axis=1)).mean(axis=1) if x.shape[1] > 1 else np.zeros(x.shape[0], np.float32))
        rows.append(np.concatenate(v))
    return np.asarray(rows)


def baselines(train_path: str, test_path: str) -> tuple[list[tuple[str, str, float, float]], dict[str, Any]]:
    """[(stats, features, LR accuracy, kNN accuracy), ...] and the LR confusion (mel, mean+std+delta)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import confusion_matrix
    from sklearn.neighbors import KNeighborsClassifier
    from sklearn.preprocessing import StandardScaler

    tr, te = open_store(train_path), open_store(test_path)
    ytr = np.array([tr.label_names[k] for k in tr.labels])
    yte = np.array([te.label_names[k] for k in te.labels])
    if len(set(ytr)) < 2 or len(yte) == 0:
        raise ConfigError("the train store needs at least two labels and the test store labelled clips")
    have = set(tr.specs) & set(te.specs)
    if "mel" not in have:
        raise ConfigError("both stores need the mel feature")
    feature_sets = [("mel",)] + ([("mel", "cqt")] if "cqt" in have else [])
    results, confusion = [], {}
    for name, parts in STATS.items():
        for feats in feature_sets:
            a = np.hstack([clip_stats(tr, f, parts) for f in feats])
            b = np.hstack([clip_stats(te, f, parts) for f in feats])
            scaler = StandardScaler().fit(a)
            a, b = scaler.transform(a), scaler.transform(b)
            lr = LogisticRegression(max_iter=5000).fit(a, ytr).predict(b)
            knn = KNeighborsClassifier(n_neighbors=5).fit(a, ytr).predict(b)
            results.append((name, "+".join(feats), float(np.mean(lr == yte)), float(np.mean(knn == yte))))
            if name == "mean+std+delta" and feats == ("mel",):
                labels = sorted(set(ytr) | set(yte))
                confusion = {"labels": labels, "matrix": confusion_matrix(yte, lr, labels=labels).tolist()}
    return results, confusion


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m realcorpus.baselines", description=__doc__.split("\n\n")[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("train", help="store extracted from train.csv")
    p.add_argument("test", help="store extracted from test.csv")
    args = p.parse_args(argv)

    def body() -> int:
        results, conf = baselines(args.train, args.test)
        print(f"{'stats':16s} {'features':9s} {'LR':>6s} {'kNN':>6s}")
        for name, feats, lr, knn in results:
            print(f"{name:16s} {feats:9s} {lr:6.3f} {knn:6.3f}")
        labels = conf["labels"]
        print("\nconfusion, LR on mel mean+std+delta (rows: truth, columns: predicted)")
        print(" " * 12 + " ".join(f"{lab[:6]:>6s}" for lab in labels))
        for lab, row in zip(labels, conf["matrix"], strict=False):
            print(f"{lab:12s}" + " ".join(f"{v:6d}" for v in row))
        return 0

    return run_cli(body)


if __name__ == "__main__":
    sys.exit(main())

"""Figures for reports: the confusion matrix as a PNG (matplotlib, Agg backend, no pyplot state).

matplotlib is imported inside the function (it is the ``plot`` extra), so the
rest of ``infer`` works without it; :class:`PlotError` says how to install it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

__all__ = ["PlotError", "plot_confusion"]


class PlotError(RuntimeError):
    """A figure cannot be drawn (matplotlib missing)."""


def plot_confusion(
    cm: np.ndarray,
    label_names: Sequence[str],
    path: str | os.PathLike[str],
    *,
    title: str = "Confusion matrix",
    annotate_max: int = 30,
) -> Path:
    """Draw ``cm`` (rows: truth, columns: prediction, counts) to a PNG at ``path``; return the path.

    Cells are coloured by the row-normalised share (recall per true class),
    so classes of different sizes read alike; each cell is labelled with its
    count when there are at most ``annotate_max`` classes.  The figure grows
    with the number of classes.  Written atomically (temporary file, rename).
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise PlotError("drawing the confusion matrix needs matplotlib: pip install 'specstore[plot]'") from None
    counts = np.asarray(cm, dtype=np.int64)
    n = len(label_names)
    if counts.shape != (n, n):
        raise ValueError(f"confusion matrix must be {n}x{n} for {n} labels, got {counts.shape}")
    support = counts.sum(axis=1, keepdims=True)
    share = np.divide(counts, support, out=np.zeros(counts.shape, dtype=np.float64), where=support > 0)

    side = min(max(4.0, 0.45 * n + 2.5), 40.0)
    fig = Figure(figsize=(side + 1.0, side), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    image = ax.imshow(share, cmap="Blues", vmin=0.0, vmax=1.0, interpolation="nearest")
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04, label="share of the true class")
    ticks = np.arange(n)
    font = 9 if n <= 15 else max(4, int(9 - (n - 15) / 6))
    ax.set_xticks(ticks, labels=list(label_names), rotation=60, ha="right", fontsize=font)
    ax.set_yticks(ticks, labels=list(label_names), fontsize=font)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    total = int(counts.sum())
    correct = int(np.trace(counts))
    ax.set_title(f"{title}\n{correct}/{total} correct ({correct / total:.1%})" if total else title)
    if n <= annotate_max:
        for i in range(n):
            for j in range(n):
                if counts[i, j]:
                    ax.text(j, i, str(counts[i, j]), ha="center", va="center", fontsize=font,
                            color="white" if share[i, j] > 0.5 else "black")
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + ".tmp")
    fig.savefig(tmp, format="png")
    os.replace(tmp, p)
    return p

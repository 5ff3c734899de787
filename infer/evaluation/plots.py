"""Figures without pyplot, and the one figure ``make eval`` writes: the confusion matrix.

:func:`new_figure` makes a matplotlib figure with its own Agg canvas
(nothing global to close or leak), :func:`save_figure` writes one to a PNG
atomically, :func:`confusion_matrix_figure` draws a confusion matrix and
:func:`plot_confusion` writes it.  matplotlib is imported inside the
functions, so the rest of the package works without it (:class:`PlotError`
then says how to install it).  The notebook helpers (:mod:`specstore.infer.explore`)
draw their figures on the same plumbing.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from specstore.common import atomic_path
from specstore.infer.errors import PlotError

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["PlotError", "confusion_matrix_figure", "new_figure", "plot_confusion", "save_figure"]


def new_figure(figsize: tuple[float, float]) -> Figure:
    """A figure with an Agg canvas and no pyplot state (nothing global to close or leak)."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise PlotError("figures need matplotlib: pip install matplotlib") from None
    fig = Figure(figsize=figsize, dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def save_figure(fig: Figure, path: str | os.PathLike[str]) -> Path:
    """Write ``fig`` to a PNG at ``path`` atomically; return the path."""
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png")
    return Path(path)


def confusion_matrix_figure(
    cm: np.ndarray,
    label_names: Sequence[str],
    *,
    title: str = "Confusion matrix",
    annotate_max: int = 30,
    ax: Axes | None = None,
) -> Figure:
    """Draw ``cm`` (rows: truth, columns: prediction, counts) and return the figure drawn on.

    Cells are coloured by the row-normalised share (recall per true class),
    so classes of different sizes read alike; each cell is labelled with its
    count when there are at most ``annotate_max`` classes.  Without ``ax`` a
    new figure is made whose size grows with the number of classes (inches:
    about 0.45 per class, 4 to 40); with ``ax`` the matrix and its colour bar
    go into that axes' figure.
    """
    counts = np.asarray(cm, dtype=np.int64)
    n = len(label_names)
    if counts.shape != (n, n):
        raise ValueError(f"confusion matrix must be {n}x{n} for {n} labels, got {counts.shape}")
    support = counts.sum(axis=1, keepdims=True)
    share = np.divide(counts, support, out=np.zeros(counts.shape, dtype=np.float64), where=support > 0)

    if ax is None:
        side = min(max(4.0, 0.45 * n + 2.5), 40.0)
        fig = new_figure((side + 1.0, side))
        ax = fig.add_subplot()
    else:
        fig = ax.figure  # type: ignore[assignment]
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
    return fig


def plot_confusion(
    cm: np.ndarray,
    label_names: Sequence[str],
    path: str | os.PathLike[str],
    *,
    title: str = "Confusion matrix",
    annotate_max: int = 30,
) -> Path:
    """Draw ``cm`` as :func:`confusion_figure` does to a PNG at ``path``; return the path.

    Written atomically (temporary file, rename).
    """
    return save_figure(confusion_matrix_figure(cm, label_names, title=title, annotate_max=annotate_max), path)

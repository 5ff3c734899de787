"""Figures for notebooks: a clip's spectrograms, lengths, labels (and, from :mod:`specstore.infer.evaluation.plots`, the
confusion matrix).

Every function draws into a given matplotlib ``ax`` or, without one, into a
new figure made without pyplot (nothing global to close or leak), and
returns the figure: the last expression of a notebook cell shows it inline;
:func:`save_figure` writes one to a PNG atomically.  matplotlib is imported
inside the functions, so the rest of the package works without it
(:class:`PlotError` then says how to install it).

Spectrograms are drawn with ``librosa.display.specshow`` and the axes it
derives from the stored :class:`specstore.store.FeatureSpec` (sample rate, hop, mel
range, CQT start note), so time is in seconds and frequency in Hz or note
names, exactly as the values were computed.  Colours use fixed decibel
limits per feature kind (:data:`DB_LIMITS`, read from the registry of kinds
:mod:`specstore.store.kinds`; the store keeps absolute dB against a fixed reference),
so colours compare across clips and panels.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from specstore.infer.errors import PlotError
from specstore.infer.evaluation.plots import confusion_matrix_figure, new_figure, plot_confusion, save_figure
from specstore.store import FeatureSpec, Store
from specstore.store.kinds import db_limits as _registry_db_limits

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = [
    "DB_LIMITS",
    "PlotError",
    "UNLABELLED",
    "confusion_matrix_figure",
    "label_counts",
    "plot_confusion",
    "plot_durations",
    "plot_label_counts",
    "save_figure",
    "show_clip",
    "show_feature",
    "specshow_kwargs",
]

UNLABELLED = "(unlabelled)"
"""The name :func:`label_counts` gives clips without a label."""

DB_LIMITS: Mapping[str, tuple[float, float]] = _registry_db_limits
"""Default colour limits (dB against the spec's fixed reference) per feature kind: the same for every clip,
so colours compare across clips.  A read-only view of each kind's ``db_limits`` in :mod:`specstore.store.kinds`."""


# -- clips, lengths, labels ------------------------------------------------------------------------

def specshow_kwargs(spec: FeatureSpec) -> dict[str, Any]:
    """The ``librosa.display.specshow`` arguments that label ``spec``'s axes correctly.

    Time: ``sr`` (Hz) and ``hop_length`` (samples) give seconds per frame.
    Frequency: the kind's own axis (:attr:`specstore.store.kinds.FeatureKind.axis`):
    mel bins between ``fmin`` and ``fmax`` (Hz; None = sr / 2, as the mel
    filters were built); CQT bins as note names from ``fmin`` (Hz) with
    ``bins_per_octave``.
    """
    kw: dict[str, Any] = {"sr": spec.sample_rate, "hop_length": spec.hop_length, "x_axis": "time"}
    kw.update(spec.kind_info.axis(spec))
    return kw


def label_counts(store: Store) -> dict[str, int]:
    """Clips per label name, in the store's label order; unlabelled clips under ``"(unlabelled)"`` if any."""
    labels = np.asarray(store.labels)
    counts = np.bincount(labels[labels >= 0], minlength=len(store.label_names))
    out = {name: int(c) for name, c in zip(store.label_names, counts, strict=False)}
    unlabelled = int((labels < 0).sum())
    if unlabelled:
        out[UNLABELLED] = unlabelled
    return out


def _integer_ticks() -> Any:
    from matplotlib.ticker import MaxNLocator

    return MaxNLocator(integer=True)


def _clip_title(store: Store, i: int, note: str | None = None) -> str:
    label = int(store.labels[i])
    name = store.label_names[label] if label >= 0 else "unlabelled"
    return f"{store.paths[i]} ({name}, {store.durations[i]:.1f} s)" + (f"; {note}" if note else "")


def show_feature(store: Store, i: int, feature: str | None = None, *, ax: Axes | None = None,
                 colorbar: bool = True, cmap: str = "magma", title: str | None = None,
                 db_limits: tuple[float, float] | None = None) -> Figure:
    """Draw clip ``i``'s ``feature`` (default: the store's default feature) in dB; return the figure.

    Values are the stored decibels against the spec's fixed reference (no
    per-clip maximum), and colours span ``db_limits`` (default
    :data:`DB_LIMITS` for the feature's kind), the same for every clip, so
    colours compare across clips of one store.  Time is in seconds.
    """
    import librosa.display

    name = feature or store.default_feature
    view = store.feature(name)  # KeyError with the store's features if missing
    data = np.asarray(view[i], dtype=np.float32)  # (n_bins, n_frames); float16 upcast for matplotlib
    vmin, vmax = db_limits or DB_LIMITS.get(view.spec.kind, (float(data.min()), float(data.max())))
    if ax is None:
        ax = new_figure((10.0, 3.6)).add_subplot()
    mesh = librosa.display.specshow(data, ax=ax, cmap=cmap, vmin=vmin, vmax=vmax, **specshow_kwargs(view.spec))
    if colorbar:
        ax.figure.colorbar(mesh, ax=ax, format="%+.0f dB")
    ax.set_xlabel("time (s)")
    ax.set_title(title if title is not None else f"{name}: {_clip_title(store, i)}", fontsize=10)
    return ax.figure  # type: ignore[return-value]


def show_clip(store: Store, i: int, features: Sequence[str] | None = None, *,
              ax: Axes | Sequence[Axes] | None = None, cmap: str = "magma", note: str | None = None,
              db_limits: dict[str, tuple[float, float]] | None = None) -> Figure:
    """Clip ``i``'s spectrograms, one panel per feature (default: every feature of the store).

    ``ax``: one axes per feature (a list or an array, as ``plt.subplots``
    gives; a single axes for a single feature), or None for a new figure
    with the panels stacked and time axes shared.  ``note`` is added to the
    title (e.g. ``"predicted jazz (p 0.81)"``).  ``db_limits``: colour limits
    per feature name (default :data:`DB_LIMITS` by kind).
    """
    names = list(features) if features is not None else list(store.specs)
    if not names:
        raise PlotError("no features to show")
    for name in names:
        store.feature(name)  # fail before drawing anything
    n = len(store)
    if not -n <= i < n:
        raise IndexError(f"clip {i} out of range for a store of {n} clips")
    if ax is None:
        fig = new_figure((10.0, 3.2 * len(names) + 0.4))
        axes = list(fig.subplots(len(names), 1, sharex=True, squeeze=False)[:, 0])
        fig.suptitle(_clip_title(store, i, note), fontsize=11)
        titles = [f"{name} ({store.specs[name].n_bins} bins)" for name in names]
    else:
        axes = list(np.ravel(np.asarray(ax, dtype=object))) if isinstance(ax, (Sequence, np.ndarray)) else [ax]
        if len(axes) != len(names):
            raise PlotError(f"{len(names)} feature(s) need as many axes, got {len(axes)}")
        titles = [None] * len(names)  # type: ignore[list-item]
        if note:
            titles[0] = f"{names[0]}: {_clip_title(store, i, note)}"
    for name, a, t in zip(names, axes, titles, strict=True):
        show_feature(store, i, name, ax=a, cmap=cmap, title=t, db_limits=(db_limits or {}).get(name))
    for a in axes[:-1]:
        a.set_xlabel("")
    return axes[0].figure


def plot_durations(store: Store, *, bins: int = 30, ax: Axes | None = None, log: bool | None = None) -> Figure:
    """Histogram of the clips' durations in seconds, with the median and the total marked.

    ``log``: logarithmic duration axis (default: when the longest clip is
    over 20 times the shortest, as in real corpora).
    """
    d = np.asarray(store.durations, dtype=np.float64)
    if ax is None:
        ax = new_figure((8.0, 3.4)).add_subplot()
    if not len(d):
        ax.set_title("no clips")
        return ax.figure  # type: ignore[return-value]
    lo, hi = float(d.min()), float(d.max())
    use_log = log if log is not None else (lo > 0 and hi / lo > 20)
    edges: Any = np.geomspace(lo, hi, bins + 1) if use_log and hi > lo else bins
    ax.hist(d, bins=edges, color="tab:blue", alpha=0.8)
    if use_log:
        ax.set_xscale("log")
    med = float(np.median(d))
    ax.axvline(med, color="black", linestyle="--", linewidth=1, label=f"median {med:.1f} s")
    ax.set_xlabel("duration (s)")
    ax.set_ylabel("clips")
    ax.yaxis.set_major_locator(_integer_ticks())
    ax.set_title(f"{len(d):,} clips, {d.sum() / 3600:.2f} h; {lo:.1f} s to {hi:.1f} s", fontsize=10)
    ax.legend(loc="upper right")
    return ax.figure  # type: ignore[return-value]


def plot_label_counts(store: Store, *, ax: Axes | None = None) -> Figure:
    """Bar chart of clips per label (unlabelled clips as a grey bar), with the counts written on."""
    counts = label_counts(store)
    if ax is None:
        ax = new_figure((max(5.0, 0.5 * len(counts) + 2.0), 3.4)).add_subplot()
    if not counts:
        ax.set_title("no labels")
        return ax.figure  # type: ignore[return-value]
    names = list(counts)
    values = [counts[n] for n in names]
    colors = ["lightgrey" if n == UNLABELLED else "tab:blue" for n in names]
    bars = ax.bar(range(len(names)), values, color=colors)
    ax.bar_label(bars, fontsize=8)
    ax.set_xticks(range(len(names)), labels=names, rotation=45 if len(names) > 6 else 0, ha="right"
                  if len(names) > 6 else "center")
    ax.set_ylabel("clips")
    ax.yaxis.set_major_locator(_integer_ticks())
    ax.set_title(f"clips per label ({len(store.label_names)} labels)", fontsize=10)
    return ax.figure  # type: ignore[return-value]

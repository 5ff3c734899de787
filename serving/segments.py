"""Genre over time: a clip cut into windows of a fixed number of seconds, each with its own top-k.

``specstore classify --segments SECONDS`` and the server's ``segments``
parameter share these pieces.  A clip of ``duration`` seconds gives
``ceil(duration / SECONDS)`` segments: segment ``k`` covers
``[k * SECONDS, min((k + 1) * SECONDS, duration))`` seconds, so the last one is
shorter when the duration is not a multiple.  In frames, each boundary is
``k * SECONDS`` rounded to the nearest multiple of the model's window
alignment (its time stride or pooling window, as for the windows of
``make infer``, :func:`specstore.infer.engine.windows.windows_for`), so no pooling window is
split; the last segment ends at the clip's last frame.

Each segment is classified as a clip of its own: its real frames only,
masked in whatever batch the engine puts it in (the disjoint windows,
context 0, of :mod:`specstore.infer.engine.windows`), so its probabilities do not depend on
the other clips or segments of the run.  A segment sees no audio across its
boundaries: the model's receptive field is cut there, as at a clip's ends.
SECONDS below one alignment step (e.g. 4 frames, about 0.09 s at the
default features) is refused with a one-line :class:`~specstore.common.ConfigError`.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from specstore.common import ConfigError
from specstore.infer.engine.predictions import answer

AUTO = "auto"
"""The server's ``segments=auto``: the window picked by :func:`auto_seconds` from each file's duration."""

AUTO_STEPS = (1.0, 2.0, 5.0, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0)
"""Windows (seconds) ``segments=auto`` picks from: the shortest that gives at most :data:`AUTO_CELLS` windows."""

AUTO_CELLS = 24
"""At most this many windows per file with ``segments=auto`` (files up to 4 hours; longer ones get more)."""

MAX_SEGMENTS = 1000
"""The most windows the server classifies for one file (a request for more is that file's one-line error)."""

__all__ = ["AUTO", "MAX_SEGMENTS", "Segment", "auto_seconds", "check_segment_length", "check_segments",
           "parse_segments", "segment_rows", "segment_spans"]


@dataclass(frozen=True)
class Segment:
    """One window of a clip: ``start_s``..``end_s`` (seconds), its top-k ``(label, probability)`` pairs, best
    first, and its answer (the top label, or ``unknown`` below ``--unknown-below``)."""

    start_s: float
    end_s: float
    top: list[tuple[str, float]]
    answer: str


def auto_seconds(duration: float, min_seconds: float = 0.0) -> float:
    """The window for ``segments=auto``: the shortest of :data:`AUTO_STEPS` giving at most :data:`AUTO_CELLS`
    windows over ``duration`` seconds (the longest step for longer files), and never shorter than
    ``min_seconds``, the model's alignment step in seconds (a shorter window is refused by
    :func:`check_segment_length`; ``min_seconds`` itself when it exceeds every step)."""
    steps = [s for s in AUTO_STEPS if s >= min_seconds * (1 - 1e-9)] or [min_seconds]
    return next((s for s in steps if math.ceil(duration / s - 1e-9) <= AUTO_CELLS), steps[-1])


def check_segments(seconds: float | None) -> float | None:
    """``seconds`` if it is a positive finite number (or None: no segments); else
    :class:`~specstore.common.ConfigError`."""
    if seconds is None:
        return None
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds) \
            or seconds <= 0:
        raise ConfigError(f"segments must be a positive number of seconds, got {seconds!r}")
    return float(seconds)


def parse_segments(text: str) -> float:
    """``--segments``'s parser: a positive number of seconds (0, negatives, nan and inf refused)."""
    try:
        seconds = check_segments(float(text))
    except (ValueError, ConfigError):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}") from None
    assert seconds is not None
    return seconds


def check_segment_length(seconds: float, frame_seconds: float, align: int = 1) -> float:
    """``seconds`` if it is positive and at least one alignment step (``align`` frames of ``frame_seconds``);
    else :class:`~specstore.common.ConfigError`."""
    checked = check_segments(seconds)
    assert checked is not None
    step_s = align * frame_seconds
    if checked < step_s * (1 - 1e-9):
        raise ConfigError(f"segments of {checked:g} s are shorter than the model's time step ({align} frames, "
                          f"{step_s:.3f} s)")
    return checked


def segment_spans(n_frames: int, duration: float, seconds: float, frame_seconds: float,
                  align: int = 1) -> list[tuple[float, float, int, int]]:
    """``(start_s, end_s, start_frame, stop_frame)`` of each segment of a clip (see the module docstring).

    ``n_frames``: the clip's frames; ``duration``: its seconds of audio;
    ``frame_seconds``: seconds per frame; ``align``: the model's window
    alignment (frames).  Raises :class:`~specstore.common.ConfigError` when
    ``seconds`` is shorter than one alignment step.
    """
    seconds = check_segment_length(seconds, frame_seconds, align)
    step_s = align * frame_seconds
    count = max(1, math.ceil(duration / seconds - 1e-9))
    out: list[tuple[float, float, int, int]] = []
    for k in range(count):
        start = min(round(k * seconds / step_s) * align, n_frames)
        stop = n_frames if k == count - 1 else min(round((k + 1) * seconds / step_s) * align, n_frames)
        if stop <= start:  # only when the frames end before the nominal duration: the rest joins the last
            break
        out.append((round(k * seconds, 6), round(min((k + 1) * seconds, duration), 6), start, stop))
    s0, _, f0, _ = out[-1]  # the last segment ends at the clip's end, in seconds and in frames
    out[-1] = (s0, duration, f0, n_frames)
    return out


def segment_rows(probs: np.ndarray, spans: Sequence[tuple[float, float, int, int]], labels: Sequence[str],
                 topk: int, unknown_below: float | None = None) -> list[Segment]:
    """The :class:`Segment` of each span from its probabilities (``probs[i]`` for ``spans[i]``)."""
    from .model import top_k  # here: the option's parser above is imported by the CLI before torch is

    out = []
    for p, (start_s, end_s, _, _) in zip(probs, spans, strict=True):
        top = top_k(p, labels, topk)
        out.append(Segment(start_s, end_s, top, answer(top[0][0], top[0][1], unknown_below)))
    return out

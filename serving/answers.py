"""What the classify service answers, as types: one :class:`Classified` or :class:`Failed` per file, and the
request's :class:`Answer`.  :mod:`serving.responses` writes them as JSON."""

from __future__ import annotations

from dataclasses import dataclass

from .segments import Segment

__all__ = ["Answer", "Classified", "Failed", "FileAnswer"]


@dataclass(frozen=True)
class Classified:
    """One file classified: its ``duration`` (s), feature ``frames``, the ``top`` (label, probability) pairs,
    most probable first, its log-mel ``picture`` (PNG bytes) when one was asked for, and its ``segments``
    (genre over time, windows of ``segment_s`` seconds, :mod:`serving.segments`) when they were asked for."""

    file: str
    duration: float
    frames: int
    top: list[tuple[str, float]]
    picture: bytes | None = None
    segments: list[Segment] | None = None
    segment_s: float | None = None


@dataclass(frozen=True)
class Failed:
    """One file not classified, with a one-line ``error``; ``server_fault`` when the server failed (the model,
    the batcher), not the upload."""

    file: str
    error: str
    server_fault: bool = False


FileAnswer = Classified | Failed


@dataclass(frozen=True)
class Answer:
    """A request's answer: the model's file name, its labels and one answer per file, in upload order;
    ``outputs``: ``"classes"`` (probabilities, a softmax) or ``"tags"`` (a tagger's independent scores);
    ``temperature``: the checkpoint's calibration temperature a softmax was made with (None: uncalibrated,
    plain softmax; always None for a tagger, whose scores take none; :mod:`infer.calibration`)."""

    model: str
    labels: list[str]
    files: list[FileAnswer]
    outputs: str = "classes"
    temperature: float | None = None

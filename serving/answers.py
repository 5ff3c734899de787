"""What the classify service answers, as types and as JSON: one :class:`Classified` or :class:`Failed` per file,
and the request's :class:`Answer`.

:func:`answer_json` is the one answer shape of both ``POST /classify``
(:mod:`specstore.serving.responses` sends it) and ``specstore classify --json``
(:mod:`specstore.serving.cli` prints it)::

    {"model": "genre.pt", "labels": [...], "outputs": "classes",
     "calibration": "temperature", "temperature": 1.7,
     "files": [{"file": "song.mp3", "duration_s": 212.4, "frames": 9148, "answer": "jazz",
                "top": [{"label": "jazz", "prob": 0.81}, ...],
                "segment_s": 10.0, "segments": [{"start_s": 0.0, "end_s": 10.0, "answer": "jazz", "top": [...]}]},
               {"file": "notes.txt", "error": "not an audio file: Format not recognised."}]}

A tagger's (``"outputs": "tags"``) has no ``calibration``/``temperature`` and
no ``answer``, and ``"tags": [{"tag", "score"}]`` in place of ``top``.
``segment_s``/``segments`` only when windows were asked for; the server adds
``picture``/``picture_axes`` when asked (``picture=1``).
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .segments import Segment

if TYPE_CHECKING:
    from .picture import PictureScale

__all__ = ["Answer", "Classified", "Failed", "FileAnswer", "answer_json", "file_json", "model_name"]


@dataclass(frozen=True)
class Classified:
    """One file classified: its ``duration`` (s), feature ``frames``, the ``top`` (label, probability) pairs,
    most probable first, its log-mel ``picture`` (PNG bytes) when one was asked for, and its ``segments``
    (genre over time, windows of ``segment_s`` seconds, :mod:`specstore.serving.segments`) when they were asked for.
    ``answer``: the file's answer (``classify --unknown-below`` may make it ``unknown``); None: the top label."""

    file: str
    duration: float
    frames: int
    top: list[tuple[str, float]]
    picture: bytes | None = None
    segments: list[Segment] | None = None
    segment_s: float | None = None
    answer: str | None = None


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
    plain softmax; always None for a tagger, whose scores take none; :mod:`specstore.infer.models.calibration`)."""

    model: str
    labels: list[str]
    files: list[FileAnswer]
    outputs: str = "classes"
    temperature: float | None = None


def model_name(source: str) -> str:
    """How an answer names the model: its checkpoint's file name (never the server's path to it), or a shipped
    model's name."""
    return source.replace("\\", "/").rsplit("/", 1)[-1]


def _scores(answer: str, top: list[tuple[str, float]], outputs: str) -> dict[str, Any]:
    """``{"answer", "top": [{"label", "prob"}]}``, or a tagger's ``{"tags": [{"tag", "score"}]}`` (independent
    scores: no single answer)."""
    if outputs == "tags":
        return {"tags": [{"tag": label, "score": round(p, 6)} for label, p in top]}
    return {"answer": answer, "top": [{"label": label, "prob": round(p, 6)} for label, p in top]}


def file_json(answer: FileAnswer, scale: PictureScale | None = None, outputs: str = "classes") -> dict[str, Any]:
    """One file's answer: ``{"file", "duration_s", "frames", "answer", "top": [{"label", "prob"}], "picture"?,
    "picture_axes"?, "segment_s"?, "segments"?}`` (a PNG data URL; its tick labels by ``scale``,
    :meth:`PictureScale.axes`; each segment ``{"start_s", "end_s", "answer", "top"}``) or ``{"file",
    "error"}``.  A tagger's (``outputs == "tags"``) carries ``"tags": [{"tag", "score"}]`` (independent
    scores) instead of ``"answer"`` and ``"top"``, in the file and in each segment."""
    if not isinstance(answer, Classified):
        return {"file": answer.file, "error": answer.error}
    said = answer.answer if answer.answer is not None else answer.top[0][0]
    out: dict[str, Any] = {
        "file": answer.file, "duration_s": round(answer.duration, 3), "frames": answer.frames,
        **_scores(said, answer.top, outputs),
    }
    if answer.picture is not None:
        out["picture"] = "data:image/png;base64," + base64.b64encode(answer.picture).decode("ascii")
        if scale is not None:
            out["picture_axes"] = scale.axes(answer.frames)
    if answer.segments is not None:
        out["segment_s"] = answer.segment_s
        out["segments"] = [{"start_s": round(s.start_s, 3), "end_s": round(s.end_s, 3),
                            **_scores(s.answer, s.top, outputs)} for s in answer.segments]
    return out


def answer_json(answer: Answer, scale: PictureScale | None = None) -> dict[str, Any]:
    """The answer's JSON (the module docstring's shape): model, labels, ``outputs`` (``classes`` or ``tags``),
    for a single-label model its ``calibration`` (``temperature`` or ``uncalibrated``) with its
    ``temperature`` (null when uncalibrated) -- a tagger's answer has neither key (its independent scores take
    no temperature) -- and one object per file (:func:`file_json`)."""
    from specstore.infer.models.calibration import calibration_fields

    cal = calibration_fields(answer.temperature, answer.outputs)
    return {"model": answer.model, "labels": answer.labels, "outputs": answer.outputs, **cal,
            "files": [file_json(a, scale, answer.outputs) for a in answer.files]}

"""A deliberately tiny model in seconds, for a notebook that has a labelled store but no checkpoint."""

from __future__ import annotations

import os
from typing import Any

from specstore.store import Store

from ..train import TrainConfig, TrainResult, train

__all__ = ["quick_train"]


def quick_train(store: str | os.PathLike[str] | Store, model_path: str | os.PathLike[str], *, epochs: int = 20,
                width: int = 8,
                crop_seconds: float | None = 4.0, seed: int = 0, progress: bool = False,
                **overrides: Any) -> TrainResult:
    """A tiny model (``width`` channels, ``crop_seconds`` crops, ``epochs`` passes) for a quick look.

    Seconds on a CPU for a few dozen clips; not a substitute for ``make
    train``.  Raises :class:`specstore.infer.train.TrainError` when the store has no
    usable labels.  A finished run at ``model_path`` with the same settings
    is reused (training resumes, so rerunning a notebook costs nothing).
    """
    fields: dict[str, Any] = {"epochs": epochs, "width": width, "crop_seconds": crop_seconds, "seed": seed,
                              "device": "cpu"}
    fields.update(overrides)
    return train(store, model_path, TrainConfig.from_dict(fields), progress=progress, overwrite=True)

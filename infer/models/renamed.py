"""Import paths that model files written before the ``specstore`` namespace record, and what they name now.

A checkpoint names an import-path model (a sum, a head on a shipped
backbone, the musicnn tagger) and a registered architecture's builder by
``package.module:Class``.  Files written before the project's packages moved
under ``specstore`` hold the bare names (``infer.models.ensemble:SumClassifier``);
:func:`current_import_path` maps exactly those, by this table, when a file is
read.  Nothing else is mapped: a user's own module keeps the name it was
recorded under, and no import alias makes the old names importable.  When a
shipped class moves again, its old paths get a row here.
"""

from __future__ import annotations

__all__ = ["RENAMED", "current_import_path"]

RENAMED: dict[str, str] = {
    "infer.models.ensemble:SumClassifier": "specstore.infer.models.ensemble:SumClassifier",
    "infer.models.transfer:TransferClassifier": "specstore.infer.models.transfer:TransferClassifier",
    "infer.models.musicnn:MusiCNN": "specstore.infer.models.musicnn:MusiCNN",
    "infer.models.musicnn:build_musicnn": "specstore.infer.models.musicnn:build_musicnn",
    "infer.models.cnn:SpectrogramCNN": "specstore.infer.models.cnn:SpectrogramCNN",
    "infer.models.resnet:SpectrogramResNet": "specstore.infer.models.resnet:SpectrogramResNet",
}
"""Recorded import path -> the path that names the same class or builder today."""


def current_import_path(recorded: str) -> str:
    """The import path that names today what a model file recorded as ``recorded`` (unchanged unless it is in
    :data:`RENAMED`)."""
    return RENAMED.get(recorded, recorded)

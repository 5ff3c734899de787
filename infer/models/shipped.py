"""Models that ship with specstore, by name: wherever a checkpoint path is accepted, a shipped name is too.

``specstore classify song.mp3 --model musicnn-msd``, ``make infer MODEL=musicnn-mtt`` and ``make serve`` read
``--model`` through :func:`resolve_checkpoint`: a name registered here gives the shipped model as a
:class:`~specstore.infer.models.checkpoint.Checkpoint` (its weights, its labels, the
:class:`~specstore.store.FeatureSpec` of its input and what its outputs are); anything else is a checkpoint path, read
as before.  A path that exists wins over a name, so a file named ``musicnn-msd`` in the working folder is still read as
a file.

An entry names its loader by an import path (``package.module:function``, imported on first use, so ``--help``
and a bad name answer without torch): ``load(name) -> (nn.Module, list[str], FeatureSpec)``, the model with its
weights, its label vocabulary and its input's spec.  ``outputs`` says how its logits read: ``"tags"``
(independent sigmoid scores, several per clip: a multi-label tagger) or ``"classes"`` (one softmax over the labels).

The built-in entries are the two musicnn taggers (Pons and Serra 2019, ISC licence, (c) Music Technology Group,
Universitat Pompeu Fabra; weights converted from the ``musicnn`` 0.1.0 wheel): ``musicnn-msd`` (50 tags of the
Million Song Dataset's last.fm tags) and ``musicnn-mtt`` (50 MagnaTagATune tags).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specstore.common import ConfigError

if TYPE_CHECKING:
    from specstore.infer.models.checkpoint import Checkpoint

__all__ = ["OUTPUTS", "SHIPPED", "ShippedModel", "is_shipped", "load_shipped", "no_checkpoint_hint", "register_shipped",
           "resolve_checkpoint", "shipped_names", "unregister_shipped"]

OUTPUTS = ("classes", "tags")
"""How a model's logits read: one softmax over its labels, or independent sigmoid scores (a multi-label tagger)."""


@dataclass(frozen=True)
class ShippedModel:
    """A model shipped with specstore: ``name`` (what ``--model`` takes), ``loader`` (import path of
    ``load(name) -> (model, labels, FeatureSpec)``), ``outputs`` (:data:`OUTPUTS`), a one-line ``summary``
    and its ``licence`` (with attribution) for ``--help`` and the documents; ``fits``: the music it knows,
    and what it does not, so a user can pick a model (``classify --list-tags`` prints it)."""

    name: str
    loader: str
    outputs: str = "tags"
    summary: str = ""
    licence: str = ""
    fits: str = ""

    def __post_init__(self) -> None:
        if self.outputs not in OUTPUTS:
            raise ConfigError(f"outputs must be one of {OUTPUTS}, not {self.outputs!r}")


SHIPPED: dict[str, ShippedModel] = {}
"""The shipped models by name (:func:`register_shipped` adds one)."""


def register_shipped(entry: ShippedModel) -> ShippedModel:
    """Make ``entry.name`` a value ``--model`` accepts in this process (registering a name again replaces it)."""
    if not entry.name or os.sep in entry.name or entry.name.endswith(".pt"):
        raise ConfigError(f"a shipped model's name is a plain word, not a path: {entry.name!r}")
    SHIPPED[entry.name] = entry
    return entry


def unregister_shipped(name: str) -> None:
    """Remove ``name`` from the shipped models of this process (a test's stand-in; no error when absent)."""
    SHIPPED.pop(name, None)


def shipped_names() -> tuple[str, ...]:
    """The names of the shipped models, in registration order."""
    return tuple(SHIPPED)


def is_shipped(model: object) -> bool:
    """Whether ``model`` (a ``--model`` value) names a shipped model: a registered name that is not an existing
    file (a file of that name wins)."""
    return isinstance(model, str) and model in SHIPPED and not Path(model).exists()


def no_checkpoint_hint() -> str:
    """What to do when ``--model`` names no file: train one, or name a shipped model."""
    names = ", ".join(SHIPPED)
    return "train one with `make train`" + (f", or name a shipped model: {names}" if names else "")


def load_shipped(name: str) -> Checkpoint:
    """The shipped model ``name`` as a :class:`~specstore.infer.models.checkpoint.Checkpoint` (its ``extra`` records
    ``outputs``, ``shipped`` and ``licence``); :class:`~specstore.infer.models.checkpoint.CheckpointError` in one
    line when its weights cannot be read."""
    from specstore.infer.errors import CheckpointError
    from specstore.infer.models.checkpoint import Checkpoint
    from specstore.infer.models.registry import load_object

    entry = SHIPPED.get(name)
    if entry is None:
        raise CheckpointError(f"no shipped model {name!r}; shipped: {', '.join(SHIPPED) or 'none'}")
    try:
        loader: Any = load_object(entry.loader)
    except (ImportError, AttributeError) as e:
        raise CheckpointError(f"shipped model {name!r} is not available in this install ({entry.loader}: "
                              f"{type(e).__name__}: {e})") from None
    try:
        model, labels, spec = loader(name)
    except CheckpointError:
        raise
    except ConfigError as e:  # the loader's own one-line error (missing or damaged weights)
        raise CheckpointError(str(e)) from None
    extra = {"outputs": entry.outputs, "shipped": name, "licence": entry.licence, "note": entry.summary}
    ckpt = Checkpoint.from_model(model, list(labels), spec.kind, spec, extra=extra)
    ckpt.source = name
    return ckpt


def resolve_checkpoint(model: str | os.PathLike[str]) -> Checkpoint:
    """``--model``'s value as a checkpoint: a shipped model's name (:func:`is_shipped`) or a checkpoint path
    (:func:`~specstore.infer.models.checkpoint.load_checkpoint`)."""
    from specstore.infer.models.checkpoint import load_checkpoint

    if is_shipped(model):
        return load_shipped(str(model))
    return load_checkpoint(model)


_MUSICNN_LICENCE = ("ISC licence, (c) 2019 Music Technology Group, Universitat Pompeu Fabra (musicnn 0.1.0, "
                    "Pons and Serra); weights converted to plain tensors")
register_shipped(ShippedModel(
    "musicnn-msd", "specstore.infer.models.pretrained:load_musicnn", "tags",
    "musicnn trained on the Million Song Dataset: 50 last.fm tags (genres, moods, eras, instruments)",
    _MUSICNN_LICENCE,
    fits="popular music: rock, pop, metal, jazz, blues, folk, country, Hip-Hop, electronic, soul, funk, eras and "
         "moods; it has no classical tag, so classical and orchestral recordings come out as ambient or "
         "instrumental: use musicnn-mtt for them"))
register_shipped(ShippedModel(
    "musicnn-mtt", "specstore.infer.models.pretrained:load_musicnn", "tags",
    "musicnn trained on MagnaTagATune: 50 tags (instruments, genres, moods)", _MUSICNN_LICENCE,
    fits="classical and orchestral music and instruments: classical, strings, violin, cello, piano, harpsichord, "
         "harp, flute, choir, opera, and vocals or none; its popular genres are few (rock, pop, techno, metal, "
         "country, dance): use musicnn-msd for those"))

"""A tiny stand-in for a shipped model (:mod:`specstore.infer.models.shipped`), so the shipped-model paths are tested
without the real weights: a built-in CNN (width 4) on :data:`factories.SPEC16` with a fixed seed, as a 5-tag tagger.

:func:`registered` adds it to the shipped registry as ``tiny-tags`` for a block (``load(name) -> (model, tags,
spec)``, the loader contract).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from factories import SPEC16

TAGS = ["rock", "jazz", "ambient", "female vocalists", "80s"]
NAME = "tiny-tags"


def load(name: str) -> tuple[Any, list[str], Any]:
    """The stand-in tagger with fixed weights (seed 7) and non-trivial BatchNorm statistics."""
    import torch

    from specstore.infer.models import ModelConfig, build_model
    from specstore.infer.options.defaults import PLAIN_MODEL

    torch.manual_seed(7)
    model = build_model(ModelConfig(**{**PLAIN_MODEL, "width": 4, "depth": 2, "n_bins": SPEC16.n_bins,
                                       "n_classes": len(TAGS)}))
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
    return model.eval(), list(TAGS), SPEC16


@contextmanager
def registered() -> Iterator[str]:
    """The stand-in registered as :data:`NAME` while the block runs (so no other test's store, whose mel is the
    stand-in's input, finds it as a backbone)."""
    from specstore.infer.models.shipped import ShippedModel, register_shipped, unregister_shipped

    register_shipped(ShippedModel(NAME, "shipped_stub:load", "tags", "a test stand-in", "test only"))
    try:
        yield NAME
    finally:
        unregister_shipped(NAME)


@pytest.fixture(scope="module", autouse=True)
def stand_in() -> Iterator[str]:
    """The stand-in tagger registered for the whole test module that imports this fixture."""
    with registered() as name:
        yield name

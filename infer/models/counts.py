"""Parameters of a model a file describes, counted from its description alone, before anything is built.

A file (a checkpoint, a sum of models' member list) may build, without trust, the built-in architectures (counted from
their :class:`~specstore.infer.models.ModelConfig`, :mod:`specstore.infer.models.sizes`) and the model classes that ship
with specstore (:data:`specstore.infer.models.trust.SHIPPED_MODELS`), each of which counts its own from its keyword
arguments (its ``count_parameters`` class method).  :func:`spec_parameters` is that count for any
:class:`~specstore.infer.models.contract.ModelSpec` a file may build; code that needs trust is refused as building would
refuse it (:class:`~specstore.infer.models.trust.UntrustedModelError`), and code trusted by the allow-list
(``SPECSTORE_TRUSTED_MODULES``) counts as nothing (its size is its author's business, as with ``--trust-model-code``). A
sum of models bounds its members' total this way before its first member exists.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from specstore.common import ConfigError
from specstore.infer.models.trust import SHIPPED_MODELS, check_trusted

if TYPE_CHECKING:
    from specstore.infer.models.contract import ModelSpec

__all__ = ["spec_parameters"]


def spec_parameters(spec: ModelSpec, *, source: str = "") -> int:
    """Parameters of the model ``spec`` builds without trust, from its config or keyword arguments alone (0 for
    allow-listed user code); one-line :class:`~specstore.common.ConfigError` for a bad one and
    :class:`~specstore.infer.models.trust.UntrustedModelError` for code that needs trust, ``source`` naming the file."""
    from specstore.infer.models.contract import resolve_class

    if spec.builtin:
        if spec.config is None:  # an architecture registered from user code, not registered here: needs trust
            check_trusted(spec.builder, False, source=source)
        config = spec.config
        assert config is not None
        return config.n_parameters
    check_trusted(spec.target, False, source=source)
    if spec.target not in SHIPPED_MODELS:  # a module the allow-list trusts: its size is its author's business
        return 0
    cls: Any = resolve_class(spec.target, False, source=source)  # (each shipped class has count_parameters)
    try:
        return int(cls.count_parameters(**spec.kwargs))
    except TypeError as e:
        raise ConfigError(f"cannot build {spec.target} with {spec.kwargs}: {e}") from None

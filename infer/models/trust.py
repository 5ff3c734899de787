"""Which model code may be imported: the built-in models always, a user model only when trusted.

A checkpoint, a training config file (TOML, or a run's ``MODEL.config.json``)
may name its model by an import path ``package.module:Class``.  Building that
model imports the module, and importing runs the module's top-level code, so
a model file from elsewhere would be as trusted as a pickle.  The rule (as
Hugging Face's ``trust_remote_code``):

* the built-ins (``cnn``, ``resnet``) load freely, and so do the model
  classes that ship with specstore (:data:`SHIPPED_MODELS`: the pretrained
  musicnn, a head on a pretrained backbone, a sum of models), each of
  which counts its parameters from its keyword arguments and refuses more
  than its bound before it allocates anything;
* code you name yourself is trusted for that call: ``--arch pkg:Cls`` on the
  ``train`` command line (``make train ARCH=pkg:Cls``), an import path or an
  ``nn.Module`` passed to :func:`specstore.infer.train` / :func:`specstore.infer.engine.predict` /
  :func:`specstore.infer.evaluation.evaluate` as the model;
* code a file names (a checkpoint, a config file) loads only when the caller
  says so: ``--trust-model-code`` (``make ... TRUST_MODEL_CODE=1``,
  ``trust_model_code=True`` in Python), or when its module, or a package
  above it, is listed in the environment variable ``SPECSTORE_TRUSTED_MODULES``
  (comma-separated, e.g. ``mypkg,yourmodule``);
* otherwise :class:`UntrustedModelError`, one line naming the flag, raised
  before anything is imported.

So a checkpoint trained with ``make train ARCH=yourmodule:YourNet`` needs the
flag (or the allow-list) again when ``make infer`` loads it later.

An import path names a class defined in that module by its own name: no
attribute chain (``pkg.mod:nn.Linear``), nothing the module merely imported
(:func:`check_import_path` before the import, :func:`check_defined` after),
so trusting a module trusts its classes, not everything it can reach.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Collection
from typing import Any

from specstore.common import ConfigError
from specstore.infer.errors import UntrustedModelError

__all__ = ["SHIPPED_MODELS", "TRUST_ENV", "Trust", "UntrustedModelError", "add_trust_argument", "check_defined",
           "check_import_path", "check_trusted", "is_trusted", "trusted_modules", "with_named"]

TRUST_ENV = "SPECSTORE_TRUSTED_MODULES"
"""Environment variable: comma-separated modules (or packages) whose model classes load without the flag."""

SHIPPED_MODELS = ("specstore.infer.models.musicnn:MusiCNN", "specstore.infer.models.transfer:TransferClassifier",
                  "specstore.infer.models.ensemble:SumClassifier")
"""The model classes that ship with specstore and build from a file without trust, as the built-in architectures
do: the pretrained musicnn (a shipped model's checkpoint names it), a head on a pretrained backbone and a sum of
models.  Each counts its parameters from its keyword arguments before it allocates anything (``count_parameters``)
and refuses more than :data:`~specstore.infer.models.MAX_PARAMETERS`; no other class of the package is a model a file
may ask for."""

Trust = bool | Collection[str]
"""A ``trust_model_code`` argument: True (every import path), False (none but :data:`TRUST_ENV`'s), or the
import paths / modules / packages trusted for this call."""


def trusted_modules() -> tuple[str, ...]:
    """The modules and packages listed in :data:`TRUST_ENV` (empty when it is unset)."""
    return tuple(name.strip() for name in os.environ.get(TRUST_ENV, "").split(",") if name.strip())


def _covers(name: str, target: str) -> bool:
    """Whether a trusted ``name`` (an import path, a module or a package) covers ``target``."""
    module = target.partition(":")[0]
    return name == target or name == module or module.startswith(name + ".")


def is_trusted(target: str, trust: Trust = False) -> bool:
    """Whether the import path ``target`` (``package.module:Class``) may be imported under ``trust``."""
    if trust is True or target in SHIPPED_MODELS:
        return True
    names = [*trusted_modules(), *(() if trust is False else trust)]
    return any(_covers(name, target) for name in names)


def with_named(trust: Trust, *targets: str) -> Trust:
    """``trust`` plus ``targets``: the import paths a caller named itself, trusted for this call."""
    if trust is True:
        return True
    return [*(() if trust is False else trust), *targets]


def check_import_path(target: str, *, source: str = "") -> tuple[str, str]:
    """``(module, name)`` of an import path ``package.module:Name`` that names its class directly (a Python
    identifier after the colon, no attribute chain); :class:`~specstore.common.ConfigError` in one line otherwise."""
    module, sep, name = target.partition(":") if isinstance(target, str) else ("", "", "")
    if not sep or not module or not all(part.isidentifier() for part in module.split(".")):
        raise ConfigError(f"{source or 'the model'} names its model by {target!r}, which is not an import path "
                          "'package.module:Class'")
    if not name.isidentifier():
        raise ConfigError(f"{source or 'the model'} names its model by {target!r}: an import path names a class "
                          f"defined in its module by its own name, not an attribute chain ({name!r})")
    return module, name


def check_defined(target: str, obj: Any) -> None:
    """Refuse (one line) an ``obj`` imported for ``target`` that its module did not define (an imported name,
    e.g. ``torch.nn.Linear`` seen through a module that imports it)."""
    module, _, name = target.partition(":")
    if getattr(obj, "__module__", None) != module or getattr(obj, "__qualname__", None) != name:
        where = f"{getattr(obj, '__module__', '?')}:{getattr(obj, '__qualname__', '?')}"
        raise ConfigError(f"{target!r} is not a class defined in {module!r} (it is {where}); an import path names "
                          "a class where it is defined")


def check_trusted(target: str, trust: Trust = False, *, source: str = "") -> None:
    """Raise :class:`UntrustedModelError` unless ``target`` may be imported; ``source`` names the file.  A
    malformed path or an attribute chain is refused first, trusted or not (:func:`check_import_path`)."""
    check_import_path(target, source=source)
    if is_trusted(target, trust):
        return
    module = target.partition(":")[0]
    raise UntrustedModelError(
        f"{source or 'the model'} names its model by the import path {target!r}; building it imports {module!r}, "
        f"which runs that module's code: pass --trust-model-code (make: TRUST_MODEL_CODE=1; Python: "
        f"trust_model_code=True) if you trust it, or add {module!r} to {TRUST_ENV}")


def add_trust_argument(parser: argparse.ArgumentParser, what: str) -> None:
    """``--trust-model-code`` on a command line: the one wording of the flag for every command that loads models
    (``what``: the file whose model it trusts, e.g. "a checkpoint")."""
    parser.add_argument("--trust-model-code", action="store_true",
                        help=f"allow {what} to import the module its model's import path (package.module:Class) "
                             "names, which runs that module's code; built-in models need no trust (or list trusted "
                             f"modules in {TRUST_ENV}, comma-separated)")

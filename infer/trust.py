"""Which model code may be imported: the built-in models always, a user model only when trusted.

A checkpoint, a training config file (TOML, or a run's ``MODEL.config.json``)
may name its model by an import path ``package.module:Class``.  Building that
model imports the module, and importing runs the module's top-level code, so
a model file from elsewhere would be as trusted as a pickle.  The rule (as
Hugging Face's ``trust_remote_code``):

* the built-ins (``cnn``, ``resnet``) load freely;
* code you name yourself is trusted for that call: ``--arch pkg:Cls`` on the
  ``train`` command line (``make train ARCH=pkg:Cls``), an import path or an
  ``nn.Module`` passed to :func:`infer.train` / :func:`infer.predict` /
  :func:`infer.evaluate` as the model;
* code a file names (a checkpoint, a config file) loads only when the caller
  says so: ``--trust-model-code`` (``make ... TRUST_MODEL_CODE=1``,
  ``trust_model_code=True`` in Python), or when its module, or a package
  above it, is listed in the environment variable ``SPECSTORE_TRUSTED_MODULES``
  (comma-separated, e.g. ``mypkg,yourmodule``);
* otherwise :class:`UntrustedModelError`, one line naming the flag, raised
  before anything is imported.

So a checkpoint trained with ``make train ARCH=yourmodule:YourNet`` needs the
flag (or the allow-list) again when ``make infer`` loads it later.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Collection

from store import ConfigError

__all__ = ["TRUST_ENV", "Trust", "UntrustedModelError", "add_trust_argument", "check_trusted", "is_trusted",
           "trusted_modules", "with_named"]

TRUST_ENV = "SPECSTORE_TRUSTED_MODULES"
"""Environment variable: comma-separated modules (or packages) whose model classes load without the flag."""

SHIPPED_PREFIX = "infer.models."
"""Model classes under this package ship with specstore (e.g. the transfer head on a pretrained backbone,
:mod:`infer.models.transfer`): an import path under it is trusted, as the built-in architectures are."""

Trust = bool | Collection[str]
"""A ``trust_model_code`` argument: True (every import path), False (none but :data:`TRUST_ENV`'s), or the
import paths / modules / packages trusted for this call."""


class UntrustedModelError(ConfigError):
    """A file names model code (an import path) that the caller has not trusted; one line naming the flag."""


def trusted_modules() -> tuple[str, ...]:
    """The modules and packages listed in :data:`TRUST_ENV` (empty when it is unset)."""
    return tuple(name.strip() for name in os.environ.get(TRUST_ENV, "").split(",") if name.strip())


def _covers(name: str, target: str) -> bool:
    """Whether a trusted ``name`` (an import path, a module or a package) covers ``target``."""
    module = target.partition(":")[0]
    return name == target or name == module or module.startswith(name + ".")


def is_trusted(target: str, trust: Trust = False) -> bool:
    """Whether the import path ``target`` (``package.module:Class``) may be imported under ``trust``."""
    if trust is True or target.startswith(SHIPPED_PREFIX):
        return True
    names = [*trusted_modules(), *(() if trust is False else trust)]
    return any(_covers(name, target) for name in names)


def with_named(trust: Trust, *targets: str) -> Trust:
    """``trust`` plus ``targets``: the import paths a caller named itself, trusted for this call."""
    if trust is True:
        return True
    return [*(() if trust is False else trust), *targets]


def check_trusted(target: str, trust: Trust = False, *, source: str = "") -> None:
    """Raise :class:`UntrustedModelError` unless ``target`` may be imported; ``source`` names the file."""
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

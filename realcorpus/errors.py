"""The real-instrument corpus generator's error, in the package's one errors module.

A :class:`specstore.common.errors.ConfigError` (so also a ``ValueError``): every command prints it as one line
(:func:`specstore.common.cli.run_cli`).
"""

from __future__ import annotations

from specstore.common.errors import ConfigError

__all__ = ["RealCorpusError"]


class RealCorpusError(ConfigError):
    """Bad arguments, a missing renderer or SoundFont, or an output folder that is not ours."""

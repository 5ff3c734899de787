"""The demo corpus generator's error, in the package's one errors module.

A :class:`specstore.common.errors.ConfigError` (so also a ``ValueError``): every command prints it as one line
(:func:`specstore.common.cli.run_cli`).
"""

from __future__ import annotations

from specstore.common.errors import ConfigError

__all__ = ["DemoCorpusError"]


class DemoCorpusError(ConfigError):
    """Bad arguments, or an output directory that would mix this corpus with other files.

    A :class:`specstore.common.ConfigError` (so also a ``ValueError``): commands report it as one line.
    """

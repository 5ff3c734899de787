"""What every package of specstore shares: errors, the command-line handler, option generation and bounds,
lazy exports, atomic writes, memory tuning and dataclass records.

The bottom of the project: it imports nothing of specstore's, and nothing
heavier than the standard library at import time.  ``store``, ``pipeline``,
``infer``, ``serving`` and the corpus generators build on it.
"""

if __name__ != "specstore.common":  # one name per module: the folder is imported through specstore/
    raise ImportError(f"specstore's common/ is the package specstore.common; import it by that name, not as "
                      f"{__name__!r}")

from typing import TYPE_CHECKING

from .lazy import lazy_package

__all__ = lazy_package(__name__)

if TYPE_CHECKING:  # the exports (each imported on first use)
    from .atomic import atomic_path, check_output_path, open_output, write_atomic
    from .cli import PROG, one_line, run_cli, setup_logging
    from .errors import ConfigError, OutputPathError, SpecstoreError
    from .limits import Limit, bounded, check_fields, field_limit
    from .options import add_options, option
    from .records import from_record

"""specstore's feature store: a zarr v3 group of ragged spectrograms with a length index.

This package is the stable centre of the project and knows nothing of audio
or torch.  The format is documented in ``store/FORMAT.md``.  What every package
shares (errors, options, atomic writes) is :mod:`specstore.common`.
"""

if __name__ != "specstore.store":  # one name per module: the folder is imported through specstore/
    raise ImportError(f"specstore's store/ is the package specstore.store; import it by that name, not as "
                      f"{__name__!r}")

from typing import TYPE_CHECKING

from specstore.common.lazy import lazy_package

__all__ = lazy_package(__name__)

if TYPE_CHECKING:  # the exports, each imported on first use (specstore.common.lazy)
    from .create import create_store
    from .errors import (
        IndexCorrupt,
        SpecMismatch,
        StoreCorrupt,
        StoreError,
        StoreLocked,
        StoreNotFound,
        StoreUnavailable,
    )
    from .layout import FORMAT_VERSION, escape_path, unescape_path
    from .metadata import Corpus
    from .reader import FeatureView, Store, open_store
    from .shard_writer import ShardInfo, ShardWriter, StoredClip, write_shard
    from .spec import COMPUTE_VERSION, FeatureSpec, default_specs, spec_differences
    from .stacking import stack_parts
    from .validate import validate
    from .writer import ErrorRow, IndexRow, RepairReport, StoreWriter

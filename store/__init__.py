"""specstore's feature store: a zarr v3 group of ragged spectrograms with a length index.

This package is the stable centre of the project and knows nothing of audio
or torch.  The format is documented in ``store/FORMAT.md``.
"""

from .errors import SpecMismatch, StoreCorrupt, StoreError, StoreNotFound
from .layout import FORMAT_VERSION
from .reader import FeatureView, Store, open_store
from .spec import FeatureSpec, default_specs, spec_differences
from .validate import validate
from .writer import ErrorRow, IndexRow, ShardInfo, StoredClip, StoreWriter, create_store, write_shard

__all__ = [
    "FORMAT_VERSION", "ErrorRow", "FeatureSpec", "FeatureView", "IndexRow", "ShardInfo", "SpecMismatch",
    "Store", "StoreCorrupt", "StoreError", "StoreNotFound", "StoreWriter", "StoredClip", "create_store",
    "default_specs", "open_store", "spec_differences", "validate", "write_shard",
]

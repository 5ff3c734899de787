"""specstore's feature store: a zarr v3 group of ragged spectrograms with a length index.

This package is the stable centre of the project and knows nothing of audio
or torch.  The format is documented in ``store/FORMAT.md``.
"""

from .atomic import atomic_path, check_output_path, write_atomic
from .errors import (
    PROG,
    ConfigError,
    OutputPathError,
    SpecMismatch,
    SpecstoreError,
    StoreCorrupt,
    StoreError,
    StoreLocked,
    StoreNotFound,
    run_cli,
)
from .layout import FORMAT_VERSION, escape_path, unescape_path
from .metadata import Corpus
from .reader import FeatureView, Store, open_store
from .shard_writer import ShardInfo, ShardWriter, StoredClip, write_shard
from .spec import FeatureSpec, default_specs, spec_differences
from .stacking import stack_parts
from .validate import validate
from .writer import ErrorRow, IndexRow, RepairReport, StoreWriter, create_store

__all__ = [
    "FORMAT_VERSION", "PROG", "ConfigError", "Corpus", "ErrorRow", "OutputPathError", "RepairReport",
    "SpecstoreError", "StoreLocked", "atomic_path", "check_output_path", "escape_path", "run_cli", "unescape_path",
    "write_atomic", "FeatureSpec", "FeatureView", "IndexRow", "ShardInfo", "ShardWriter", "SpecMismatch", "Store",
    "StoreCorrupt", "StoreError", "StoreNotFound", "StoreWriter", "StoredClip", "create_store", "default_specs",
    "open_store", "spec_differences", "stack_parts", "validate", "write_shard",
]

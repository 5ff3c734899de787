"""Columnar tables (the clip index, the error table) as groups of 1-D zarr arrays."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import zarr
import zarr.codecs

from .errors import StoreCorrupt

__all__ = ["read_columns", "write_columns", "empty_column"]

#: numpy dtype kinds a column may be read as: strings (zarr's, numpy's, objects), integers, floats.
_KINDS = {"str": "TUO", "i": "iu", "f": "f"}


def empty_column(dtype: str) -> np.ndarray:
    """A zero-length column of ``dtype`` (``"str"`` = variable-length UTF-8)."""
    return np.array([], dtype=np.dtypes.StringDType() if dtype == "str" else dtype)


def write_columns(root: zarr.Group, path: str, columns: Mapping[str, np.ndarray], schema: Mapping[str, str]) -> None:
    """Write ``columns`` as arrays of a new group at ``path`` (one chunk each, zstd)."""
    group = root.create_group(path, overwrite=True)
    for name, dtype in schema.items():
        values = columns[name]
        arr = group.create_array(
            name, shape=values.shape, chunks=(max(len(values), 1),),
            dtype=str if dtype == "str" else dtype,
            compressors=zarr.codecs.ZstdCodec(level=3), config={"write_empty_chunks": True},
        )
        if len(values):
            arr[...] = values


def read_columns(root: zarr.Group, path: str | None, schema: Mapping[str, str]) -> dict[str, np.ndarray]:
    """Read a table written by :func:`write_columns` (empty columns when ``path`` is None)."""
    if path is None:
        return {name: empty_column(dt) for name, dt in schema.items()}
    try:
        group: Any = root[path]
        out = {name: np.asarray(group[name][...]) for name in schema}
    except KeyError as e:
        raise StoreCorrupt(f"the committed table {path} is missing column {e}") from None
    for name, dtype in schema.items():
        kinds = _KINDS["str" if dtype == "str" else np.dtype(dtype).kind]
        if out[name].ndim != 1 or out[name].dtype.kind not in kinds:
            raise StoreCorrupt(f"the committed table {path} has a column {name} of {out[name].dtype} "
                               f"{out[name].shape}; the format says 1-D {dtype}")
    lengths = {len(v) for v in out.values()}
    if len(lengths) > 1:
        raise StoreCorrupt(f"the committed table {path} has columns of different lengths")
    return out

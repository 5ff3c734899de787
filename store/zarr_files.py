"""zarr v3 nodes written as plain files on a local disk, for a store's small and frequent writes.

zarr-python spends milliseconds of CPU creating a group or an array, whatever its size (its event loop,
a thread hop per file operation, metadata validation; figures in docs/measurements.md).  A store creates
many small nodes: every extraction task a shard (a group, an array per feature), every commit an index generation (two
groups, twelve one-chunk columns).  On a local disk those are written here as the files zarr writes:
an array's ``zarr.json`` is the document zarr writes for the same creation options (made once per
process by zarr itself, see :func:`zarr_document`, then given its shape), and chunks are encoded by
the numcodecs codecs zarr uses.  ``tests/store/test_format_plain_zarr.py`` checks every file against
zarr's own output.  Stores elsewhere (fsspec URLs) go through zarr.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import zarr
import zarr.storage

from specstore.common.atomic import write_atomic

__all__ = ["write_array_document", "write_group_document", "zarr_document"]


def zarr_document(create: Callable[[zarr.storage.LocalStore], object]) -> str:
    """The ``zarr.json`` that ``create`` (a zarr call making one array or group at the store's root)
    writes, as text; cache it per set of options, it costs a zarr call."""
    with tempfile.TemporaryDirectory(prefix="specstore-template-") as d:
        create(zarr.storage.LocalStore(d))
        return Path(d, "zarr.json").read_text(encoding="utf-8")


def write_group_document(directory: Path, attributes: dict[str, Any]) -> None:
    """Write a zarr v3 group's ``zarr.json`` holding ``attributes`` (atomically; folders created)."""
    write_atomic(directory / "zarr.json",
                 json.dumps({"attributes": attributes, "zarr_format": 3, "node_type": "group"}, indent=2),
                 stream=False)


def write_array_document(directory: Path, template: str, shape: tuple[int, ...], chunks: tuple[int, ...]) -> None:
    """Write an array's ``zarr.json``: ``template`` (a :func:`zarr_document` of a regular-grid array) with its
    shape and chunk shape set.  Raises ``RuntimeError`` for a template of another structure."""
    doc = json.loads(template)
    grid = doc.get("chunk_grid", {})
    if doc.get("node_type") != "array" or grid.get("name") != "regular" or len(doc.get("shape", ())) != len(shape):
        raise RuntimeError(f"zarr wrote an array document this module does not know: {template[:200]}")
    doc["shape"], grid["configuration"]["chunk_shape"] = list(shape), list(chunks)
    write_atomic(directory / "zarr.json", json.dumps(doc, indent=2), stream=False)

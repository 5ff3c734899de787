"""Names and locations inside a store: the one place that spells the format.

A store is a zarr v3 group::

    <root>/zarr.json                      attributes["specstore"] = metadata (see FORMAT.md)
    <root>/shards/<shard>/<feature>       (frames_in_shard, n_bins) array, one per feature
    <root>/index/<generation>/<column>    1-D columns of the committed clip index
    <root>/index/<generation>/errors/...  path / reason of files that failed

Everything here is pure: string building and metadata dicts, no I/O.
"""

from __future__ import annotations

from typing import Any

FORMAT_NAME = "specstore"
FORMAT_VERSION = 1
ATTR_KEY = "specstore"
LAYOUTS = ("raw", "zstd")

SHARDS_GROUP = "shards"
INDEX_GROUP = "index"
ERRORS_GROUP = "errors"

#: Index columns and their numpy dtypes (``str`` = zarr v3 variable-length UTF-8).
INDEX_COLUMNS: dict[str, str] = {
    "path": "str",        # source path, relative to the corpus root ("/" separators)
    "label": "int32",     # index into label_names, -1 = no label
    "hash": "str",        # content hash of the source file's bytes
    "shard": "int32",     # index into metadata["commit"]["shards"]
    "offset": "int64",    # first frame of the clip inside the shard arrays
    "n_frames": "int64",  # frames (the length the batch planner bins on)
    "duration": "float64",  # seconds of decoded audio
}
ERROR_COLUMNS: dict[str, str] = {"path": "str", "reason": "str"}

#: Frames per chunk in the compressed layout (a random read decompresses ~1-2 chunks).
ZSTD_CHUNK_FRAMES = 4096
ZSTD_LEVEL = 3
#: How many earlier index generations are kept for readers still opening them.
KEEP_GENERATIONS = 3


def shard_path(shard: str, feature: str | None = None) -> str:
    """Group path of a shard, or of one feature array inside it."""
    return f"{SHARDS_GROUP}/{shard}" if feature is None else f"{SHARDS_GROUP}/{shard}/{feature}"


def generation_name(generation: int) -> str:
    """Group name of index generation ``generation`` (``g000007``)."""
    return f"g{generation:06d}"


def index_path(generation: int) -> str:
    """Group path of the clip index written by commit ``generation``."""
    return f"{INDEX_GROUP}/{generation_name(generation)}"


def empty_commit() -> dict[str, Any]:
    """The commit record of a store with nothing committed yet."""
    return {"generation": 0, "index": None, "shards": [], "label_names": [], "n_clips": 0, "n_errors": 0}

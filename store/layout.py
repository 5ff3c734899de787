"""Names and locations inside a store: the one place that spells the format.

A store is a zarr v3 group::

    <root>/zarr.json                      attributes["specstore"] = metadata (see FORMAT.md)
    <root>/shards/<shard>/<feature>       (frames_in_shard, n_bins) array, one per feature
    <root>/index/<segment>/<column>       1-D columns of the rows one commit added (format 3: segments)
    <root>/index/<segment>/shards/...     name / n_frames of the shards it added
    <root>/index/<segment>/errors/...     path / reason of files it recorded as failed
    <root>/index/<segment>/gone/path      paths it took out of the index and the error table
    <root>/.specstore-lock                the writer lock (not a zarr node; see store/lock.py)

Everything here is pure: string building and metadata dicts, no I/O.
"""

from __future__ import annotations

import re
from typing import Any

FORMAT_NAME = "specstore"
FORMAT_VERSION = 3
#: Versions this specstore reads: 2 (one whole index per commit) and 3 (index segments).  A writer upgrades
#: a version-2 store to version 3 at its first commit.
READABLE_VERSIONS = (2, 3)
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
    "group": "str",       # the manifest's group (e.g. the musical work); "" = none
    "size": "int64",      # bytes of the source file whose content was decoded (-1 = unknown)
    "mtime_ns": "int64",  # its modification time, ns since the epoch (-1 = unknown)
}
ERROR_COLUMNS: dict[str, str] = {"path": "str", "reason": "str"}
#: A segment's table of the shards it adds (their numbers continue the earlier segments').
SHARD_COLUMNS: dict[str, str] = {"name": "str", "n_frames": "int64"}
#: A segment's table of the paths it takes out of the index and the error table.
GONE_COLUMNS: dict[str, str] = {"path": "str"}
SHARD_TABLE = "shards"
GONE_TABLE = "gone"

#: Frames per chunk in the compressed layout (a random read decompresses ~1-2 chunks).
ZSTD_CHUNK_FRAMES = 4096
ZSTD_LEVEL = 3
#: How many index generations are kept (this one and the ones before), for readers still opening them.
KEEP_GENERATIONS = 3
#: The rule that numbered a store's labels (``commit.label_numbering.rule``): every run or commit adds the
#: labels new to the store after the earlier ones, sorted by name among themselves.
LABEL_RULE = "sorted-per-run"
#: The writer lock, a plain file (local) or object (fsspec) beside the root zarr.json.
LOCK_NAME = ".specstore-lock"
#: Content hashes a store may key its clips on (``metadata["content_hash"]``): the hex digest of a source
#: file's bytes, the key of deduplication, resuming and the train/validation split.
CONTENT_HASHES = ("sha256", "blake2b-128")
#: What new stores use: SHA-256 (what ``sha256sum`` prints), twice as fast as BLAKE2b on CPUs with SHA
#: instructions (docs/features.md), and hashing the corpus is work no extraction worker can share.
CONTENT_HASH = "sha256"
#: What a store that records no ``content_hash`` was written with (stores from before 2026-12-05).
LEGACY_CONTENT_HASH = "blake2b-128"
#: Checksum algorithm of shard chunks (of the chunk's values as little-endian C-order bytes).
CHECKSUM_ALGORITHM = "crc32c"


#: What a shard or feature name may be: one path segment that cannot leave its folder ("..", "/", "\\").
SAFE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
#: What ``commit.index`` may name (format 2): an index generation's group.
INDEX_NAME = re.compile(rf"{INDEX_GROUP}/g[0-9]{{6,12}}")
#: What ``commit.segments`` may name (format 3): a segment's group.
SEGMENT_NAME = re.compile(rf"{INDEX_GROUP}/s[0-9]{{6,12}}")


def shard_path(shard: str, feature: str | None = None) -> str:
    """Group path of a shard, or of one feature array inside it."""
    return f"{SHARDS_GROUP}/{shard}" if feature is None else f"{SHARDS_GROUP}/{shard}/{feature}"


def generation_name(generation: int) -> str:
    """Group name of index generation ``generation`` (``g000007``)."""
    return f"g{generation:06d}"


def index_path(generation: int) -> str:
    """Group path of the clip index written by commit ``generation``."""
    return f"{INDEX_GROUP}/{generation_name(generation)}"


def segment_path(generation: int) -> str:
    """Group path of the index segment written by commit ``generation`` (``index/s000007``)."""
    return f"{INDEX_GROUP}/s{generation:06d}"


def empty_commit() -> dict[str, Any]:
    """The commit record of a store with nothing committed yet."""
    return {"generation": 0, "segments": [], "segment_sizes": [], "history": [], "n_shards": 0, "label_names": [],
            "label_numbering": {"rule": LABEL_RULE, "since": 0}, "n_clips": 0, "n_errors": 0}


def escape_path(path: str) -> str:
    """A stored path for a file-system path: ``\\`` for a backslash, ``\\xNN`` for a byte that is not UTF-8.

    File names on POSIX are bytes; Python hands undecodable bytes over as
    lone surrogates (``os.fsdecode``), which zarr's UTF-8 strings cannot
    hold.  This escaping is lossless: :func:`unescape_path` gives the bytes
    back.  Valid UTF-8 names without a backslash are unchanged.
    """
    if "\\" not in path and not any("\udc80" <= ch <= "\udcff" for ch in path):
        return path
    raw = path.encode("utf-8", "surrogateescape")
    out: list[str] = []
    i = 0
    while i < len(raw):
        for size in (1, 2, 3, 4):  # the longest valid UTF-8 sequence starting here
            try:
                ch = raw[i:i + size].decode("utf-8")
            except UnicodeDecodeError:
                continue
            out.append("\\\\" if ch == "\\" else ch)
            i += size
            break
        else:
            out.append(f"\\x{raw[i]:02x}")
            i += 1
    return "".join(out)


def unescape_path(stored: str) -> bytes:
    """The file-system path bytes of a stored path (inverse of :func:`escape_path`)."""
    out = bytearray()
    i = 0
    while i < len(stored):
        ch = stored[i]
        if ch == "\\" and stored[i + 1:i + 2] == "\\":
            out += b"\\"
            i += 2
        elif ch == "\\" and stored[i + 1:i + 2] == "x":
            out.append(int(stored[i + 2:i + 4], 16))
            i += 4
        else:
            out += ch.encode("utf-8")
            i += 1
    return bytes(out)

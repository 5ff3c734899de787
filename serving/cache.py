"""A folder of decoded clips keyed by content hash, for ``specstore classify --cache DIR``.

Classifying the same files again (another model with the same feature
settings, another ``--topk``) skips decoding: a clip is stored as
``<content hash>-<specs key>.npz``, an uncompressed zip (``np.savez``) of
four members: ``features`` float32 ``(n_bins, n_frames)`` (the model's
input, as :func:`specstore.serving.clips.decode_file` gives it), ``duration`` float64
seconds, and the entry's own ``hash`` and ``specs_key`` strings.  The specs
key is a digest of the FeatureSpecs in order, so a checkpoint with other
feature settings never reads another's values.  Entries are written
atomically.

An entry is read by this module, not by ``np.load``, and checked before it
is used; anything wrong makes it a miss (one warning line), the file is
decoded again and the entry rewritten, so a cache entry can never stop a
run.  Checked, in this order, *before* any member's data is read:

* the file is a regular file no larger than an entry for these specs can
  be (:data:`MAX_SECONDS` of frames of ``n_bins`` float32 values);
* it is a zip of exactly the four members, each stored uncompressed, not
  encrypted, its declared size no more than the file's own size and than
  what that member may hold; so reading an entry never takes more memory
  than the entry's size on disk (a compressed member that would inflate to
  gigabytes is refused from the zip directory alone);
* each member's ``.npy`` header declares the expected dtype and shape
  (``features``: ``n_bins`` rows, 1 to :data:`MAX_SECONDS` worth of frames)
  and exactly as many data bytes as the member holds;

and then, on the values (the zip's CRC is checked as they are read): the
recorded hash and specs key equal the entry's name's, every feature value
is finite, and the duration is a whole number of samples at the specs'
rate, at least one frame's worth, that gives the entry's frame count
(``n_frames = 1 + samples // hop``).

The recorded hash and key catch mix-ups: an entry copied or renamed under
another file's hash, or another specs key's entry, is ignored.  They are
not a signature: whoever can write files into the cache folder can write
an entry with any fields and any (finite, well-shaped) values, and the
classifier will use them.  Keep the cache folder as private as the files
it describes.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import stat
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import IO

import numpy as np

from specstore.common import ConfigError, OutputPathError, atomic_path
from specstore.common.cli import one_line
from specstore.pipeline.features import common_grid, min_samples
from specstore.store import FeatureSpec

from .clips import DecodedClip

__all__ = ["MAX_SECONDS", "ClipCache", "specs_key"]

log = logging.getLogger(__name__)

#: Longest clip an entry may hold, seconds (24 h); longer clips are classified but not cached.
MAX_SECONDS = 24 * 3600.0
#: Largest ``.npy`` header accepted in an entry, bytes (``np.savez`` writes 128).
_HEADER_BYTES = 1024
#: Zip headers and directory around the members, bytes (per member about 150; generous).
_ZIP_OVERHEAD = 4096
#: Longest string a ``hash`` / ``specs_key`` member may hold, characters (SHA-256 hex digests are 64, BLAKE2b-128
#: ones 32, specs keys 16).
_MAX_TEXT = 128


class _BadEntry(ValueError):
    """A cache entry that is not what this cache writes (the reason, one line)."""


def specs_key(specs: Mapping[str, FeatureSpec]) -> str:
    """A short digest of the specs, in order (names included)."""
    text = json.dumps([[name, s.to_dict()] for name, s in specs.items()], sort_keys=True)
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def _npy_header(member: IO[bytes]) -> tuple[tuple[int, ...], bool, np.dtype]:
    """``(shape, fortran_order, dtype)`` of the ``.npy`` stream ``member``, header at most :data:`_HEADER_BYTES`."""
    version = np.lib.format.read_magic(member)
    if version == (1, 0):
        return np.lib.format.read_array_header_1_0(member, max_header_size=_HEADER_BYTES)
    if version == (2, 0):
        return np.lib.format.read_array_header_2_0(member, max_header_size=_HEADER_BYTES)
    raise _BadEntry(f"unsupported .npy version {version}")


def _check_header(name: str, shape: tuple[int, ...], dtype: np.dtype, n_bins: int, max_frames: int) -> None:
    """Raise :class:`_BadEntry` unless member ``name`` has the dtype and shape this cache writes."""
    if name == "features":
        if dtype.str not in ("<f4", ">f4"):
            raise _BadEntry(f"features are {dtype}, not float32")
        if len(shape) != 2 or shape[0] != n_bins or not 1 <= shape[1] <= max_frames:
            raise _BadEntry(f"features have shape {shape}, not ({n_bins}, 1..{max_frames}) for these specs")
    elif name == "duration":
        if dtype.str not in ("<f8", ">f8") or shape != ():
            raise _BadEntry(f"duration is {dtype} of shape {shape}, not one float64")
    elif dtype.kind != "U" or shape != () or dtype.itemsize > 4 * _MAX_TEXT:
        raise _BadEntry(f"{name} is {dtype} of shape {shape}, not one short string")


class ClipCache:
    """Decoded clips in ``folder`` for one set of ``specs``; see the module docstring."""

    def __init__(self, folder: str | os.PathLike[str], specs: Mapping[str, FeatureSpec]) -> None:
        self.folder = Path(folder)
        if self.folder.exists() and not self.folder.is_dir():
            raise ConfigError(f"cache folder {self.folder} is a file")
        self.key = specs_key(specs)
        self.sample_rate, self.hop = common_grid(specs)
        self.n_bins = sum(s.n_bins for s in specs.values())
        self.min_samples = min_samples(specs)
        #: Most frames an entry may hold: :data:`MAX_SECONDS` of audio.
        self.max_frames = 1 + int(MAX_SECONDS * self.sample_rate) // self.hop
        self._member_bytes = {
            "features": _HEADER_BYTES + 4 * self.n_bins * self.max_frames,
            "duration": _HEADER_BYTES + 8,
            "hash": _HEADER_BYTES + 4 * _MAX_TEXT,
            "specs_key": _HEADER_BYTES + 4 * _MAX_TEXT,
        }
        #: Largest entry file these specs allow, bytes.
        self.max_entry_bytes = sum(self._member_bytes.values()) + _ZIP_OVERHEAD
        self.hits = 0

    def _path(self, digest: str) -> Path:
        return self.folder / f"{digest}-{self.key}.npz"

    def get(self, digest: str) -> DecodedClip | None:
        """The cached clip of content ``digest``, or None (no entry, or one that fails a check: logged)."""
        p = self._path(digest)
        if not p.is_file():
            return None
        try:
            clip = self._load(p, digest)
        except Exception as e:  # any unusable entry is a miss: the cache is a shortcut, never a reason to stop
            log.warning("ignoring cache entry %s (the file is decoded again and the entry rewritten): %s",
                        p.name, one_line(e))
            return None
        self.hits += 1
        return clip

    def _load(self, p: Path, digest: str) -> DecodedClip:
        """The clip in entry ``p`` after every check of the module docstring; raises on any failure."""
        with open(p, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise _BadEntry("not a regular file")
            if st.st_size > self.max_entry_bytes:
                raise _BadEntry(f"{st.st_size} bytes, more than an entry for these specs can hold "
                                f"({self.max_entry_bytes})")
            arrays = self._read_members(f, st.st_size)
        features, duration = arrays["features"], float(arrays["duration"])
        if str(arrays["hash"]) != digest:
            raise _BadEntry(f"it records content hash {str(arrays['hash'])[:40]!r}, not {digest!r}")
        if str(arrays["specs_key"]) != self.key:
            raise _BadEntry(f"it records specs key {str(arrays['specs_key'])[:40]!r}, not {self.key!r}")
        if not np.isfinite(features).all():
            raise _BadEntry("features hold non-finite values")
        self._check_duration(duration, int(features.shape[1]))
        return DecodedClip(features, duration, digest)

    def _read_members(self, f: IO[bytes], size: int) -> dict[str, np.ndarray]:
        """The four members of the zip in ``f`` (``size`` bytes), each checked before its data is read."""
        with zipfile.ZipFile(f) as z:
            infos = z.infolist()
            names = sorted(i.filename for i in infos)
            if names != sorted(f"{n}.npy" for n in self._member_bytes):
                raise _BadEntry(f"members {names[:8]}, expected {sorted(self._member_bytes)} as .npy")
            for info in infos:
                limit = min(size, self._member_bytes[info.filename[:-4]])
                if info.compress_type != zipfile.ZIP_STORED or info.flag_bits & 0x1:
                    raise _BadEntry(f"{info.filename} is compressed or encrypted (entries are stored as written)")
                if info.file_size != info.compress_size or info.file_size > limit:
                    raise _BadEntry(f"{info.filename} declares {info.file_size} bytes, more than the "
                                    f"{limit} it may hold")
            out: dict[str, np.ndarray] = {}
            for info in infos:
                with z.open(info) as m:
                    out[info.filename[:-4]] = self._read_array(info.filename[:-4], m, info.file_size)
        return out

    def _read_array(self, name: str, m: IO[bytes], member_bytes: int) -> np.ndarray:
        """Member ``name``'s array from its ``.npy`` stream ``m``; its header is checked before any data is read."""
        shape, fortran, dtype = _npy_header(m)
        _check_header(name, shape, dtype, self.n_bins, self.max_frames)
        nbytes = math.prod(shape) * dtype.itemsize
        if m.tell() + nbytes != member_bytes:
            raise _BadEntry(f"{name} holds {member_bytes - m.tell()} data bytes, its header says {nbytes}")
        data = m.read(nbytes)  # reaching the member's end checks its CRC
        if len(data) != nbytes:
            raise _BadEntry(f"{name} is truncated")
        a = np.frombuffer(data, dtype=dtype).reshape(shape, order="F" if fortran else "C")
        return a.astype(dtype.newbyteorder("="), order="C")  # native, writable, its own memory

    def _check_duration(self, duration: float, n_frames: int) -> None:
        """Raise :class:`_BadEntry` unless ``duration`` (s) is a whole number of samples giving ``n_frames``."""
        samples = duration * self.sample_rate
        if not (math.isfinite(samples) and 0 < duration <= MAX_SECONDS):
            raise _BadEntry(f"duration {duration!r} s is not within (0, {MAX_SECONDS:.0f}]")
        n = round(samples)
        if abs(samples - n) > 1e-3 or n < self.min_samples or 1 + n // self.hop != n_frames:
            raise _BadEntry(f"duration {duration!r} s ({samples:.3f} samples at {self.sample_rate} Hz) does not "
                            f"give its {n_frames} frames of hop {self.hop}")

    def put(self, clip: DecodedClip) -> None:
        """Store ``clip`` (atomically: a reader never sees half a file); a write that fails is logged, not raised.

        A clip longer than :data:`MAX_SECONDS` is not stored (its entry would
        be refused).
        """
        if not clip.duration <= MAX_SECONDS:
            log.info("not caching %s: %r s is longer than the cache's %.0f s", clip.hash, clip.duration,
                     MAX_SECONDS)
            return
        try:
            with atomic_path(self._path(clip.hash)) as tmp, open(tmp, "wb") as f:
                np.savez(f, features=np.asarray(clip.features, dtype=np.float32),
                         duration=np.float64(clip.duration), hash=np.str_(clip.hash), specs_key=np.str_(self.key))
        except (OSError, OutputPathError) as e:  # a folder in the way, a full disk: the clip is classified all the same
            log.warning("could not write cache entry %s: %s", self._path(clip.hash).name, one_line(e))

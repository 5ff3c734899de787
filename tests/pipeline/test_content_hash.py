"""A store's content hash: what new stores key their clips on, and what a store written before keeps.

New stores record ``content_hash: "sha256"`` in their root document and
store each clip under the SHA-256 of its source file's bytes (what
``sha256sum`` prints).  A store whose root document records none was
written before the record existed, with BLAKE2b-128: it keeps that hash as
it grows, so its rows still deduplicate, resume and split as they did.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest
import zarr
from factories import SMALL_SPECS, make_corpus

from specstore.pipeline.extract import extract
from specstore.pipeline.hashing import content_hash, digest_bytes
from specstore.pipeline.testing import write_music_like
from specstore.store import StoreCorrupt, create_store, open_store

MEL = {"mel": SMALL_SPECS["mel"]}


def _run(corpus: Path, store: Path):
    return extract(corpus, str(store), specs=MEL, jobs=1, progress=False)


def _record(store: Path) -> dict:
    return dict(zarr.open_group(store, mode="r").attrs["specstore"])


def _set_record(store: Path, value: str | None) -> None:
    """Rewrite the root document's ``content_hash`` (None: drop it, as a store written before it existed)."""
    group = zarr.open_group(store, mode="r+")
    doc = dict(group.attrs["specstore"])
    if value is None:
        del doc["content_hash"]
    else:
        doc["content_hash"] = value
    group.attrs["specstore"] = doc


def _blake2b_128(path: Path) -> str:
    return hashlib.blake2b(path.read_bytes(), digest_size=16).hexdigest()


def test_a_new_store_keys_its_clips_on_sha256(tmp_path: Path) -> None:
    c = tmp_path / "c"
    make_corpus(c, n=3, seconds=1.0)
    _run(c, tmp_path / "s.zarr")
    assert _record(tmp_path / "s.zarr")["content_hash"] == "sha256"
    s = open_store(tmp_path / "s.zarr")
    assert len(s) == 3
    for path, h in zip(s.paths, s.hashes, strict=True):
        assert h == hashlib.sha256((c / path).read_bytes()).hexdigest()


def test_a_store_that_records_no_content_hash_keeps_blake2b_as_it_grows(tmp_path: Path) -> None:
    c, store = tmp_path / "c", tmp_path / "s.zarr"
    files = make_corpus(c, n=3, seconds=1.0)
    create_store(store, MEL).close()
    _set_record(store, None)  # what an empty store written before the record holds
    first = _run(c, store)
    assert first.decoded == 3
    s = open_store(store)
    assert sorted(s.hashes) == sorted(_blake2b_128(f) for f in files)
    assert _record(store)["content_hash"] == "blake2b-128"  # recorded from the first commit on

    again = _run(c, store)  # nothing changed: nothing decoded
    assert (again.decoded, again.unchanged) == (0, 3)

    shutil.copy(files[0], c / "jazz" / "copy" f"{files[0].suffix}")  # a copy: indexed without decoding
    new = write_music_like(c / "rock" / "new.wav", 1.3, seed=99)  # new content: decoded, BLAKE2b too
    grown = _run(c, store)
    assert (grown.decoded, grown.duplicates) == (1, 1)
    s = open_store(store)
    by_path = dict(zip(s.paths, s.hashes, strict=True))
    assert by_path["jazz/copy" + files[0].suffix] == _blake2b_128(files[0])
    assert by_path["rock/new.wav"] == _blake2b_128(new) == content_hash(new, "blake2b-128")


def test_an_unknown_content_hash_is_refused_in_one_line(tmp_path: Path) -> None:
    create_store(tmp_path / "s.zarr", MEL).close()
    _set_record(tmp_path / "s.zarr", "md5")
    with pytest.raises(StoreCorrupt, match=r"unknown content hash 'md5'") as err:
        open_store(tmp_path / "s.zarr")
    assert "\n" not in str(err.value)


def test_each_algorithm_hashes_files_and_bytes_alike(tmp_path: Path) -> None:
    f = write_music_like(tmp_path / "a.wav", 0.5, seed=3)
    data = f.read_bytes()
    assert content_hash(f) == digest_bytes(data) == hashlib.sha256(data).hexdigest()
    assert content_hash(f, "blake2b-128") == digest_bytes(data, "blake2b-128") == _blake2b_128(f)
    with pytest.raises(ValueError, match="unknown content hash"):
        content_hash(f, "md5")

"""Stores at fsspec URLs (``memory://``, ``file://``): the same API and the same values as a local raw store.

``memory://`` is fsspec's in-process filesystem: it stands in for an object
store (``s3://``, ``gs://``) in these tests, with the one difference that
other processes cannot see it.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from factories import SMALL_SPECS, assert_same_content, make_corpus, store_content
from fsspec.core import url_to_fs

from specstore.pipeline.cli import main as features_main
from specstore.pipeline.extract import ExtractError, extract
from specstore.store import (
    FeatureSpec,
    IndexRow,
    SpecMismatch,
    StoreError,
    StoreNotFound,
    StoreWriter,
    create_store,
    open_store,
    validate,
    write_shard,
)

SPECS = {"mel": FeatureSpec.mel(n_bins=16), "cqt": FeatureSpec.cqt(n_bins=12)}
#: Small features keep extraction fast; values are still the real log-mel / CQT.
SMALL = SMALL_SPECS


@pytest.fixture
def mem_url() -> Iterator[str]:
    """A fresh ``memory://`` store URL, removed afterwards (the memory filesystem is process-global)."""
    url = f"memory://specstore-test-{uuid.uuid4().hex[:12]}/s.zarr"
    yield url
    fs, path = url_to_fs(url)
    parent = path.rsplit("/", 1)[0]
    if fs.exists(parent):
        fs.rm(parent, recursive=True)


def _url(kind: str, mem_url: str, tmp_path: Path) -> str:
    return mem_url if kind == "memory" else f"file://{tmp_path / 'url.zarr'}"


def _fill(where: str | Path, layout: str) -> None:
    """The same writes, in the same order, into any store: two shards by hand, then a second commit."""
    rng = np.random.default_rng(7)
    clips = [{k: rng.normal(-45, 12, (n, s.n_bins)).astype(np.float32) for k, s in SPECS.items()}
             for n in (5, 4097, 1, 300)]
    w = create_store(where, SPECS, layout=layout, label_names=["rock", "jazz"])
    a = write_shard(where, {k: [c[k] for c in clips[:2]] for k in SPECS}, ["h0", "h1"], [0.1, 95.1])
    b = write_shard(where, {k: [clips[2][k]] for k in SPECS}, ["h2"], [0.02])
    w.commit([a, b], [IndexRow("r/0.wav", "h0", "rock"), IndexRow("j/1.flac", "h1", "jazz"),
                      IndexRow("x/2.ogg", "h2", None), IndexRow("copy/0.wav", "h0", "copies")])
    w.close()
    with StoreWriter.open(where) as again:  # a later run appends to what is committed
        again.add_clips([{"path": "r/3.mp3", "hash": "h3", "duration": 7.0, "label": 0}],
                        {k: [clips[3][k]] for k in SPECS})


# -- the store API on URLs --------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", ["zstd", "raw"])
@pytest.mark.parametrize("kind", ["memory", "file"])
def test_url_store_reads_back_what_a_local_raw_store_holds(tmp_path: Path, mem_url: str, kind: str,
                                                           layout: str) -> None:
    _fill(tmp_path / "local.zarr", "raw")
    url = _url(kind, mem_url, tmp_path)
    _fill(url, layout)
    expected = store_content(tmp_path / "local.zarr")
    assert len(expected) == 5
    got = open_store(url)
    assert got.layout == layout and got.specs == SPECS and got.generation == 2
    assert got.label_names == ["rock", "jazz", "copies"]
    assert_same_content(store_content(url), expected)
    assert validate(url) == [] and validate(url, deep=True) == []
    # same specs reopen the store; a different layout is refused, never mixed
    with create_store(url, SPECS, layout=layout) as w:
        assert w.commit_state.n_clips == 5
    with pytest.raises(SpecMismatch, match="layout"):
        create_store(url, SPECS, layout="raw" if layout == "zstd" else "zstd")


def test_raw_layout_on_a_url_goes_through_zarr_and_a_file_url_through_mmap(tmp_path: Path, mem_url: str) -> None:
    file_url = f"file://{tmp_path / 'f.zarr'}"
    for url in (mem_url, file_url):
        _fill(url, "raw")
    remote, local = open_store(mem_url).feature("mel"), open_store(file_url).feature("mel")
    assert open_store(file_url).location.local == tmp_path / "f.zarr"
    assert open_store(mem_url).location.local is None
    i = int(np.argmax(open_store(mem_url).lengths))
    # a memory-mapped shard hands out views of one mapping; zarr reads are checked copies of whole chunks
    from specstore.store.shards import VerifiedArray
    assert np.shares_memory(local.frames(i), local.frames(i))
    assert isinstance(remote._shard_array(int(open_store(mem_url)._shard[i])), VerifiedArray)
    assert not remote.frames(i).flags.writeable
    np.testing.assert_array_equal(remote.frames(i), local.frames(i))


def test_orphans_and_old_index_generations_are_deleted_on_an_object_store(mem_url: str, monkeypatch) -> None:
    from specstore.store import writer as writer_module

    fs, root = url_to_fs(mem_url)
    w = create_store(mem_url, SPECS, layout="zstd")
    rng = np.random.default_rng(3)
    for k in range(5):
        w.add_clips([{"path": f"{k}.wav", "hash": f"h{k}", "duration": 1.0}],
                    {n: [rng.normal(size=(9, s.n_bins))] for n, s in SPECS.items()})
    w.close()
    orphan = write_shard(mem_url, {n: [np.zeros((4, s.n_bins))] for n, s in SPECS.items()}, ["lost"], [0.1])
    assert any(orphan.name in key for key in fs.find(root))
    with StoreWriter.open(mem_url) as again:  # under a lease, a young orphan may be a racing writer's: kept
        assert again.remove_orphans() == []
    monkeypatch.setattr(writer_module, "LEASE_SECONDS", 0.0)  # older than two lease periods: removed
    with StoreWriter.open(mem_url) as again:
        assert again.remove_orphans() == [orphan.name]
    assert not any(orphan.name in key for key in fs.find(root))  # no chunk or metadata object left behind
    commit = json.loads(fs.cat(f"{root}/zarr.json"))["attributes"]["specstore"]["commit"]
    named = {g.rsplit("/", 1)[-1] for g in [*commit["segments"], *(g for h in commit["history"] for g in h)]}
    segments = {p.rsplit("/", 1)[-1] for p in fs.ls(f"{root}/index", detail=False)} - {"zarr.json"}
    assert segments == named and f"s{commit['generation']:06d}" in segments  # merged-away segments are deleted
    assert len(open_store(mem_url)) == 5 and validate(mem_url) == []


@pytest.mark.parametrize("kind", ["memory", "file"])
def test_creating_a_store_over_other_data_is_refused_and_the_data_kept(tmp_path: Path, mem_url: str,
                                                                       kind: str) -> None:
    url = _url(kind, mem_url, tmp_path)
    fs, path = url_to_fs(url)
    fs.makedirs(path, exist_ok=True)
    fs.pipe(f"{path}/precious.txt", b"keep me")
    with pytest.raises(StoreError, match="not a specstore store"):
        create_store(url, SPECS, layout="zstd")
    assert fs.cat(f"{path}/precious.txt") == b"keep me"


def test_a_missing_url_is_store_not_found(mem_url: str) -> None:
    with pytest.raises(StoreNotFound, match="no store at memory://"):
        open_store(mem_url)
    problems = validate(mem_url)
    assert len(problems) == 1 and "no store" in problems[0]


# -- extraction into URLs ---------------------------------------------------------------------------------
@pytest.mark.slow
def test_extract_into_memory_and_file_urls_equals_a_local_raw_store(tmp_path: Path, mem_url: str) -> None:
    c = tmp_path / "c"
    make_corpus(c, n=6, seconds=1.5, step=0.31)
    ref = extract(c, str(tmp_path / "ref.zarr"), specs=SMALL, jobs=1, progress=False)
    assert ref.decoded == 6 and not ref.errors
    expected = store_content(tmp_path / "ref.zarr")

    one = extract(c, mem_url, specs=SMALL, layout="zstd", jobs=1, progress=False, commit_seconds=0.0)
    assert one.decoded == 6 and one.store_bytes is None and "unknown" in one.report()
    assert_same_content(store_content(mem_url), expected)
    assert validate(mem_url, deep=True) == []
    again = extract(c, mem_url, specs=SMALL, layout="zstd", jobs=1, progress=False)  # resume on a URL
    assert again.decoded == 0 and again.unchanged == 6

    threads = mem_url.replace("/s.zarr", "/threads.zarr")
    extract(c, threads, specs=SMALL, layout="zstd", jobs=2, backend="threading", progress=False)
    assert_same_content(store_content(threads), expected)

    # file:// stores are local: loky worker processes write into them
    file_url = f"file://{tmp_path / 'file.zarr'}"
    extract(c, file_url, specs=SMALL, layout="zstd", jobs=2, progress=False)
    assert open_store(file_url).layout == "zstd"
    assert_same_content(store_content(file_url), expected)
    assert validate(file_url) == []


def test_worker_processes_and_a_memory_url_are_a_one_line_error(tmp_path: Path, mem_url: str, capsys) -> None:
    c = tmp_path / "c"
    make_corpus(c, n=2, seconds=0.5, step=0.31)
    with pytest.raises(ExtractError, match=r"memory://.*worker processes cannot write.*jobs=1 or the threading"):
        extract(c, mem_url, specs=SMALL, layout="zstd", jobs=2, progress=False)
    assert len(open_store(mem_url)) == 0  # nothing decoded, nothing half-written
    cli_url = mem_url.replace("/s.zarr", "/cli.zarr")
    args = [str(c), cli_url, "--layout", "zstd", "--features", "mel", "--no-progress"]
    assert features_main(args + ["--jobs", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "memory://" in err
    assert features_main(args + ["--jobs", "1"]) == 0
    assert len(open_store(cli_url)) == 2 and validate(cli_url) == []

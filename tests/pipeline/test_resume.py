"""A run stopped by Ctrl-C or a kill, then run again: the rerun says nothing of what the stop left behind.

An interrupt can leave a shard folder without its ``zarr.json`` (stopped
between making the folder and writing the document, or half-way through
removing an aborted shard).  zarr warned about each such folder whenever the
shards were listed ("ZarrUserWarning: Object at ... is not recognized as a
component of a Zarr hierarchy"), on every later run, and the folder stayed.
"""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

from factories import SMALL_SPECS, make_corpus

from specstore.pipeline import extract
from specstore.pipeline.testing import write_music_like
from specstore.store import open_store


def test_a_resumed_run_removes_unfinished_shards_and_prints_no_library_warning(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    make_corpus(corpus, n=4, seconds=1.0)
    store = tmp_path / "s.zarr"
    specs = {"mel": SMALL_SPECS["mel"]}
    extract(corpus, str(store), specs=specs, jobs=1, progress=False)
    shards = store / "shards"
    committed = sorted(p.name for p in shards.iterdir() if p.is_dir())
    made = shards / "0123456789abcdef"  # stopped before the shard's zarr.json was written
    made.mkdir()
    (made / ".zarr.json.tmp").write_text("{")
    unlinked = shards / "fedcba9876543210"  # an aborted shard half removed: its document went first
    shutil.copytree(shards / committed[0], unlinked)
    (unlinked / "zarr.json").unlink()
    uncommitted = shards / "00000000aaaaaaaa"  # a whole shard that was never committed: the store's own cleanup
    shutil.copytree(shards / committed[0], uncommitted)
    folder = next(p for p in sorted(corpus.iterdir()) if p.is_dir())
    write_music_like(folder / "new.wav", 1.0, seed=9)  # one more to decode: the rerun does work, not only cleanup

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        summary = extract(corpus, str(store), specs=specs, jobs=1, progress=False)
    assert [str(w.message) for w in caught] == []
    assert summary.decoded == 1
    left = sorted(p.name for p in shards.iterdir() if p.is_dir())
    assert not {made.name, unlinked.name, uncommitted.name} & set(left) and set(committed) <= set(left)
    assert len(open_store(store).paths) == 5

"""specstore.common.heap: after :func:`keep_freed_blocks` a freed multi-MiB block stays in the heap for reuse, one above
the 32 MiB ceiling still goes back to the system; every decoded file sets it; CPU training keeps freed memory for
its steps (:func:`specstore.infer.train.prepare.keep_freed_memory`) and comes back to it when it ends, so the caller's
process does not keep growing its heap afterwards.

The checks of resident memory run in a fresh interpreter: the setting is the whole process's and is not undone,
and in a process that ran other tests a block can be carved from a free hole their arrays left in the heap,
which no threshold returns on free.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc settings")

_PRELUDE = """
import numpy as np

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096

def kept_after_free(nbytes):
    # bytes of a touched block still resident right after it is freed (what the free did not return)
    block = np.ones(nbytes // 8)
    held = rss()
    del block
    return nbytes - (held - rss())

MiB = 2 ** 20
"""


def _run(body: str, cwd: Path) -> str:
    code = _PRELUDE + textwrap.dedent(body)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_freed_blocks_kept_up_to_the_ceiling(tmp_path: Path) -> None:
    out = _run("""
        from specstore.common.heap import keep_freed_blocks
        before = kept_after_free(16 * MiB)   # a new process: glibc maps and unmaps a 16 MiB block
        assert keep_freed_blocks()
        after = kept_after_free(16 * MiB)
        above = kept_after_free(48 * MiB)    # above the 32 MiB ceiling: still mapped and unmapped
        print(before, after, above)
    """, tmp_path)
    before, after, above = (int(x) for x in out.split())
    assert before < 4 * 2**20, "a new process should return a freed 16 MiB block"
    assert after > 12 * 2**20, "after keep_freed_blocks the freed 16 MiB block should stay in the heap"
    assert above < 8 * 2**20, "a block above the 32 MiB ceiling should still go back"


def test_every_extraction_task_keeps_freed_blocks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """compute_features sets it for every file (in the driver's process with one job, in each worker otherwise).
    Whether glibc's own adjustment already got there depends on what the process freed before, so this checks
    the call; the first test checks what the call does."""
    from specstore.pipeline import features as features_module
    from specstore.pipeline.extract import extract
    from specstore.pipeline.testing import write_music_like

    calls: list[int] = []
    monkeypatch.setattr(features_module, "keep_freed_blocks", lambda: calls.append(1) or True)
    corpus = tmp_path / "corpus" / "rock"
    corpus.mkdir(parents=True)
    for k in range(3):
        write_music_like(corpus / f"t{k}.wav", 2.0, seed=k, sr=22050, channels=1)
    summary = extract(tmp_path / "corpus", str(tmp_path / "s.zarr"), features=("mel",), jobs=1, progress=False)
    assert summary.decoded == 3
    assert calls, "no extraction task kept freed blocks"


def test_every_decoded_clip_keeps_freed_blocks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``specstore classify`` and the server decode through serving.clips.decode_file, in any process."""
    from specstore.pipeline import features as features_module
    from specstore.pipeline.testing import write_music_like
    from specstore.serving import clips as clips_module
    from specstore.store import default_specs

    calls: list[int] = []
    monkeypatch.setattr(features_module, "keep_freed_blocks", lambda: calls.append(1) or True)
    clip = clips_module.decode_file(write_music_like(tmp_path / "a.wav", 2.0, seed=1, sr=22050, channels=1),
                                     default_specs(("mel",)))
    assert clip.duration > 1.9
    assert calls, "decoding a clip did not keep freed blocks"


def test_training_comes_back_to_the_ceiling(tmp_path: Path) -> None:
    out = _run("""
        from specstore.infer.train.prepare import keep_freed_memory, release_freed_memory
        keep_freed_memory()
        during = kept_after_free(64 * MiB)   # training's steps keep even 64 MiB blocks
        release_freed_memory()
        print(during, kept_after_free(64 * MiB), kept_after_free(16 * MiB))
    """, tmp_path)
    during, big, small = (int(x) for x in out.split())
    assert during > 48 * 2**20
    assert big < 16 * 2**20, "after training a freed 64 MiB block should go back"
    assert small > 12 * 2**20, "after training the extraction ceiling should hold (not glibc's 128 KiB)"


def test_after_training_a_freed_block_goes_back_to_the_system(tmp_path: Path) -> None:
    out = _run(f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).parents[1])!r})
        from factories import make_separable_store
        from specstore.infer.options.run_options import RunOptions
        from specstore.infer.train import TrainConfig, train
        store = make_separable_store({str(tmp_path / "s.zarr")!r}, n=12, lengths=(20, 40))
        config = TrainConfig(run=RunOptions(device="cpu"), epochs=1, width=4, depth=2)
        train(store, {str(tmp_path / "m.pt")!r}, config, progress=False)
        before = rss()
        block = np.ones(64 * MiB // 8)  # 64 MiB, touched
        grown = rss() - before
        del block
        print(grown, rss() - before)
    """, tmp_path)
    grown, left = (int(x) for x in out.split()[-2:])
    assert grown > 48 * 2**20
    assert left < 16 * 2**20, "the freed 64 MiB stayed in the heap: training's setting outlived it"

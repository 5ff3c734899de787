"""`specstore classify --cache DIR`: a damaged, mixed-up or inflating cache entry is a miss, never a stop.

Each case plants one bad entry for file A beside a good one for file B and
checks that the run goes through with the answers of a run without cache,
logs one warning line naming the entry, decodes A again and rewrites its
entry (the next run reads both from the cache, silently).  The planted
values differ from A's real ones, so an entry used instead of refused
shows in the answers.
"""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from factories import make_checkpoint, make_corpus

from specstore.common import ConfigError
from specstore.infer.engine.runtime import RunOptions
from specstore.serving.cache import specs_key
from specstore.serving.classify import ClassifyResult, classify_files
from specstore.serving.cli import main as specstore_main
from specstore.serving.clips import DecodedClip, decode_file
from specstore.serving.model import Classifier
from specstore.store import FeatureSpec

SPEC = FeatureSpec.mel(n_bins=16)
CPU = RunOptions(device="cpu", progress=False)


@dataclass
class Setup:
    files: list[Path]
    ckpt: Path
    clf: Classifier
    clips: list[DecodedClip]  # A's and B's real clips
    key: str
    reference: ClassifyResult  # the answers without a cache

    def entry(self, k: int, cache: Path) -> Path:
        return cache / f"{self.clips[k].hash}-{self.key}.npz"


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Setup:
    root = tmp_path_factory.mktemp("cache")
    files = make_corpus(root / "c", n=2, seconds=1.0)
    ckpt = make_checkpoint(root / "m.pt", spec=SPEC)
    clf = Classifier(ckpt, CPU)
    clips = [decode_file(f, {"mel": SPEC}) for f in files]
    return Setup(files, ckpt, clf, clips, specs_key({"mel": SPEC}), classify_files(files, clf, progress=False))


def members(features: np.ndarray, duration: float, digest: str, key: str) -> dict[str, np.ndarray]:
    return {"features": features, "duration": np.asarray(duration, np.float64), "hash": np.asarray(digest),
            "specs_key": np.asarray(key)}


def write_zip(path: Path, arrays: dict[str, np.ndarray], compression: int = zipfile.ZIP_STORED) -> None:
    """What ``np.savez`` writes (``name.npy`` members), with the compression asked for."""
    with zipfile.ZipFile(path, "w", compression) as z:
        for name, a in arrays.items():
            buf = io.BytesIO()
            np.save(buf, a, allow_pickle=False)
            z.writestr(f"{name}.npy", buf.getvalue())


def full(s: Setup, k: int, **change: object) -> dict[str, np.ndarray]:
    """Clip ``k``'s entry members, recorded as A's (hash and key), with ``change`` applied."""
    c = s.clips[k]
    d: dict[str, object] = dict(features=c.features, duration=c.duration, digest=s.clips[0].hash, key=s.key)
    d.update(change)
    return members(**d)  # type: ignore[arg-type]


def with_value(a: np.ndarray, value: float) -> np.ndarray:
    out = a.copy()
    out[3, 2] = value
    return out


def huge_header(path: Path, s: Setup) -> None:
    """A features member whose header claims 16 x 10^12 float32 (64 TB) and holds a few bytes."""
    arrays = full(s, 0)
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": "<f4", "fortran_order": False, "shape": (16, 10**12)})
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("features.npy", buf.getvalue() + bytes(64))
        for name in ("duration", "hash", "specs_key"):
            b = io.BytesIO()
            np.save(b, arrays[name])
            z.writestr(f"{name}.npy", b.getvalue())


def truncated(path: Path, s: Setup) -> None:
    write_zip(path, full(s, 1))
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


#: name -> how to damage A's entry (given its path and the setup)
DAMAGES: dict[str, Callable[[Path, Setup], object]] = {
    "bad_zip": lambda p, s: p.write_bytes(b"PK\x03\x04" + bytes(range(256)) * 8),
    "truncated": truncated,
    "missing_member": lambda p, s: np.savez(p, features=s.clips[1].features, duration=s.clips[1].duration),
    "wrong_dtype": lambda p, s: write_zip(p, full(s, 1, features=s.clips[1].features.astype(np.float64))),
    "wrong_ndim": lambda p, s: write_zip(p, full(s, 0, features=s.clips[0].features[None])),
    "wrong_bins": lambda p, s: write_zip(p, full(s, 0, features=np.vstack([s.clips[0].features,
                                                                           s.clips[0].features[:1] + 30]))),
    "nan": lambda p, s: write_zip(p, full(s, 0, features=with_value(s.clips[0].features, np.nan))),
    "inf": lambda p, s: write_zip(p, full(s, 0, features=with_value(s.clips[0].features, np.inf))),
    "duration": lambda p, s: write_zip(p, full(s, 0, duration=s.clips[0].duration * 2 + 0.25)),
    "other_hash": lambda p, s: write_zip(p, full(s, 1, digest=s.clips[1].hash)),  # B's entry copied to A's name
    "other_key": lambda p, s: write_zip(p, full(s, 0, features=s.clips[0].features - 20, key="0123456789abcdef")),
    "compressed": lambda p, s: write_zip(p, full(s, 1), zipfile.ZIP_DEFLATED),
    "huge_header": huge_header,
}


def same_answers(got: ClassifyResult, want: ClassifyResult) -> None:
    assert [r.path for r in got.results] == [r.path for r in want.results] and not got.failures
    for a, b in zip(got.results, want.results, strict=True):
        np.testing.assert_allclose(a.probs, b.probs, rtol=0, atol=1e-6)
        assert a.duration == b.duration


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_a_bad_entry_is_logged_ignored_and_rewritten(damage: str, setup: Setup, tmp_path: Path,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    cache = tmp_path / "cache"
    classify_files(setup.files, setup.clf, progress=False, cache=cache)  # both entries written
    DAMAGES[damage](setup.entry(0, cache), setup)
    caplog.set_level(logging.WARNING)

    got = classify_files(setup.files, setup.clf, progress=False, cache=cache)
    same_answers(got, setup.reference)
    assert got.cached == 1  # B's entry; A decoded again
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and setup.entry(0, cache).name in warnings[0] and "\n" not in warnings[0]

    caplog.clear()
    again = classify_files(setup.files, setup.clf, progress=False, cache=cache)
    assert again.cached == 2 and not caplog.records  # A's entry was rewritten, good
    same_answers(again, setup.reference)


def test_an_entry_that_cannot_be_written_is_logged_and_the_run_goes_on(setup: Setup, tmp_path: Path,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    cache = tmp_path / "cache"
    setup.entry(0, cache).mkdir(parents=True)  # a folder where A's entry goes: not an entry, and not replaceable
    caplog.set_level(logging.WARNING)
    got = classify_files(setup.files, setup.clf, progress=False, cache=cache)
    same_answers(got, setup.reference)
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and warnings[0].startswith(f"could not write cache entry {setup.entry(0, cache).name}")
    assert setup.entry(0, cache).is_dir() and setup.entry(1, cache).is_file()
    with pytest.raises(ConfigError, match="is a file"):  # a wrong --cache argument: one line before any work
        classify_files(setup.files, setup.clf, progress=False, cache=setup.files[0])


def strict_json(text: str) -> object:
    def refuse(name: str) -> object:
        raise ValueError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_json_output_is_strict_json_with_a_nan_entry_and_with_a_nan_answer(setup: Setup, tmp_path: Path,
                                                                           capsys: pytest.CaptureFixture[str],
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache"
    args = ["classify", *map(str, setup.files), "--model", str(setup.ckpt), "--device", "cpu", "--no-progress",
            "--json", "--cache", str(cache)]
    assert specstore_main(args) == 0
    capsys.readouterr()
    DAMAGES["nan"](setup.entry(0, cache), setup)
    assert specstore_main(args) == 0
    out, err = capsys.readouterr()
    data = strict_json(out)["files"]  # type: ignore[index]
    assert isinstance(data, list) and [d["file"] for d in data] == [str(f) for f in setup.files]
    assert "Traceback" not in err

    run = Classifier.run

    def nan_first(self: Classifier, *a: object, **k: object) -> object:
        res = run(self, *a, **k)  # type: ignore[arg-type]
        res.probs[0] = np.nan
        return res

    monkeypatch.setattr(Classifier, "run", nan_first)  # a model that answers NaN on finite input
    assert specstore_main(args) == 1
    out, err = capsys.readouterr()
    data = strict_json(out)["files"]  # type: ignore[index]
    assert isinstance(data, list) and data[0]["file"] == str(setup.files[1]) and "top" in data[0]  # results first
    assert data[1] == {"file": str(setup.files[0]), "error": "the model gave non-finite probabilities"}
    assert "non-finite" in err


BOMB_MIB = 256

# tracemalloc counts numpy's array data too; ru_maxrss would not do: it is a lifetime peak the imports may set
READ_BOMB = """
import sys, tracemalloc
from specstore.serving.cache import ClipCache
from specstore.common import ConfigError
from specstore.store import FeatureSpec
cache = ClipCache(sys.argv[1], {"mel": FeatureSpec.mel(n_bins=16)})
tracemalloc.start()
clip = cache.get(sys.argv[2])
print(clip is None, tracemalloc.get_traced_memory()[1] >> 20)
"""


def test_a_compressed_entry_is_refused_before_it_inflates(setup: Setup, tmp_path: Path) -> None:
    """A 1 MiB entry whose features member inflates to 256 MiB: refused from the zip directory, nothing allocated."""
    cache = tmp_path / "cache"
    cache.mkdir()
    path = setup.entry(0, cache)
    frames = BOMB_MIB * 2**20 // (16 * 4)
    arrays = full(setup, 0)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as z:
        with z.open("features.npy", "w", force_zip64=True) as f:
            np.lib.format.write_array_header_1_0(f, {"descr": "<f4", "fortran_order": False, "shape": (16, frames)})
            zeros = bytes(4 << 20)
            for _ in range(BOMB_MIB // 4):
                f.write(zeros)
        for name in ("duration", "hash", "specs_key"):
            b = io.BytesIO()
            np.save(b, arrays[name])
            z.writestr(f"{name}.npy", b.getvalue())
    assert path.stat().st_size < 2**21
    proc = subprocess.run([sys.executable, "-c", READ_BOMB, str(cache), setup.clips[0].hash], capture_output=True,
                          text=True, timeout=60, cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 0, proc.stderr
    refused, peak_mib = proc.stdout.split()
    assert refused == "True" and int(peak_mib) < 8, proc.stdout
    assert "compressed" in proc.stderr  # the warning line says why

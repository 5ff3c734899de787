"""`specstore classify`: files -> top-k with no store; equal to `make infer` on a store of the same files.

Also the public hooks it stands on: ``Engine.clip_logits`` over in-memory
clips (``ArrayDataset``), ``specstore.pipeline.stored_features``, and the CUDA
out-of-memory split, faked on CPU.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from factories import LABELS, SMALL_SPECS, make_checkpoint, make_corpus, make_store

from specstore.common import ConfigError
from specstore.infer.data import ArrayDataset, StoreDataset
from specstore.infer.engine.predict import predict
from specstore.infer.engine.predictions import read_predictions_csv
from specstore.infer.engine.runtime import Engine, RunOptions
from specstore.infer.models import ModelConfig, build_model
from specstore.infer.models.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from specstore.infer.options.defaults import PLAIN_MODEL
from specstore.pipeline import extract
from specstore.pipeline.hashing import content_hash, digest_bytes
from specstore.serving.classify import classify_files
from specstore.serving.cli import main as specstore_main
from specstore.serving.clips import decode_file
from specstore.serving.model import Classifier
from specstore.store import FeatureSpec, open_store, stack_parts

CPU = RunOptions(device="cpu", progress=False)


def stacked_checkpoint(path: Path) -> Path:
    """A small untrained model on the stacked ``mel+cqt`` feature of :data:`SMALL_SPECS`."""
    torch.manual_seed(0)
    n_bins = sum(s.n_bins for s in SMALL_SPECS.values())
    model = build_model(ModelConfig(**PLAIN_MODEL, n_bins=n_bins, n_classes=len(LABELS), width=4, depth=2))
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
    save_checkpoint(Checkpoint.from_model(model, LABELS, "mel+cqt", dict(SMALL_SPECS)), path)
    return path


@pytest.mark.slow
def test_classify_equals_make_infer_on_a_store_of_the_same_files(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    files = make_corpus(corpus, n=4, seconds=2.0)
    shutil.copy(files[1], corpus / "jazz" / "copy.flac")  # same bytes under another name
    (corpus / "rock" / "broken.wav").write_bytes(b"RIFF....not audio at all")
    extract(corpus, str(tmp_path / "s.zarr"), specs=dict(SMALL_SPECS), jobs=1, progress=False)
    ckpt = stacked_checkpoint(tmp_path / "m.pt")

    store = open_store(tmp_path / "s.zarr")
    ds = StoreDataset(store, "mel+cqt")
    for row, rel in enumerate(store.paths):  # the inputs are the store's values, bit for bit
        clip = decode_file(corpus / rel, dict(SMALL_SPECS))
        assert clip.hash == store.hashes[row]
        np.testing.assert_array_equal(clip.features, ds.window(row, 0, int(store.lengths[row])))

    expected = predict(str(tmp_path / "s.zarr"), str(ckpt), device="cpu", progress=False)
    got = classify_files([corpus], Classifier(ckpt, CPU), topk=3, jobs=1, progress=False)
    assert [Path(f.path).name for f in got.failures] == ["broken.wav"]
    assert got.distinct == 4
    by_path = {str(Path(r.path).relative_to(corpus)): r for r in got.results}
    assert sorted(by_path) == sorted(expected.paths)
    for i, path in enumerate(expected.paths):
        np.testing.assert_allclose(by_path[path].probs, expected.probs[i], rtol=0, atol=1e-6)
        assert [lab for lab, _ in by_path[path].top] == [LABELS[k] for k in np.argsort(-expected.probs[i])]
    # the face's classify (a model path, as `specstore classify` takes it) gives the same answers
    import specstore

    face = specstore.classify([corpus], str(ckpt), topk=3, options=CPU, jobs=1, progress=False)
    assert [Path(f.path).name for f in face.failures] == ["broken.wav"]
    assert {r.path: r.probs.tolist() for r in face.results} == {r.path: r.probs.tolist() for r in got.results}


def test_cli_prints_a_table_csv_or_json_and_one_line_per_bad_file(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                 ) -> None:
    files = make_corpus(tmp_path / "c", n=2, seconds=1.0)
    bad = tmp_path / "notes.txt"
    bad.write_text("not audio")
    ckpt = make_checkpoint(tmp_path / "m.pt", spec=FeatureSpec.mel(n_bins=16))
    args = [str(f) for f in files] + ["--model", str(ckpt), "--device", "cpu", "--no-progress"]

    assert specstore_main(["classify", *args]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:3] == ["file", "seconds", "top"] and len(out) == 3
    assert all(line.split()[2] in LABELS for line in out[1:])

    assert specstore_main(["classify", str(bad), *args, "--csv", "--topk", "2"]) == 1
    captured = capsys.readouterr()
    assert captured.err.strip() == f"specstore: {bad}: not an audio file: Format not recognised."
    (tmp_path / "p.csv").write_text(captured.out)
    rows = read_predictions_csv(tmp_path / "p.csv")
    assert [r.path for r in rows] == [str(f) for f in files] and all(len(r.topk) == 2 for r in rows)

    assert specstore_main(["classify", *args, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)["files"]  # the server's answer shape (serving/test_answer_shape.py)
    assert [d["file"] for d in data] == [str(f) for f in files]
    assert abs(sum(t["prob"] for t in data[0]["top"]) - 1.0) < 1e-4  # 3 labels, top-5 lists all

    assert specstore_main(["classify", str(tmp_path / "missing.wav"), "--model", str(ckpt)]) == 2
    assert capsys.readouterr().err.startswith("specstore: error: no such file or folder")


def test_clip_logits_on_in_memory_clips_equal_the_store_loop(tmp_path: Path) -> None:
    store = open_store(make_store(tmp_path / "s.zarr", lengths=[30, 7, 120, 64, 64, 9]))
    ckpt = make_checkpoint(tmp_path / "m.pt")
    engine = Engine(CPU)
    model = engine.prepare(load_checkpoint(ckpt).build())
    expected = engine.logits(model, store, np.arange(len(store)), feature="mel", dedupe=False)
    ds = StoreDataset(store, "mel")
    arrays = [ds.window(i, 0, int(store.lengths[i])) for i in range(len(store))]
    got = engine.clip_logits(model, ArrayDataset(arrays))
    np.testing.assert_array_equal(got.logits, expected.logits)  # same clips, same plan, same numbers
    assert got.batches == expected.batches and got.efficiency == expected.efficiency
    split = engine.clip_logits(model, ArrayDataset(arrays), batch_overhead_frames=0.0)  # padding is all that counts
    assert split.batches > got.batches and split.efficiency > got.efficiency
    np.testing.assert_allclose(split.logits, expected.logits, atol=1e-5)
    fixed = engine.clip_logits(model, ArrayDataset(arrays), batches=[[0, 1, 2, 3], [4, 5]])
    assert fixed.batches == 2
    np.testing.assert_allclose(fixed.logits, expected.logits, atol=1e-5)  # a clip's answer ignores its batch
    with pytest.raises(ConfigError):
        ArrayDataset([np.zeros((16, 5), np.float32), np.zeros((8, 5), np.float32)])


def test_a_cuda_out_of_memory_splits_the_batch_and_changes_no_answer(tmp_path: Path) -> None:
    ckpt = make_checkpoint(tmp_path / "m.pt")
    clf = Classifier(ckpt, CPU)
    rng = np.random.default_rng(0)
    clips = [rng.normal(-40, 10, (16, n)).astype(np.float32) for n in (40, 38, 35, 33)]
    calm = clf.run(clips)
    forward = clf.model.forward

    def flaky(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > 1:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (faked)")
        return forward(x, lengths)

    clf.model.forward = flaky  # type: ignore[method-assign]
    split = clf.run(clips)
    assert calm.run.oom_retries == 0 and split.run.oom_retries == 3  # 4 -> 2 + 2 -> 1 + 1 + 1 + 1
    np.testing.assert_allclose(split.probs, calm.probs, atol=1e-5)


def test_a_clip_too_long_for_the_budget_runs_in_windows(tmp_path: Path) -> None:
    ckpt = make_checkpoint(tmp_path / "m.pt")
    roomy = Classifier(ckpt, CPU)
    rng = np.random.default_rng(1)
    clips = [rng.normal(-40, 10, (16, n)).astype(np.float32) for n in (3000, 50)]
    tight_budget = type(roomy.budget)(budget_bytes=int(roomy.budget.bytes(1, 1000)),
                                      cost_per_frame=roomy.budget.cost_per_frame,
                                      fixed_overhead=roomy.budget.fixed_overhead, frame_align=roomy.budget.frame_align)
    whole = roomy.run(clips)
    windowed = roomy.run(clips, budget=tight_budget)
    assert whole.run.windowed == 0 and windowed.run.windowed == 1
    np.testing.assert_allclose(windowed.probs, whole.probs, atol=1e-5)


def test_stack_parts_and_digest_bytes() -> None:
    mel = np.arange(12, dtype=np.float16).reshape(4, 3)  # (frames, bins) as stored
    cqt = -np.arange(8, dtype=np.float16).reshape(4, 2)
    x = stack_parts([mel, cqt])
    assert x.dtype == np.float32 and x.shape == (5, 4)
    np.testing.assert_array_equal(x, np.concatenate([mel.T, cqt.T]).astype(np.float32))
    with pytest.raises(ConfigError, match="one frame grid"):
        stack_parts([mel, cqt[:3]])
    with pytest.raises(ConfigError):
        stack_parts([])


def test_digest_bytes_is_the_store_content_hash(tmp_path: Path) -> None:
    data = bytes(range(256)) * 100
    (tmp_path / "f.bin").write_bytes(data)
    assert digest_bytes(data) == content_hash(tmp_path / "f.bin") != digest_bytes(data[:-1])


def test_a_cache_keyed_by_content_skips_decoding_and_gives_the_same_answers(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    files = make_corpus(tmp_path / "c", n=2, seconds=1.0)
    clf = Classifier(make_checkpoint(tmp_path / "m.pt", spec=FeatureSpec.mel(n_bins=16)), CPU)
    first = classify_files(files, clf, progress=False, cache=tmp_path / "cache")
    assert first.cached == 0 and len(list((tmp_path / "cache").glob("*.npz"))) == 2
    import specstore.serving.classify as module

    monkeypatch.setattr(module, "decode_or_reason", lambda *a: pytest.fail("decoded although cached"))
    again = classify_files(files, clf, progress=False, cache=tmp_path / "cache")
    assert again.cached == 2
    for a, b in zip(first.results, again.results, strict=True):
        np.testing.assert_array_equal(a.probs, b.probs)
        assert a.duration == b.duration
    other = Classifier(make_checkpoint(tmp_path / "m8.pt", spec=FeatureSpec.mel(n_bins=8)), CPU)
    monkeypatch.undo()
    assert classify_files(files, other, progress=False, cache=tmp_path / "cache").cached == 0  # other specs


def test_unknown_below_answers_unknown_in_json_and_csv(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``classify --unknown-below 1``: every answer is ``unknown`` (JSON ``answer``, CSV ``pred``, the table's
    answer column); the top-k lists are those of a run without it."""
    files = make_corpus(tmp_path / "c", n=2, seconds=1.0)
    ckpt = make_checkpoint(tmp_path / "m.pt", spec=FeatureSpec.mel(n_bins=16))
    args = [str(f) for f in files] + ["--model", str(ckpt), "--device", "cpu", "--no-progress"]
    assert specstore_main(["classify", *args, "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)["files"]
    assert [d["answer"] for d in plain] == [d["top"][0]["label"] for d in plain]
    assert specstore_main(["classify", *args, "--json", "--unknown-below", "1"]) == 0
    data = json.loads(capsys.readouterr().out)["files"]
    assert [d["answer"] for d in data] == ["unknown"] * 2 and [d["top"] for d in data] == [d["top"] for d in plain]
    assert specstore_main(["classify", *args, "--csv", "--unknown-below", "1"]) == 0
    (tmp_path / "p.csv").write_text(capsys.readouterr().out)
    rows = read_predictions_csv(tmp_path / "p.csv")
    assert [r.pred for r in rows] == ["unknown"] * 2 and [r.topk[0][0] for r in rows] == [d["answer"] for d in plain]
    assert specstore_main(["classify", *args, "--unknown-below", "1"]) == 0
    assert all(line.split()[2] == "unknown" for line in capsys.readouterr().out.splitlines()[1:])
    with pytest.raises(ConfigError, match="unknown_below"):
        classify_files(files, Classifier(ckpt, CPU), unknown_below=float("nan"))


def test_a_path_that_is_not_a_regular_file_is_one_line_at_once(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """A FIFO or a device is refused as ``make features`` refuses it (stat first), never opened and read."""
    import os
    import threading

    fifo = tmp_path / "pipe.wav"
    os.mkfifo(fifo)
    good = make_corpus(tmp_path / "c", n=1, seconds=1.0)[0]
    ckpt = make_checkpoint(tmp_path / "m.pt", spec=FeatureSpec.mel(n_bins=16))
    codes: list[int] = []
    run = threading.Thread(target=lambda: codes.append(specstore_main(
        ["classify", str(fifo), "/dev/zero", str(good), "--model", str(ckpt), "--device", "cpu", "--no-progress"])),
        daemon=True)  # a reader of /dev/zero never ends: a thread, so a failure is a failed test, not a hang
    run.start()
    run.join(60)
    assert not run.is_alive() and codes == [1]
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [f"specstore: {fifo}: not a regular file",
                                         "specstore: /dev/zero: not a regular file"]
    assert [line.split()[0] for line in captured.out.splitlines()[1:]] == [str(good)]

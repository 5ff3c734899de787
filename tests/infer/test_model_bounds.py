"""Everything a model file can ask for is bounded before anything is built, and a spec mismatch says what differs.

A checkpoint names its model by an architecture (a bounded :class:`~specstore.infer.models.ModelConfig`) or by an import
path; untrusted, only a class defined in its module and named directly, one of the shipped model classes, is
built, and each counts its parameters from its keyword arguments first (a sum of models: its members' total).
The temperature, every feature-spec size, the model's input rows and its label names are checked when the file
is read; ``infer predict`` refuses NaN probabilities; a spec mismatch names every difference and a ``make
features`` line that extracts a store the model fits.  Every refusal is one line.

Tests whose file would allocate gigabytes on code without the bounds run under :func:`capped`: the allocation
then fails at once (a ``RuntimeError``, so the test fails) instead of taking the memory.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import re
import resource
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from factories import LABELS, SPEC16, make_checkpoint, make_store

from specstore.common import ConfigError
from specstore.infer.cli import main as infer_main
from specstore.infer.engine.predict import predict
from specstore.infer.engine.predictions import PredictionsError
from specstore.infer.models import ModelConfig
from specstore.infer.models.checkpoint import Checkpoint, CheckpointError, load_checkpoint, save_checkpoint
from specstore.infer.models.contract import ModelSpec, resolve_class
from specstore.infer.models.trust import UntrustedModelError, is_trusted
from specstore.store import FeatureSpec

SUM = "specstore.infer.models.ensemble:SumClassifier"
BIG = dict(n_bins=16, n_classes=3, width=4096, max_width=4096, depth=2, time_kernel=15)
"""A member within the per-model bound (755 888 131 parameters), whose one 4096x4096x3x15 conv is 3 GB."""


def _vm_bytes() -> int:
    """This process's address space now (``VmSize``), bytes."""
    for line in Path("/proc/self/status").read_text(encoding="utf-8").splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmSize in /proc/self/status")


@contextlib.contextmanager
def capped(extra: int = 1 << 30) -> Iterator[None]:
    """At most ``extra`` bytes more address space while the block runs (the soft limit, restored after), on one
    torch thread (a pool of threads started inside would take address space of its own on a machine of many
    cores)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    cap = _vm_bytes() + extra
    resource.setrlimit(resource.RLIMIT_AS, (cap if hard == resource.RLIM_INFINITY else min(cap, hard), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
        torch.set_num_threads(threads)


def _save(path: Path, model: ModelSpec, *, labels: list[str] | None = None, specs: dict[str, FeatureSpec] | None = None,
          extra: dict[str, Any] | None = None, state: dict[str, torch.Tensor] | None = None) -> Path:
    """A checkpoint of ``model`` written as a file would be crafted: nothing is built."""
    feature_specs = specs or {"mel": SPEC16}
    save_checkpoint(Checkpoint(model, list(labels or LABELS), "+".join(feature_specs), feature_specs, state or {},
                               dict(extra or {})), path)
    return path


def _one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("specstore: error: "), err
    return err


def _predict_cli(store: Path, ckpt: Path, out: Path) -> int:
    return infer_main(["predict", str(store), str(ckpt), "--out", str(out), "--device", "cpu", "--no-progress"])


def _member(config: dict[str, Any], temperature: float = 1.0) -> dict[str, Any]:
    return {"model": {"target": "cnn", "kwargs": config}, "rows": [0, 16], "temperature": temperature}


# --- import paths --------------------------------------------------------------------------------------------


def test_an_import_path_names_a_class_defined_in_its_module_by_its_own_name(tmp_path: Path,
                                                                           capsys: pytest.CaptureFixture[str]) -> None:
    for trust in (False, True):  # an attribute chain is refused before any trust is asked
        with pytest.raises(ConfigError, match="attribute chain"):
            resolve_class("specstore.infer.models.ensemble:nn.Linear", trust)
    with pytest.raises(ConfigError, match="not a class defined in 'specstore.infer.models.build'"):
        resolve_class("specstore.infer.models.build:MaskedClassifier", True)  # imported there, defined elsewhere
    assert not is_trusted("specstore.infer.models.cnn:ConvBlock")  # a part of a model, not a model a file may ask for
    with pytest.raises(UntrustedModelError, match="--trust-model-code"):
        resolve_class("specstore.infer.models.cnn:ConvBlock")
    assert all(is_trusted(t) for t in ("specstore.infer.models.musicnn:MusiCNN",
                                       "specstore.infer.models.transfer:TransferClassifier", SUM))
    ckpt = _save(tmp_path / "chain.pt", ModelSpec("specstore.infer.models.ensemble:nn.Linear",
                                                  {"in_features": 16, "out_features": 3}))
    with pytest.raises(CheckpointError, match="attribute chain"):
        load_checkpoint(ckpt)
    store = make_store(tmp_path / "s.zarr", lengths=[20, 30])
    assert _predict_cli(store, ckpt, tmp_path / "p.csv") == 2
    assert "attribute chain" in _one_line(capsys) and not (tmp_path / "p.csv").exists()


# --- parameters counted before anything is built ----------------------------------------------------------------


def test_a_shipped_model_class_counts_its_parameters_from_its_arguments_first() -> None:
    from specstore.infer.models.musicnn import MusiCNN
    from specstore.infer.models.transfer import TransferClassifier

    with capped():
        with pytest.raises(ConfigError, match="n_classes must be .* got 10000000"):
            ModelSpec("specstore.infer.models.musicnn:MusiCNN", {"n_classes": 10**7}).build()  # 8 GB of output layer
        with pytest.raises(ConfigError, match="n_classes must be .* got 100000000"):
            ModelSpec("specstore.infer.models.transfer:TransferClassifier",
                      {"backbone": "musicnn-msd", "n_classes": 10**8, "embedding_dim": 200}).build()
    assert MusiCNN.count_parameters(50) == sum(p.numel() for p in MusiCNN(50).parameters())
    head = ModelSpec("specstore.infer.models.transfer:TransferClassifier",
                     {"backbone": "musicnn-msd", "n_classes": 7, "embedding_dim": 200})
    built = head.build()
    assert TransferClassifier.count_parameters(**head.kwargs) == sum(t.numel() for t in built.state_dict().values())


def test_a_sum_of_models_is_bounded_by_its_members_together(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert ModelConfig(**BIG).n_parameters == 755_888_131  # each member alone is within the bound
    two = _save(tmp_path / "two.pt", ModelSpec(SUM, {"members": [_member(BIG)] * 2, "n_classes": 3, "n_bins": 16}))
    many = _save(tmp_path / "many.pt", ModelSpec(SUM, {"members": [_member(BIG)] * 64, "n_classes": 3,
                                                       "n_bins": 16}))
    store = make_store(tmp_path / "s.zarr", lengths=[20, 30])
    with capped():
        with pytest.raises(CheckpointError, match=r"a sum of 2 models .* 1,511,776,262 parameters, above the bound"):
            load_checkpoint(two).build()
        with pytest.raises(CheckpointError, match="at least two members and at most 16, got 64"):
            load_checkpoint(many).build()
        assert _predict_cli(store, many, tmp_path / "p.csv") == 2
    assert "got 64" in _one_line(capsys)
    small = ModelConfig(n_bins=16, n_classes=3, width=4, depth=2).to_dict()
    small.pop("arch")
    hot = _save(tmp_path / "hot.pt", ModelSpec(SUM, {"members": [_member(small), _member(small, 1e-300)],
                                                     "n_classes": 3, "n_bins": 16}))
    with pytest.raises(CheckpointError, match=r"member 1's temperature must be .*\[0.01, 100\], got 1e-300"):
        load_checkpoint(hot).build()
    nested = {"model": {"target": SUM, "kwargs": {"members": [_member(small)] * 2, "n_classes": 3, "n_bins": 16}},
              "rows": [0, 16]}
    with pytest.raises(ConfigError, match="member 1 is itself a sum"):
        ModelSpec(SUM, {"members": [_member(small), nested], "n_classes": 3, "n_bins": 16}).build()


# --- what a checkpoint holds beside its model ------------------------------------------------------------------


def test_a_temperature_outside_its_range_is_one_line_when_the_checkpoint_is_read(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from specstore.infer.models.calibration import Calibration

    assert Calibration(0.01).temperature == 0.01 and Calibration(100.0).temperature == 100.0
    store = make_store(tmp_path / "s.zarr", lengths=[20, 30])
    for bad in (1e-300, 0.009, 101.0):
        ckpt = make_checkpoint(tmp_path / "t.pt", extra={"calibration": {"method": "temperature",
                                                                         "temperature": bad}})
        with pytest.raises(CheckpointError, match=r"temperature must be .*\[0.01, 100\]"):
            load_checkpoint(ckpt)
        assert _predict_cli(store, ckpt, tmp_path / "p.csv") == 2
        assert "temperature" in _one_line(capsys) and not (tmp_path / "p.csv").exists()


def test_a_spec_that_disagrees_with_the_models_input_rows_is_one_line_at_load(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    small = load_checkpoint(make_checkpoint(tmp_path / "m.pt"))  # its model reads 16 rows
    wide = FeatureSpec.mel(n_bins=32)
    ckpt = tmp_path / "bins.pt"
    save_checkpoint(Checkpoint(small.model, small.label_names, "mel", {"mel": wide}, small.state_dict), ckpt)
    with pytest.raises(CheckpointError, match="its model reads 16 input rows, but its feature 'mel' has 32 bins"):
        load_checkpoint(ckpt)
    store = make_store(tmp_path / "s.zarr", lengths=[20, 30], specs={"mel": wide})
    assert _predict_cli(store, ckpt, tmp_path / "p.csv") == 2
    assert "16 input rows" in _one_line(capsys)
    outputs = tmp_path / "outputs.pt"
    save_checkpoint(Checkpoint(small.model, ["a", "b"], "mel", small.specs, small.state_dict), outputs)
    with pytest.raises(CheckpointError, match="gives 3 outputs, but it names 2 labels"):
        load_checkpoint(outputs)


def test_duplicate_label_names_are_one_line_at_load(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    small = load_checkpoint(make_checkpoint(tmp_path / "m.pt"))
    ckpt = tmp_path / "dup.pt"
    save_checkpoint(Checkpoint(small.model, ["rock", "jazz", "rock"], "mel", small.specs, small.state_dict), ckpt)
    with pytest.raises(CheckpointError, match="label names hold 'rock' more than once"):
        load_checkpoint(ckpt)
    store = make_store(tmp_path / "s.zarr", lengths=[20, 30])
    assert _predict_cli(store, ckpt, tmp_path / "p.csv") == 2
    assert "more than once" in _one_line(capsys)


def test_predict_refuses_non_finite_probabilities(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    small = load_checkpoint(make_checkpoint(tmp_path / "m.pt"))
    state = dict(small.state_dict)
    bias = next(k for k in reversed(state) if k.endswith("bias"))  # the head's
    state[bias] = torch.full_like(state[bias], math.nan)
    ckpt = tmp_path / "nan.pt"
    save_checkpoint(Checkpoint(small.model, small.label_names, "mel", small.specs, state), ckpt)
    store = make_store(tmp_path / "s.zarr", lengths=[20, 30, 25])
    with pytest.raises(PredictionsError, match="non-finite probabilities for 3 of 3 clips"):
        predict(store, ckpt, device="cpu", progress=False)
    assert _predict_cli(store, ckpt, tmp_path / "p.csv") == 2
    assert "non-finite" in _one_line(capsys) and not (tmp_path / "p.csv").exists()


# --- feature specs -----------------------------------------------------------------------------------------------


def _spec_numbers() -> list[str]:
    return [f.name for f in dataclasses.fields(FeatureSpec) if f.name not in ("kind", "dtype")]


def test_every_feature_spec_number_is_bounded_with_a_reason() -> None:
    for name in _spec_numbers():
        limit = FeatureSpec.__dataclass_fields__[name].metadata.get("limit")
        assert limit is not None, f"{name} has no bound"
        assert math.isfinite(limit.low) and math.isfinite(limit.upper) and len(limit.why) > 10, name
        for kind in ("mel", "cqt", "musicnn"):
            assert limit.allows(getattr(FeatureSpec.of_kind(kind), name)), (kind, name)
        above = int(limit.upper) + 1 if limit.kind is int else limit.upper * 2 + 1
        for bad in (above, -1, *((math.nan, math.inf) if limit.kind is float else ())):
            with pytest.raises(ConfigError, match=rf"^{name} must be "):
                FeatureSpec.mel(**{name: bad})
    with pytest.raises(ConfigError, match=r"fmax \(9000 Hz\) must be above fmin .* half the sample rate \(8000 Hz"):
        FeatureSpec.mel(sample_rate=16000, fmax=9000.0)
    with pytest.raises(ConfigError, match="22050 frames/s, above the bound of 1000"):
        FeatureSpec.mel(hop_length=1)


def test_a_checkpoint_whose_spec_asks_for_a_huge_fft_is_one_line_at_load(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    small = load_checkpoint(make_checkpoint(tmp_path / "m.pt"))
    spec = small.spec.to_dict()
    ckpt = tmp_path / "fft.pt"
    payload_spec = object.__new__(type(small.spec))  # a record as a file holds it, written past the check
    for key, value in {**spec, "n_fft": 2**30}.items():
        object.__setattr__(payload_spec, key, value)
    save_checkpoint(Checkpoint(small.model, small.label_names, "mel", {"mel": payload_spec}, small.state_dict), ckpt)
    with pytest.raises(CheckpointError, match=r"bad feature spec: n_fft must be an integer in \[2, 65536\]"):
        load_checkpoint(ckpt)
    store = make_store(tmp_path / "s.zarr", lengths=[20, 30])
    assert _predict_cli(store, ckpt, tmp_path / "p.csv") == 2
    assert "n_fft" in _one_line(capsys)


def _status(main: Any, argv: list[str]) -> int:
    """A command's exit status, whether its parser ends it (``SystemExit``) or its body returns it."""
    try:
        return int(main(argv))
    except SystemExit as e:
        return int(e.code or 0)


def test_feature_options_are_bounded_on_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from specstore.pipeline.cli import main as features_main
    from specstore.pipeline.testing import write_music_like

    corpus = tmp_path / "corpus"
    write_music_like(corpus / "rock" / "a.wav", 0.5)
    store = tmp_path / "s.zarr"
    for args, flag in ((["--fmax", "nan"], "--fmax"), (["--sample-rate", "1000000000"], "--sample-rate"),
                       (["--n-mels", "1000000"], "--n-mels"), (["--n-fft", str(2**30)], "--n-fft"),
                       (["--hop", "0"], "--hop"), (["--fmax", "1e30"], "--fmax")):
        assert _status(features_main, [str(corpus), str(store), "--no-progress", "--jobs", "1", *args]) == 2, args
        assert _one_line(capsys).startswith(f"specstore: error: {flag} must be "), args
        assert not store.exists()
    spec_file = tmp_path / "spec.toml"
    spec_file.write_text("[mel]\nfmax = nan\n", encoding="utf-8")
    assert _status(features_main, [str(corpus), str(store), "--no-progress", "--spec", str(spec_file)]) == 2
    assert f"spec file {spec_file} [mel]: fmax must be" in _one_line(capsys) and not store.exists()


# --- a spec mismatch ---------------------------------------------------------------------------------------------


def _specs_of_command(args: list[str], features: str, spec_file: Path | None = None) -> dict[str, FeatureSpec]:
    """What ``specstore-features`` makes of ``--features FEATURES ARGS`` (its own parser and spec reader)."""
    from specstore.pipeline.cli import build_parser
    from specstore.pipeline.spec_options import specs_from_options

    words = [w if w != "model-features.toml" or spec_file is None else str(spec_file) for w in args]
    a = build_parser().parse_args(["corpus", "store", "--features", features, *words])
    return specs_from_options(features.split(","), spec_file=a.spec, sample_rate=a.sample_rate, hop=a.hop,
                              n_mels=a.n_mels, n_fft=a.n_fft, fmax=getattr(a, "fmax", "default"),
                              cqt_bins=a.cqt_bins)


def test_a_spec_mismatch_names_every_difference_and_a_command_that_works(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from specstore.infer.models import build_model
    from specstore.infer.options.defaults import PLAIN_MODEL

    specs = {"mel": FeatureSpec.mel(n_bins=64), "cqt": FeatureSpec.cqt()}
    net = build_model(ModelConfig(**{**PLAIN_MODEL, "width": 4, "depth": 2, "n_bins": 64 + 84, "n_classes": 3}))
    model = tmp_path / "wide.pt"
    save_checkpoint(Checkpoint.from_model(net, LABELS, "mel+cqt", specs), model)
    store = make_store(tmp_path / "s.zarr", lengths=[20, 30], specs={"mel": FeatureSpec.mel()})
    assert _predict_cli(store, model, tmp_path / "p.csv") == 2
    err = _one_line(capsys)
    assert "mel.n_bins: 64 != 128" in err and "cqt: not in the store" in err, err
    command = shlex.split(re.search(r"`(make features [^`]*)`", err).group(1))  # type: ignore[union-attr]
    words = dict(w.split("=", 1) for w in command[2:])
    assert words["FEATURES"] == "mel,cqt" and Path(words["STORE"]) != store  # a new store, not this one
    assert _specs_of_command(shlex.split(words.get("ARGS", "")), words["FEATURES"]) == specs


@pytest.mark.parametrize("specs", [
    {"mel": FeatureSpec.mel(n_bins=64, hop_length=256, fmax=None)},
    {"mel": FeatureSpec.mel(n_bins=40, fmin=30.0, power=1.0, dtype="float32"), "cqt": FeatureSpec.cqt(n_bins=72)},
    {"cqt": FeatureSpec.cqt(bins_per_octave=24, n_bins=96, sample_rate=44100)},
    {"musicnn": FeatureSpec.of_kind("musicnn"), "mel": FeatureSpec.mel(sample_rate=16000, hop_length=256,
                                                                        n_bins=64)},
])
def test_the_suggested_extraction_makes_exactly_the_models_specs(tmp_path: Path,
                                                                 specs: dict[str, FeatureSpec]) -> None:
    from specstore.store.spec_command import extraction_args

    args, tables = extraction_args(specs)
    spec_file = None
    if tables:
        spec_file = tmp_path / "model-features.toml"
        spec_file.write_text("".join(f"[{name}]\n" + "".join(f"{k} = {_toml(v)}\n" for k, v in table.items())
                                     for name, table in tables.items()), encoding="utf-8")
        args += ["--spec", "model-features.toml"]
    assert _specs_of_command(args, ",".join(specs), spec_file) == specs


def _toml(value: Any) -> str:
    return '"none"' if value is None else f'"{value}"' if isinstance(value, str) else repr(value)

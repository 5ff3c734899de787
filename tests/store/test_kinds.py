"""Feature kinds: each is one object in store/kinds.py (parameters, options, defaults, recipe, display) plus its
computation in pipeline/kinds.py.

The built-in kinds' records are the bytes every store and checkpoint holds.  A toy kind (a linear-frequency
STFT magnitude) is registered from this file only and shown to get its command-line options, its spec and
spec-file table, the command a spec mismatch suggests, its export recipe and its display from its one
object, and to be extracted into a store and read back, with no other module edited.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import librosa
import numpy as np
import pytest

from specstore.common import ConfigError
from specstore.common.limits import bounded
from specstore.pipeline import extract  # make features' Python API
from specstore.pipeline.features import compute_features
from specstore.pipeline.kinds import (
    WholeSignal,
    computation_names,
    plan_for,
    register_computation,
    unregister_computation,
)
from specstore.pipeline.spec_options import read_spec_file, specs_from_args, specs_from_options
from specstore.pipeline.testing import write_music_like
from specstore.store import FeatureSpec, default_specs, open_store
from specstore.store.kinds import (
    CQT,
    DEFAULT_KINDS,
    MEL,
    BinFrequencies,
    FeatureKind,
    MelSpec,
    baseline_kinds,
    db_limits,
    feature_kind,
    field_of,
    kind_names,
    mel_frequencies,
    picture_feature,
    register_kind,
    unregister_kind,
)
from specstore.store.spec_command import extraction_args

RECORDS = {
    "mel": '{"kind": "mel", "sample_rate": 22050, "hop_length": 512, "n_bins": 128, "n_fft": 2048, "fmin": 0.0, '
           '"fmax": 8000.0, "bins_per_octave": null, "power": 2.0, "db_ref": 1.0, "amin": 1e-10, "dtype": "float16", '
           '"compute_version": 2}',
    "cqt": '{"kind": "cqt", "sample_rate": 22050, "hop_length": 512, "n_bins": 84, "n_fft": null, '
           '"fmin": 32.70319566257483, "fmax": null, "bins_per_octave": 12, "power": 1.0, "db_ref": 1.0, '
           '"amin": 1e-05, "dtype": "float16", "compute_version": 2}',
    "musicnn": '{"kind": "musicnn", "sample_rate": 16000, "hop_length": 256, "n_bins": 96, "n_fft": 512, '
               '"fmin": 0.0, "fmax": null, "bins_per_octave": null, "power": 2.0, "db_ref": 1.0, "amin": 1e-10, '
               '"dtype": "float32", "compute_version": 2}',
}
"""The built-in kinds' default records, as stores and checkpoints written before kinds had their own parameters
hold them (json.dumps of the group attribute): the same bytes, in the same order."""


def test_every_kind_has_a_computation_and_every_computation_a_kind() -> None:
    assert kind_names() == computation_names() == ("mel", "cqt", "musicnn")
    assert set(DEFAULT_KINDS) <= set(kind_names()) and baseline_kinds() == ("mel", "cqt")


def test_the_built_in_records_are_the_bytes_stores_and_checkpoints_hold() -> None:
    for name, record in RECORDS.items():
        spec = FeatureSpec.of_kind(name)
        assert json.dumps(spec.to_dict()) == record
        assert type(spec) is feature_kind(name).params and FeatureSpec.from_dict(json.loads(record)) == spec
        assert dict(feature_kind(name).defaults) == {k: v for k, v in json.loads(record).items() if k != "kind"}
    assert FeatureSpec.mel() == FeatureSpec(kind="mel") == MEL.spec() and isinstance(FeatureSpec(kind="mel"), MelSpec)
    assert FeatureSpec.cqt(n_bins=24) == FeatureSpec.of_kind("cqt", n_bins=24)
    assert default_specs() == {"mel": FeatureSpec.mel(), "cqt": FeatureSpec.cqt()}
    assert dict(db_limits) == {"mel": (-60.0, 40.0), "cqt": (-80.0, 20.0), "musicnn": (0.0, 5.0)}
    old = {k: v for k, v in json.loads(RECORDS["cqt"]).items() if k != "compute_version"}
    assert FeatureSpec.from_dict(old).compute_version == 1  # a record from before compute versions


def test_every_number_of_every_kind_is_bounded_with_a_reason() -> None:
    for name in kind_names():
        params = feature_kind(name).params
        for f in dataclasses.fields(params):
            if f.name in ("kind", "dtype"):
                continue
            limit = f.metadata.get("limit")
            assert limit is not None and len(limit.why) > 10, (name, f.name)
            assert math.isfinite(limit.low) and math.isfinite(limit.upper), (name, f.name)
            above = int(limit.upper) + 1 if limit.kind is int else limit.upper * 2 + 1
            with pytest.raises(ConfigError, match=rf"^{f.name} must be "):
                FeatureSpec.of_kind(name, **{f.name: above})


def test_unknown_kinds_are_refused_with_the_known_ones() -> None:
    known = r"\('mel', 'cqt', 'musicnn'\)"
    with pytest.raises(ConfigError, match=rf"unknown feature kind 'chroma'; expected one of {known}"):
        FeatureSpec(kind="chroma")
    with pytest.raises(ConfigError, match=rf"unknown feature kind 'chroma'; expected one of {known}"):
        FeatureSpec.from_dict({"kind": "chroma"})
    with pytest.raises(ConfigError, match="names no kind"):
        FeatureSpec.from_dict({"n_bins": 3})
    with pytest.raises(ConfigError, match=r"unknown feature 'chroma'; choose from \['cqt', 'mel', 'musicnn'\]"):
        default_specs(["chroma"])
    with pytest.raises(ConfigError, match="already registered"):
        register_kind(feature_kind("mel"))
    with pytest.raises(ConfigError, match="already has a computation"):
        register_computation("mel", lambda spec: plan_for(spec))
    with pytest.raises(ConfigError, match="a cqt spec is a CqtSpec, not a MelSpec"):
        MelSpec(kind="cqt")


def test_the_picture_is_the_preferred_kind_else_the_first_feature() -> None:
    mel, cqt = FeatureSpec.mel(), FeatureSpec.cqt()
    assert picture_feature({"c": cqt, "m": mel}) == "m"
    assert picture_feature({"c": cqt, "d": cqt}) == "c"
    assert feature_kind("cqt").log_frequency and not feature_kind("mel").log_frequency
    assert CQT.octave_bins is not None and CQT.octave_bins(FeatureSpec.cqt(bins_per_octave=24, n_bins=96)) == 24


@pytest.mark.parametrize("spec", [FeatureSpec.mel(), FeatureSpec.mel(n_bins=16, fmin=50.0, fmax=None),
                                  FeatureSpec.of_kind("musicnn"), FeatureSpec.cqt(bins_per_octave=24, n_bins=96)])
def test_the_bins_frequencies_are_librosas(spec: FeatureSpec) -> None:
    frequencies = spec.kind_info.frequencies
    assert frequencies is not None
    bins = frequencies(spec)
    if spec.kind_info.log_frequency:
        expected = librosa.cqt_frequencies(spec.n_bins, fmin=spec.fmin, bins_per_octave=spec.bins_per_octave)
        np.testing.assert_allclose([bins.warp(f) for f in bins.centres], np.log2(expected), rtol=1e-12)
    else:
        top = spec.fmax if spec.fmax is not None else spec.sample_rate / 2
        expected = librosa.mel_frequencies(spec.n_bins + 2, fmin=spec.fmin, fmax=top)[1:-1]
        np.testing.assert_allclose([bins.warp(f) for f in bins.centres], librosa.hz_to_mel(expected), rtol=1e-12)
    np.testing.assert_allclose(bins.centres, expected, rtol=1e-12)
    np.testing.assert_allclose(mel_frequencies(7, 30.0, 11025.0), librosa.mel_frequencies(7, fmin=30.0, fmax=11025.0),
                               rtol=1e-12)


def _recipe(kind: FeatureKind[Any], y: np.ndarray, spec: FeatureSpec) -> np.ndarray:
    """The kind's export recipe, run as the sidecar says: ``(frames, bins)`` float32."""
    assert kind.recipe is not None
    names = {n.id for n in ast.walk(ast.parse(kind.recipe, mode="eval")) if isinstance(n, ast.Name)}
    assert names <= {*spec.record_fields(), "y", "librosa", "abs"}, names
    return np.asarray(eval(kind.recipe, {"librosa": librosa, "y": y, **spec.to_dict()}), np.float32).T


def test_the_export_recipes_compute_the_stored_values(tmp_path: Path) -> None:
    path = write_music_like(tmp_path / "a.wav", 3.0, seed=3)
    specs = {"mel": FeatureSpec.mel(n_bins=40), "cqt": FeatureSpec.cqt(n_bins=48)}
    got = compute_features(path, specs).arrays
    y, _ = librosa.load(path, sr=22050, mono=True)
    for name, spec in specs.items():
        np.testing.assert_allclose(got[name], _recipe(spec.kind_info, y, spec), atol=2e-3)


# -- a kind registered from this file only ------------------------------------------------------------


@dataclass(frozen=True)
class LinearSpec(FeatureSpec):
    """A toy kind: |STFT| in dB on a linear frequency axis, ``n_bins = n_fft / 2 + 1`` rows from 0 Hz."""

    n_bins: int = field_of(FeatureSpec, "n_bins", 129, help="linear-frequency bins, n_fft / 2 + 1",
                           flag="--stft-bins", metavar="N")
    db_ref: float = bounded(1.0, 1e-20, 1e20, "the magnitude of 0 dB; beyond 1e+-20 values move by 200 dB")
    amin: float = bounded(1e-5, 1e-30, 1.0, "floor of the magnitude before the log (1e-5 is -100 dB)")

    def check(self) -> None:
        if self.n_bins < 2:
            raise ConfigError(f"linear n_bins must be at least 2, not {self.n_bins}")

    @property
    def n_fft(self) -> int:
        return 2 * (self.n_bins - 1)


def linear_db(y: np.ndarray, spec: LinearSpec) -> np.ndarray:
    """The toy kind's values: ``(n_frames, n_bins)`` float32 magnitude dB."""
    mag = np.abs(librosa.stft(y, n_fft=spec.n_fft, hop_length=spec.hop_length))
    return librosa.amplitude_to_db(mag, ref=spec.db_ref, amin=spec.amin, top_db=None).T.astype(np.float32)


def _linear_bins(spec: LinearSpec) -> BinFrequencies:
    return BinFrequencies(tuple(k * spec.sample_rate / spec.n_fft for k in range(spec.n_bins)), lambda hz: hz)


LINEAR: FeatureKind[LinearSpec] = FeatureKind(
    name="linear", params=LinearSpec, db_limits=(-80.0, 30.0), axis=lambda spec: {"y_axis": "linear"},
    frequencies=_linear_bins,
    recipe="librosa.amplitude_to_db(abs(librosa.stft(y, n_fft=2 * (n_bins - 1), hop_length=hop_length)), "
           "ref=db_ref, amin=amin, top_db=None)",
)


@pytest.fixture
def linear_kind() -> Iterator[FeatureKind[LinearSpec]]:
    kind = register_kind(LINEAR)
    register_computation("linear", lambda spec: WholeSignal(spec, linear_db, spec.n_fft))
    try:
        yield kind
    finally:
        unregister_computation("linear")
        unregister_kind("linear")


def test_a_whole_signal_computation_of_the_wrong_shape_is_refused() -> None:
    spec = FeatureSpec.mel(n_bins=4)
    stream = WholeSignal(spec, lambda y, s: np.zeros((3, 4), np.float32)).stream(0)
    stream.feed(np.zeros(2048, np.float32))
    with pytest.raises(ValueError, match=r"the mel computation gave values of shape \(3, 4\), not .* \(5, 4\)"):
        stream.finish(2048, 5)


def test_a_kind_is_refused_whose_options_are_anothers() -> None:
    @dataclass(frozen=True)
    class Clash(FeatureSpec):
        n_bins: int = field_of(FeatureSpec, "n_bins", 12, help="bins", flag="--n-mels")

    with pytest.raises(ConfigError, match="option.s. --n-mels are another kind's or the grid's"):
        register_kind(FeatureKind(name="clash", params=Clash, db_limits=(0.0, 1.0), axis=lambda s: {}))
    with pytest.raises(ConfigError, match="the recipe is not a Python expression"):
        register_kind(dataclasses.replace(LINEAR, recipe="import os"))
    assert "clash" not in kind_names() and "linear" not in kind_names()


def test_a_kinds_options_spec_recipe_and_display_come_from_its_one_object(
        tmp_path: Path, linear_kind: FeatureKind[LinearSpec], capsys: pytest.CaptureFixture[str]) -> None:
    from specstore.pipeline.cli import build_parser

    # the spec: the kind's own fields, its defaults, read back from the record
    spec = FeatureSpec.of_kind("linear", n_bins=65)
    assert type(spec) is LinearSpec and FeatureSpec(kind="linear", n_bins=65) == spec == linear_kind.spec(n_bins=65)
    assert list(spec.to_dict()) == ["kind", "sample_rate", "hop_length", "n_bins", "db_ref", "amin", "dtype",
                                    "compute_version"]
    assert FeatureSpec.from_dict(spec.to_dict()) == spec and linear_kind.defaults["n_bins"] == 129
    with pytest.raises(ConfigError, match="unknown feature spec field.s.: fmax"):
        FeatureSpec.from_dict({**spec.to_dict(), "fmax": 8000.0})
    # the command line: its option, generated from the field, with the field's default and bound
    parser = build_parser()
    assert "--stft-bins N" in parser.format_help() and "linear-frequency bins, n_fft / 2 + 1 (default 129)" in \
        parser.format_help().replace("\n", " ").replace("  ", " ")
    args = parser.parse_args(["corpus", "store", "--features", "linear,mel", "--stft-bins", "65", "--n-mels", "16"])
    assert specs_from_args(("linear", "mel"), args) == {"linear": spec, "mel": FeatureSpec.mel(n_bins=16)}
    with pytest.raises(SystemExit):
        parser.parse_args(["corpus", "store", "--stft-bins", "4096"])
    assert capsys.readouterr().err.startswith("specstore: error: --stft-bins must be an integer in [1, 1024]")
    with pytest.raises(ConfigError, match="--stft-bins set the linear feature, which is not extracted"):
        specs_from_options(["mel"], stft_bins=65)
    table = tmp_path / "f.toml"
    table.write_text("[linear]\nn_bins = 33\namin = 1e-6\n", encoding="utf-8")
    assert read_spec_file(table) == {"linear": {"n_bins": 33, "amin": 1e-6}}
    assert specs_from_options(spec_file=table) == {"linear": FeatureSpec.of_kind("linear", n_bins=33, amin=1e-6)}
    # the command a spec mismatch suggests: its flag, and a spec file for a field without one
    assert extraction_args({"linear": spec}) == (["--stft-bins", "65"], {})
    assert extraction_args({"linear": linear_kind.spec(amin=1e-6)}) == ([], {"linear": {"amin": 1e-6}})
    # the export recipe, the text a sidecar gives, computes the values
    y = np.sin(np.linspace(0, 400, 8000)).astype(np.float32)
    np.testing.assert_allclose(_recipe(linear_kind, y, spec), linear_db(y, spec), atol=1e-4)
    # the display
    from specstore.infer.explore.figures import specshow_kwargs
    from specstore.serving.picture import frequency_ticks

    assert db_limits["linear"] == (-80.0, 30.0) and specshow_kwargs(spec)["y_axis"] == "linear"
    assert picture_feature({"l": spec, "m": FeatureSpec.mel()}) == "m" and picture_feature({"l": spec}) == "l"
    ticks = frequency_ticks(spec)
    assert ticks and all(abs(float(t["label"].removesuffix(" Hz")) - (t["at"] * 65 - 0.5) * 22050 / 128) < 1e-6
                         for t in ticks)


def test_a_kinds_recipe_is_what_an_export_sidecar_gives(tmp_path: Path,
                                                        linear_kind: FeatureKind[LinearSpec]) -> None:
    from factories import make_checkpoint

    from specstore.infer.engine.export import sidecar
    from specstore.infer.models.checkpoint import load_checkpoint

    spec = linear_kind.spec(n_bins=33)
    ckpt = load_checkpoint(make_checkpoint(tmp_path / "m.pt", spec=spec))
    feature = sidecar(ckpt, "onnx", "m.onnx")["features"]["mel"]
    assert feature == {**spec.to_dict(), "values": linear_kind.recipe, "frames": "1 + len(y) // hop_length",
                       "rounding": feature["rounding"]}


def test_a_kind_registered_from_user_code_is_extracted_and_read_back(
        tmp_path: Path, linear_kind: FeatureKind[LinearSpec]) -> None:
    assert kind_names() == computation_names() == (*DEFAULT_KINDS, "musicnn", "linear")
    corpus = tmp_path / "corpus"
    files = [write_music_like(corpus / label / f"{label}.wav", 0.6 + 0.2 * k, seed=k)
             for k, label in enumerate(("rock", "jazz"))]
    specs = {"mel": FeatureSpec.mel(n_bins=16), "linear": FeatureSpec.of_kind("linear")}
    summary = extract(corpus, tmp_path / "s.zarr", specs=specs, jobs=1, backend="threading", progress=False)
    assert summary.indexed == 2 and not summary.errors
    store = open_store(tmp_path / "s.zarr")
    assert store.specs["linear"] == specs["linear"] and db_limits["linear"] == (-80.0, 30.0)
    for path in files:
        i = list(store.paths).index(f"{path.parent.name}/{path.name}")
        y, _ = librosa.load(path, sr=22050, mono=True)
        linear = specs["linear"]
        assert isinstance(linear, LinearSpec)
        expected = linear_db(y, linear).astype(np.float16)
        np.testing.assert_array_equal(np.asarray(store.feature("linear").frames(i)), expected)
        mel = compute_features(path, {"mel": specs["mel"]}, out_dtypes={"mel": "float16"}).arrays["mel"]
        np.testing.assert_array_equal(np.asarray(store.feature("mel").frames(i)), mel)
    assert picture_feature(store.specs) == "mel"

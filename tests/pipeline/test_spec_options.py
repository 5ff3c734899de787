"""Feature parameters on the command line (pipeline/spec_options.py): flags, a --spec TOML file, the store's record."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from specstore.common import ConfigError
from specstore.pipeline.cli import build_parser
from specstore.pipeline.cli import main as features_main
from specstore.pipeline.spec_options import specs_from_options
from specstore.store import FeatureSpec, open_store


def test_help_lists_every_spec_option(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--help"])
    out = capsys.readouterr().out
    for flag in ("--spec", "--sample-rate", "--hop", "--n-mels", "--n-fft", "--fmax", "--cqt-bins", "--add-corpus"):
        assert flag in out, flag


def test_the_options_generated_from_the_kinds_are_the_ones_written_before() -> None:
    """Each option's name, metavar, default on the namespace and help, as the hand-written ones had them."""
    actions = {a.option_strings[0]: a for a in build_parser()._actions if a.option_strings}
    expected = {
        "--spec": ("FILE.toml", None, "feature specs from a TOML file: a [mel] and/or [cqt] table of spec fields"),
        "--sample-rate": ("HZ", None, "decode to this sample rate, Hz (every feature; default 22050)"),
        "--hop": ("SAMPLES", None, "hop between frames, samples (every feature; default 512)"),
        "--n-mels": ("N", None, "mel bands (default 128)"),
        "--n-fft": ("SAMPLES", None, "mel FFT size, samples (default 2048)"),
        "--fmax": ("HZ", argparse.SUPPRESS, "highest mel frequency, Hz, or none for half the sample rate "
                                            "(default 8000)"),
        "--cqt-bins": ("N", None, "CQT bins, 12 per octave from C1 (default 84)"),
    }
    for flag, (metavar, default, text) in expected.items():
        a = actions[flag]
        assert (a.metavar, a.default, a.help) == (metavar, default, text), flag
    assert [f for f in actions if f in expected] == list(expected)
    args = build_parser().parse_args(["c", "s"])
    assert (args.sample_rate, args.hop, args.n_mels, args.n_fft, args.cqt_bins) == (None,) * 5
    assert not hasattr(args, "fmax")
    for word in ("none", "nyquist", "None"):
        assert build_parser().parse_args(["c", "s", "--fmax", word]).fmax is None
    assert build_parser().parse_args(["c", "s", "--fmax", "7000"]).fmax == 7000.0


def test_specs_from_options_takes_every_option_by_name() -> None:
    assert specs_from_options(["mel"], fmax="default", n_mels=None)["mel"] == FeatureSpec.mel()
    assert specs_from_options(["mel"], fmax=None)["mel"] == FeatureSpec.mel(fmax=None)
    with pytest.raises(TypeError, match="unknown option.s. n_mel; the options are sample_rate, hop, n_mels"):
        specs_from_options(["mel"], n_mel=64)
    with pytest.raises(ConfigError, match="^--n-mels must be an integer in"):
        specs_from_options(["mel"], n_mels=0)
    with pytest.raises(ConfigError, match="mel spec: fmax .* give --fmax HZ, or --fmax none$"):
        specs_from_options(["mel"], sample_rate=8000)


def test_defaults_flags_and_file_in_that_order(tmp_path: Path) -> None:
    assert specs_from_options() == {"mel": FeatureSpec.mel(), "cqt": FeatureSpec.cqt()}
    spec = tmp_path / "f.toml"
    spec.write_text('[mel]\nsample_rate = 16000\nhop_length = 256\nn_bins = 64\nfmax = "none"\n', encoding="utf-8")
    from_file = specs_from_options(spec_file=spec)
    assert list(from_file) == ["mel"]  # the file's tables are the features unless --features says otherwise
    assert from_file["mel"] == FeatureSpec.mel(sample_rate=16000, hop_length=256, n_bins=64, fmax=None)
    both = specs_from_options(["mel", "cqt"], spec_file=spec, n_mels=40, cqt_bins=72, fmax=7000.0)
    assert both["mel"] == FeatureSpec.mel(sample_rate=16000, hop_length=256, n_bins=40, fmax=7000.0)
    assert both["cqt"] == FeatureSpec.cqt(sample_rate=16000, hop_length=256, n_bins=72)  # shares the frame grid
    assert specs_from_options(["mel"], sample_rate=44100, hop=1024, n_fft=4096)["mel"] == FeatureSpec.mel(
        sample_rate=44100, hop_length=1024, n_fft=4096)


@pytest.mark.parametrize(("text", "kwargs", "words"), [
    ("[chroma]\nn_bins = 12\n", {}, "is not a feature"),
    ("[mel]\nn_mels = 64\n", {}, "unknown [mel] field(s) n_mels"),
    ("[mel]\nn_bins = '64'\n", {}, "n_bins must be a whole number"),
    ("[mel\n", {}, "not valid TOML"),
    ("[cqt]\nn_bins = 60\n", {"features": ["mel"]}, "the spec file has [cqt]"),
    ("", {"features": ["cqt"], "n_mels": 64}, "set the mel feature, which is not extracted"),
])
def test_bad_specs_are_one_line_errors(tmp_path: Path, text: str, kwargs: dict[str, object], words: str) -> None:
    spec = tmp_path / "f.toml"
    spec.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as e:
        specs_from_options(spec_file=spec, **kwargs)  # type: ignore[arg-type]
    assert words in str(e.value) and "\n" not in str(e.value)


def test_the_command_line_records_the_specs_in_the_store(tmp_path: Path, corpus: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    store = tmp_path / "s.zarr"
    assert features_main([str(corpus), str(store), "--jobs", "1", "--no-progress", "--sample-rate", "16000",
                          "--hop", "256", "--n-mels", "24", "--fmax", "7000", "--cqt-bins", "36"]) == 0
    s = open_store(store)
    assert s.specs["mel"] == FeatureSpec.mel(sample_rate=16000, hop_length=256, n_bins=24, fmax=7000.0)
    assert s.specs["cqt"] == FeatureSpec.cqt(sample_rate=16000, hop_length=256, n_bins=36)
    assert s[0].shape[0] == 24 and len(s) == 8
    capsys.readouterr()
    # the same store with other parameters is refused, naming what differs
    assert features_main([str(corpus), str(store), "--jobs", "1", "--no-progress", "--n-mels", "32"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("specstore: error:") and "n_bins" in err and len(err.splitlines()) == 1

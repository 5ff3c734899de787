"""Tests for democorpus: plan, layout, formats, determinism, song form, recording chain, style overlap, CLI."""

from __future__ import annotations

import os
import re
import struct
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from specstore.democorpus import (
    FORMATS,
    LOUDNESS_DBFS,
    MEDIA,
    SAMPLE_RATES,
    STYLES,
    ClipPlan,
    DemoCorpusError,
    encode_clip,
    generate_corpus,
    main,
    plan_corpus,
    render_clip,
)
from specstore.democorpus.arrangement import ROLES, Arrangement, Section, Stem
from specstore.democorpus.dsp import Ctx
from specstore.democorpus.form import SECTION_KINDS, stem_gains
from specstore.democorpus.plan import rng_for
from specstore.democorpus.recording import through_medium
from specstore.democorpus.styles import RECIPES

REPO = Path(__file__).resolve().parents[2]
FORMATS_FIRST = next(iter(FORMATS))
NAME_RE = re.compile(r"^(?P<style>[a-z]+)_(?P<index>\d{3})\.(?P<ext>wav|flac|ogg|mp3)$")
# 16 files per style cover every (format, sample rate, channels) combination.
TINY = dict(n_per_style=16, seed=7, min_seconds=0.3, max_seconds=1.2, progress=False)


def _audio_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and p.suffix != ".txt")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[ClipPlan]]:
    out = tmp_path_factory.mktemp("tiny_corpus")
    summary = generate_corpus(out, jobs=1, **TINY)
    return out, list(summary.clips)


# ---- plan ------------------------------------------------------------------------------------


def test_default_plan_styles_formats_and_balance() -> None:
    plans = plan_corpus()
    assert len(STYLES) >= 6
    per_style = Counter(p.style for p in plans)
    assert set(per_style) == set(STYLES) and set(per_style.values()) == {40}
    for style in STYLES:
        mine = [p for p in plans if p.style == style]
        # Encodings are balanced inside every style, so none of them predicts the label.
        assert Counter(p.ext for p in mine) == {ext: 10 for ext in FORMATS}
        assert Counter(p.sample_rate for p in mine) == {sr: 20 for sr in SAMPLE_RATES}
        assert Counter(p.channels for p in mine) == {1: 20, 2: 20}
        assert len({(p.ext, p.sample_rate, p.channels) for p in mine}) == 16
    for p in plans:
        m = NAME_RE.match(Path(p.relpath).name)
        assert m and p.relpath.split("/")[0] == p.style == m["style"] and m["ext"] == p.ext
        assert int(m["index"]) == p.index


def test_default_durations_span_few_seconds_to_minutes() -> None:
    plans = plan_corpus()
    d = np.array([p.duration_s for p in plans])
    assert 5.0 <= d.min() <= 6.0
    assert 220.0 <= d.max() <= 240.0
    assert 12.0 <= float(np.median(d)) <= 25.0
    assert np.mean(d < 30.0) >= 0.6  # most files are short
    for style in STYLES:  # every style gets the whole spread
        ds = np.array([p.duration_s for p in plans if p.style == style])
        assert ds.min() <= 6.0 and ds.max() >= 220.0
    six_by_forty_h = float(np.mean(d)) * 6 * 40 / 3600.0
    assert 1.5 <= six_by_forty_h <= 2.5


def test_plan_is_deterministic_and_seed_dependent() -> None:
    assert plan_corpus(10, seed=3) == plan_corpus(10, seed=3)
    a = [p.duration_s for p in plan_corpus(10, seed=3)]
    b = [p.duration_s for p in plan_corpus(10, seed=4)]
    assert a != b


def test_plan_rejects_bad_arguments() -> None:
    with pytest.raises(DemoCorpusError, match="n_per_style"):
        plan_corpus(0)
    with pytest.raises(DemoCorpusError, match="below min_seconds"):
        plan_corpus(2, min_seconds=10.0, max_seconds=5.0)
    with pytest.raises(DemoCorpusError, match="unknown format"):
        plan_corpus(2, formats=("wav", "aiff"))
    with pytest.raises(DemoCorpusError, match="unknown style"):
        plan_corpus(2, styles=("polka",))
    with pytest.raises(DemoCorpusError, match="seed"):
        plan_corpus(2, seed=-1)


# ---- generated corpus ------------------------------------------------------------------------


def test_layout_is_folder_per_label(tiny: tuple[Path, list[ClipPlan]]) -> None:
    out, plans = tiny
    files = _audio_files(out)
    assert sorted(str(p.relative_to(out)) for p in files) == sorted(p.relpath for p in plans)
    assert sorted(d.name for d in out.iterdir() if d.is_dir()) == sorted(STYLES)
    assert [p.name for p in out.iterdir() if p.is_file()] == ["README.txt"]
    for f in files:
        m = NAME_RE.match(f.name)
        assert m and m["style"] == f.parent.name
    assert not list(out.rglob("*.part"))


def test_every_format_present_and_decodable_as_planned(tiny: tuple[Path, list[ClipPlan]]) -> None:
    out, plans = tiny
    assert {p.ext for p in plans} == set(FORMATS)
    assert {p.sample_rate for p in plans} == set(SAMPLE_RATES)
    assert {p.channels for p in plans} == {1, 2}
    for p in plans:
        info = sf.info(str(out / p.relpath))
        assert info.format == FORMATS[p.ext][0]
        assert (info.samplerate, info.channels, info.frames) == (p.sample_rate, p.channels, p.n_frames)
        data, sr = sf.read(str(out / p.relpath), dtype="float32", always_2d=True)
        assert data.shape == (p.n_frames, p.channels) and sr == p.sample_rate
        assert np.isfinite(data).all()
        rms_db = 20 * np.log10(np.sqrt(np.mean(data.astype(np.float64) ** 2)))
        assert LOUDNESS_DBFS[0] - 3.0 <= rms_db <= LOUDNESS_DBFS[1] + 1.0, (p.relpath, rms_db)
    durations = sorted(p.n_frames / p.sample_rate for p in plans)
    assert durations[0] == pytest.approx(0.3, abs=0.01) and durations[-1] == pytest.approx(1.2, abs=0.04)
    assert len({(p.ext, p.sample_rate, p.channels) for p in plans}) == 16


@pytest.mark.slow
def test_same_seed_gives_identical_bytes_in_any_number_of_processes(tiny: tuple[Path, list[ClipPlan]],
                                                                     tmp_path: Path) -> None:
    """Regenerate every style (every encoding occurs in each) in 2 worker processes, and a subset of the
    styles in 3: the same bytes as the fixture's single-process corpus."""
    out, plans = tiny
    again = generate_corpus(tmp_path / "two", jobs=2, **TINY)
    assert {p.relpath for p in again.clips} == {p.relpath for p in plans}
    for p in again.clips:
        assert (tmp_path / "two" / p.relpath).read_bytes() == (out / p.relpath).read_bytes(), p.relpath
    third = generate_corpus(tmp_path / "three", jobs=3, styles=("jazz", "techno"), **TINY)
    assert {p.ext for p in third.clips} == set(FORMATS)
    for p in third.clips:
        assert (tmp_path / "three" / p.relpath).read_bytes() == (out / p.relpath).read_bytes(), p.relpath


def test_render_is_a_pure_function_of_the_plan() -> None:
    """Long enough for several sections of the song form and every step of the recording chain."""
    for style in STYLES:
        plan = ClipPlan(style, 3, f"{style}/x", 9.0, "wav", 44100, 2, 5)
        a, b = render_clip(plan), render_clip(plan)
        assert a.tobytes() == b.tobytes(), style


def test_other_seed_gives_other_audio(tiny: tuple[Path, list[ClipPlan]]) -> None:
    out, plans = tiny
    p = next(p for p in plans if p.ext == "wav")
    other = render_clip(
        ClipPlan(p.style, p.index, p.relpath, p.duration_s, p.ext, p.sample_rate, p.channels, p.seed + 1)
    )
    mine, _ = sf.read(str(out / p.relpath), dtype="float32", always_2d=True)
    assert other.shape == mine.shape
    assert np.abs(other - mine).max() > 0.05


def _ogg_crc_reference(data: bytes) -> int:
    crc = 0
    for byte in data:
        crc ^= byte << 24
        for _ in range(8):
            crc = ((crc << 1) ^ 0x04C11DB7) & 0xFFFFFFFF if crc & 0x80000000 else (crc << 1) & 0xFFFFFFFF
    return crc


def test_ogg_pages_carry_fixed_serial_and_valid_crc() -> None:
    audio = (0.1 * np.random.default_rng(0).standard_normal((30000, 2))).astype(np.float32)
    data = encode_clip(audio, 22050, "ogg", serial=0xC0FFEE)
    assert data == encode_clip(audio, 22050, "ogg", serial=0xC0FFEE)
    pos, pages = 0, 0
    while pos < len(data):
        assert data[pos : pos + 4] == b"OggS"
        n_seg = data[pos + 26]
        end = pos + 27 + n_seg + sum(data[pos + 27 : pos + 27 + n_seg])
        assert struct.unpack_from("<I", data, pos + 14)[0] == 0xC0FFEE
        page = bytearray(data[pos:end])
        crc = struct.unpack_from("<I", page, 22)[0]
        page[22:26] = b"\0\0\0\0"
        assert crc == _ogg_crc_reference(bytes(page))
        pos, pages = end, pages + 1
    assert pages >= 3
    import io

    decoded, sr = sf.read(io.BytesIO(data), dtype="float32")
    assert sr == 22050 and decoded.shape == audio.shape


def test_foreign_files_are_refused_and_stale_ones_pruned(tmp_path: Path) -> None:
    kw = dict(n_per_style=1, max_seconds=0.3, styles=("ambient",), progress=False, jobs=1)
    generate_corpus(tmp_path, **kw)
    stale = tmp_path / "ambient" / "ambient_007.wav"
    stale.write_bytes(b"old")
    with pytest.raises(DemoCorpusError, match="would not write"):
        generate_corpus(tmp_path, **kw)
    leftover = tmp_path / "ambient" / ".ambient_000.wav.part"  # from an interrupted run
    leftover.write_bytes(b"half")
    generate_corpus(tmp_path, prune=True, **kw)
    assert not stale.exists() and not leftover.exists()
    assert [p.name for p in (tmp_path / "ambient").iterdir()] == [f"ambient_000.{FORMATS_FIRST}"]
    keep = tmp_path / "ambient" / "notes.txt"
    keep.write_text("mine")
    with pytest.raises(DemoCorpusError, match="would not write"):
        generate_corpus(tmp_path, prune=True, **kw)
    assert keep.read_text() == "mine"


# ---- audio content -----------------------------------------------------------------------------


def _band_features(x: np.ndarray, sr: int) -> np.ndarray:
    """Gain-independent summary: mean/std over time of 24 log bands, plus onset autocorrelation."""
    n_fft, hop = 2048, 512
    frames = np.lib.stride_tricks.sliding_window_view(x, n_fft)[::hop] * np.hanning(n_fft)
    power = np.abs(np.fft.rfft(frames, axis=1)) ** 2
    freqs = np.fft.rfftfreq(n_fft, 1.0 / sr)
    edges = np.geomspace(40.0, 8000.0, 25)
    bands = np.stack(
        [power[:, (freqs >= lo) & (freqs < hi)].sum(1) for lo, hi in zip(edges[:-1], edges[1:], strict=False)], axis=1
    )
    db = 10 * np.log10(bands + 1e-10)
    db -= db.mean()
    flux = np.maximum(np.diff(db, axis=0), 0.0).sum(1)
    flux = (flux - flux.mean()) / (flux.std() + 1e-9)
    ac = np.correlate(flux, flux, "full")[len(flux) - 1 :][2:64:2] / len(flux)
    return np.concatenate([db.mean(0), db.std(0), ac])


def test_styles_are_learnable_but_overlap() -> None:
    """Leave-one-out nearest centroid on cheap spectral/rhythm features of 6 s renders.

    Well above chance (1/7): the styles have not degenerated into one another.  Well below
    1.0: neighbouring styles share instruments, tempi and sections and the recordings vary,
    as real genres do (the corpus before that scored 1.0 here, and so did every model).
    """
    per_style = 6
    feats, labels = [], []
    for s_idx, style in enumerate(STYLES):
        for i in range(per_style):
            plan = ClipPlan(style, i, f"{style}/x", 6.0, "wav", 22050, 1, 11)
            feats.append(_band_features(render_clip(plan)[:, 0].astype(np.float64), 22050))
            labels.append(s_idx)
    x, y = np.array(feats), np.array(labels)
    x = (x - x.mean(0)) / (x.std(0) + 1e-9)
    correct = 0
    for k in range(len(x)):
        rest = np.arange(len(x)) != k
        cents = np.stack([x[rest & (y == c)].mean(0) for c in range(len(STYLES))])
        correct += int(np.argmin(((cents - x[k]) ** 2).sum(1)) == y[k])
    acc = correct / len(x)
    assert acc >= 0.45, f"leave-one-out accuracy {acc:.2f}: the styles are (nearly) indistinguishable"
    assert acc <= 0.9, f"leave-one-out accuracy {acc:.2f}: the styles are trivially separable again"


def _arrangement(style: str, index: int, seconds: float) -> Arrangement:
    rng = rng_for(0, style, 0, index)
    return RECIPES[style](Ctx(rng, 22050, int(seconds * 22050), 1.0))


@pytest.mark.slow
def test_every_style_has_roles_and_a_varied_song_form() -> None:
    for style in STYLES:
        kinds: set[frozenset[str]] = set()
        n_stems: set[int] = set()
        for i in range(6):
            arr = _arrangement(style, i, 20.0)
            assert arr.stems and all(st.role in ROLES for st in arr.stems), style
            assert all(st.audio.shape == (20 * 22050,) and np.isfinite(st.audio).all() for st in arr.stems)
            assert arr.form and arr.form[0].start_s == 0.0, style
            starts = [s.start_s for s in arr.form]
            assert starts == sorted(starts) and starts[-1] < 20.0
            assert all(s.roles in SECTION_KINDS.values() for s in arr.form)
            kinds |= {s.roles for s in arr.form}
            n_stems.add(len(arr.stems))
        # Sections change what plays, and optional instruments change the band, within every style.
        assert len(kinds) >= 2 and len(n_stems) >= 2, (style, kinds, n_stems)


def test_stem_gains_follow_the_form() -> None:
    sr, n = 1000, 3000
    stems = [Stem(np.ones(n), 0.0, 0.0, "drums"), Stem(np.ones(n), 0.0, 0.0, "chords"),
             Stem(np.zeros(n), 0.0, 0.0, "lead")]
    form = [Section(0.0, SECTION_KINDS["full"], 0.0), Section(1.0, SECTION_KINDS["intro"], -6.0),
            Section(2.0, SECTION_KINDS["solo"], 0.0)]
    drums, chords, _lead = stem_gains(form, stems, n, sr, ramp_s=0.01)
    assert drums is not None and chords is not None
    # Every change is a 10 ms linear ramp starting at the section's start.
    assert np.allclose(drums[:1000], 1.0) and np.allclose(drums[1010:2000], 0.0)
    assert np.allclose(chords[1010:2000], 10 ** (-6 / 20)) and np.all(np.diff(chords[999:1010]) < 0)
    # "solo" wants drums, bass, lead: the lead is silent and there is no bass, so drums alone would
    # play; the section still plays (drums), and the chords rest.
    assert np.allclose(drums[2010:], 1.0) and np.allclose(chords[2010:], 0.0)
    # A section in which nothing that sounds would play lets every stem play.
    only_lead = [Section(0.0, frozenset({"lead"}), 0.0)]
    gains = stem_gains(only_lead, stems, n, sr)[:2]  # (the silent lead's gain does not matter)
    assert [g is None or np.allclose(g, 1.0) for g in gains] == [True, True]
    assert stem_gains([], stems, n, sr) == [None, None, None]


def _band_db(y: np.ndarray, sr: int, inside: tuple[float, float], outside: tuple[float, float]) -> float:
    """Mean power (dB) of the first channel of ``y`` in band ``inside`` relative to band ``outside`` (Hz)."""
    spec = np.abs(np.fft.rfft(y[:, 0])) ** 2
    f = np.fft.rfftfreq(len(y), 1.0 / sr)
    return float(10 * np.log10(spec[(f > inside[0]) & (f < inside[1])].mean()
                               / spec[(f > outside[0]) & (f < outside[1])].mean()))


def test_media_band_limit_and_keep_the_shape() -> None:
    sr = 22050
    x = np.random.default_rng(0).standard_normal((4 * sr, 2))
    assert set(MEDIA) == {"clean", "bitrate", "tape", "lofi", "radio", "phone"}
    assert abs(sum(MEDIA.values()) - 1.0) < 1e-9
    out = {m: through_medium(x.copy(), m, np.random.default_rng(k), sr) for k, m in enumerate(MEDIA)}
    for m, y in out.items():
        assert y.shape == x.shape and np.isfinite(y).all(), m
    assert out["clean"].tobytes() == x.tobytes()
    # Telephone and AM radio: fixed bands; the rest: at least the highest octave is cut.
    assert _band_db(out["phone"], sr, (600.0, 2500.0), (6000.0, 11000.0)) > 30.0
    assert _band_db(out["phone"], sr, (600.0, 2500.0), (20.0, 100.0)) > 20.0
    assert _band_db(out["radio"], sr, (400.0, 3000.0), (8000.0, 11000.0)) > 30.0
    for m in ("bitrate", "tape", "lofi"):
        assert _band_db(out[m], sr, (500.0, 3000.0), (10500.0, 11000.0)) > 6.0, m
    with pytest.raises(ValueError, match="unknown medium"):
        through_medium(x, "wax cylinder", np.random.default_rng(1), sr)


def test_render_is_bounded_and_short_clips_work() -> None:
    for style in STYLES:
        for sr, ch, dur in ((22050, 1, 0.1), (44100, 2, 1.3)):
            a = render_clip(ClipPlan(style, 0, "x", dur, "wav", sr, ch, 0))
            assert a.dtype == np.float32 and a.shape == (round(dur * sr), ch)
            assert np.isfinite(a).all() and np.abs(a).max() < 1.0 and np.abs(a).max() > 0.0


# ---- CLI ---------------------------------------------------------------------------------------


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run(
        [sys.executable, "-m", "specstore", "demo-corpus", *args], cwd=REPO, env=env, capture_output=True, text=True,
        timeout=120)


@pytest.mark.slow
def test_cli_help() -> None:
    r = _cli("--help")
    assert r.returncode == 0
    for word in ("OUT_DIR", "--per-style", "--seed", "--max-seconds", *STYLES):
        assert word in r.stdout


@pytest.mark.slow
def test_cli_writes_tiny_corpus(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    r = _cli(
        str(out),
        "--per-style",
        "2",
        "--max-seconds",
        "0.5",
        "--styles",
        "jazz,techno",
        "--formats",
        "ogg,mp3",
        "-j",
        "1",
    )
    assert r.returncode == 0, r.stderr
    files = _audio_files(out)
    assert len(files) == 4
    assert {f.parent.name for f in files} == {"jazz", "techno"}
    assert {f.suffix for f in files} == {".ogg", ".mp3"}
    assert "wrote 4 files" in r.stderr
    for f in files:
        assert sf.info(str(f)).duration == pytest.approx(0.5, abs=0.01)


@pytest.mark.slow
def test_cli_bad_input_is_one_line_exit_2(tmp_path: Path) -> None:
    r = _cli(str(tmp_path / "x"), "--per-style", "0")
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("specstore: error: ") and "--per-style" in lines[0], r.stderr
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize(
    "args, word",
    [
        (("--formats", "aiff"), "aiff"),
        (("--max-seconds", "1", "--min-seconds", "2"), "min_seconds"),
        (("-j", "0"), "--jobs"),
    ],
)
def test_main_bad_input_exits_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: tuple[str, ...], word: str
) -> None:
    try:
        status = main([str(tmp_path / "x"), "--quiet", *args])
    except SystemExit as e:  # a number out of its bounds is refused as the command line is parsed
        status = e.code
    assert status == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("specstore: error: ") and word in err[0]


def test_progress_bar_shows_rounded_seconds(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The bar counts float seconds; what it shows is rounded (not ``4843.599999999999/7212.0``)."""
    generate_corpus(tmp_path, n_per_style=3, seed=3, min_seconds=0.3, max_seconds=0.7, styles=("ambient",),
                    progress=True, jobs=1)
    shown = re.findall(r"(\d+(?:\.\d+)?)/(\d+(?:\.\d+)?) s", capsys.readouterr().err)
    assert shown and all(len(x.partition(".")[2]) <= 1 for pair in shown for x in pair), shown[-3:]
    assert shown[-1][0] == shown[-1][1]
    from tqdm import tqdm

    from specstore.democorpus.generate import PROGRESS_BAR
    line = tqdm.format_meter(4843.599999999999, 7212.0, 10.0, bar_format=PROGRESS_BAR["bar_format"], unit="s")
    assert "4843.6/7212.0 s" in line

"""The notebook helpers: spectrogram / length / label plots (infer.explore.figures) and the
confusion tools (infer.explore), checked against hand computations on stores written directly."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import librosa
import numpy as np
import pytest
from factories import make_store as _make_store
from matplotlib.figure import Figure

from specstore.infer.explore import (
    ExploreError,
    Outcomes,
    Predictions,
    confusion_figure,
    load_outcomes,
    metrics_from_confusion,
    most_confused,
    outcomes_from_csv,
    outcomes_from_predictions,
    per_class_table,
    quick_train,
    read_predictions_csv,
    write_predictions_csv,
)
from specstore.infer.explore import confusion_matrix_figure as draw_confusion
from specstore.infer.explore import figures as plots
from specstore.infer.models.checkpoint import load_checkpoint
from specstore.store import FeatureSpec, create_store, open_store

PNG = b"\x89PNG\r\n\x1a\n"
MEL = FeatureSpec.mel()
CQT = FeatureSpec.cqt()
STORE_LABELS = ["rock", "pop", "ambient"]  # "pop" is unknown to the model below
MODEL_LABELS = ["ambient", "jazz", "rock"]


def make_store(path: Path, labels: list[str | None], *, seed: int = 0, features: tuple[str, ...] = ("mel", "cqt"),
               lengths: list[int] | None = None) -> Path:
    """Clip k has label ``labels[k]``, path ``<label>/c<k:03d>.wav`` and ``lengths[k]`` frames (random dB values)."""
    specs = {"mel": MEL, "cqt": CQT}
    lengths = lengths or [20 + (37 * k) % 70 for k in range(len(labels))]
    return _make_store(path, labels, lengths=lengths, label_names=STORE_LABELS, specs={k: specs[k] for k in features},
                       seed=seed, mean=-50.0, std=15.0)


def panels(fig: Figure) -> list:
    """The axes holding spectrograms (not the colour bars)."""
    return [a for a in fig.axes if a.collections and a.get_label() != "<colorbar>"]


def png_bytes(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


# -- infer.explore.figures ------------------------------------------------------------------------------

def test_specshow_kwargs_follow_the_spec() -> None:
    mel = plots.specshow_kwargs(FeatureSpec.mel(sample_rate=16000, hop_length=256, fmin=30.0, fmax=None))
    assert mel == {"sr": 16000, "hop_length": 256, "x_axis": "time", "y_axis": "mel", "fmin": 30.0, "fmax": 8000.0}
    cqt = plots.specshow_kwargs(FeatureSpec.cqt(bins_per_octave=24, n_bins=168, fmin=55.0))
    assert cqt["y_axis"] == "cqt_note" and cqt["fmin"] == 55.0 and cqt["bins_per_octave"] == 24
    assert cqt["sr"] == 22050 and cqt["hop_length"] == 512


def test_show_feature_axes_are_in_seconds_and_hz(tmp_path: Path) -> None:
    s = open_store(make_store(tmp_path / "s.zarr", ["rock", "ambient"], lengths=[40, 87]))
    row = int(np.argmax(s.lengths))
    n_frames = int(s.lengths[row])
    fig = plots.show_feature(s, row, "mel")
    ax = fig.axes[0]
    # time: frame k centred at k * hop / sr seconds (librosa's centred frames), so edges half a hop either side
    hop_s = MEL.hop_length / MEL.sample_rate
    assert ax.get_xlim() == pytest.approx((-0.5 * hop_s, (n_frames - 0.5) * hop_s), rel=1e-6)
    # frequency: the mel axis spans fmin..fmax (bin edges half a mel band beyond the filter centres);
    # a wrong fmax (e.g. sr / 2 = 11025 Hz) would stretch it
    centres = librosa.mel_frequencies(MEL.n_bins + 2, fmin=MEL.fmin, fmax=MEL.fmax)[1:-1]
    lo, hi = ax.get_ylim()
    assert lo <= centres[0] and hi >= centres[-1]
    assert hi == pytest.approx(MEL.fmax, rel=0.02) and lo == pytest.approx(MEL.fmin, abs=centres[1] - centres[0])
    # the plotted values are the stored dB, bins x frames
    mesh = ax.collections[0]
    assert np.asarray(mesh.get_array()).reshape(MEL.n_bins, n_frames) == pytest.approx(
        np.asarray(s[row], dtype=np.float32), abs=1e-3)

    fig = plots.show_feature(s, row, "cqt", colorbar=False)
    ax = fig.axes[0]
    assert len(fig.axes) == 1
    freqs = librosa.cqt_frequencies(CQT.n_bins, fmin=CQT.fmin, bins_per_octave=CQT.bins_per_octave)
    lo, hi = ax.get_ylim()
    # bin centres are C1 .. B7: the axis covers them and ends within a semitone of them
    # (a wrong fmin or bins_per_octave would move or stretch it by octaves)
    assert lo <= freqs[0] < freqs[-1] <= hi
    assert lo > freqs[0] * 2 ** (-1 / 12) and hi < freqs[-1] * 2 ** (1 / 12)
    assert png_bytes(fig).startswith(PNG)


def test_show_clip_draws_every_feature(tmp_path: Path) -> None:
    s = open_store(make_store(tmp_path / "s.zarr", ["rock", None, "pop"]))
    row = s.paths.index("none/c001.wav")
    fig = plots.show_clip(s, row)
    assert [a.get_title() for a in panels(fig)] == ["mel (128 bins)", "cqt (84 bins)"]
    assert len(fig.axes) == 4  # and a colour bar each
    assert "none/c001.wav" in fig._suptitle.get_text() and "unlabelled" in fig._suptitle.get_text()
    assert png_bytes(fig).startswith(PNG)

    only = plots.show_clip(s, -1, features=["cqt"])
    assert len(panels(only)) == 1

    given = Figure()
    axes = given.subplots(2, 1)  # an ndarray of axes, as plt.subplots gives
    assert plots.show_clip(s, 0, ax=axes) is given
    assert all(a.collections for a in axes)
    with pytest.raises(plots.PlotError, match="2 feature"):
        plots.show_clip(s, 0, ax=axes[0])
    with pytest.raises(KeyError, match="no feature 'chroma'"):
        plots.show_clip(s, 0, features=["mel", "chroma"])
    with pytest.raises(IndexError, match="out of range"):
        plots.show_clip(s, 3)

    mel_only = open_store(make_store(tmp_path / "m.zarr", ["rock"], features=("mel",)))
    assert len(panels(plots.show_clip(mel_only, 0))) == 1


def test_durations_and_label_counts(tmp_path: Path) -> None:
    labels: list[str | None] = ["rock", "rock", "ambient", None, "rock", None, "ambient"]
    s = open_store(make_store(tmp_path / "s.zarr", labels, lengths=[10, 20, 30, 40, 500, 60, 70]))
    counts = plots.label_counts(s)
    assert counts == {"rock": 3, "pop": 0, "ambient": 2, plots.UNLABELLED: 2}

    fig = plots.plot_label_counts(s)
    heights = [p.get_height() for p in fig.axes[0].patches]
    assert heights == [3, 0, 2, 2]
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == list(counts)

    fig = plots.plot_durations(s, bins=5)
    ax = fig.axes[0]
    assert sum(p.get_height() for p in ax.patches) == len(s)
    assert ax.get_xscale() == "log"  # 500 frames vs 10: a long tail, shown on a log axis
    assert "median" in ax.get_legend().get_texts()[0].get_text()
    assert plots.plot_durations(s, log=False).axes[0].get_xscale() == "linear"
    assert png_bytes(fig).startswith(PNG)


# -- infer.explore -------------------------------------------------------------------------------

LABELS8: list[str | None] = ["rock", "ambient", "pop", None, "rock", "ambient", "rock", "ambient"]


def hand_predictions(s, probs_by_path: dict[str, list[float]]) -> Predictions:
    paths = list(probs_by_path)
    truth = [s.label_names[s.labels[s.paths.index(p)]] if s.labels[s.paths.index(p)] >= 0 else None for p in paths]
    return Predictions(paths, np.array([probs_by_path[p] for p in paths], dtype=np.float32), MODEL_LABELS, truth)


@pytest.fixture()
def labelled(tmp_path: Path):
    s = open_store(make_store(tmp_path / "s.zarr", LABELS8))
    # model classes: ambient, jazz, rock.  Listed in an order other than the store's rows.
    probs = {
        "rock/c006.wav":    [0.10, 0.10, 0.80],  # rock -> rock (right)
        "rock/c000.wav":    [0.70, 0.05, 0.25],  # rock -> ambient, p(truth) 0.25
        "ambient/c001.wav": [0.60, 0.30, 0.10],  # ambient -> ambient
        "pop/c002.wav":     [0.20, 0.50, 0.30],  # pop (unknown to the model) -> jazz, p(truth) 0
        "none/c003.wav":    [0.30, 0.30, 0.40],  # unlabelled: skipped
        "rock/c004.wav":    [0.05, 0.90, 0.05],  # rock -> jazz, most confident error
        "ambient/c005.wav": [0.45, 0.10, 0.45],  # tie: argmax takes ambient (right)
        "ambient/c007.wav": [0.20, 0.20, 0.60],  # ambient -> rock
    }
    return s, hand_predictions(s, probs)


def test_outcomes_from_predictions_match_a_hand_count(labelled) -> None:
    s, pred = labelled
    o = outcomes_from_predictions(pred, s)
    assert o.label_names == MODEL_LABELS + ["pop"]
    assert len(o) == 7 and o.n_unlabelled == 1
    by_path = {p: k for k, p in enumerate(o.paths)}
    assert all(s.paths[int(r)] == p for r, p in zip(o.rows, o.paths, strict=False))
    # rows: truth ambient, jazz, rock, pop; columns: prediction
    expected = np.array([[2, 0, 1, 0],
                         [0, 0, 0, 0],
                         [1, 1, 1, 0],
                         [0, 1, 0, 0]])
    assert o.confusion().tolist() == expected.tolist()
    assert o.accuracy == pytest.approx(3 / 7)
    m = o.metrics()
    assert m == metrics_from_confusion(expected, MODEL_LABELS + ["pop"])
    assert o.truth_prob[by_path["rock/c000.wav"]] == pytest.approx(0.25)
    assert o.truth_prob[by_path["pop/c002.wav"]] == 0.0
    assert o.pred_prob[by_path["rock/c004.wav"]] == pytest.approx(0.90)
    assert o.truth_exact.all()
    assert "accuracy 42.9%" in o.describe()
    assert "1 unlabelled skipped" in o.describe()
    assert "predictions from" not in o.describe()  # it says where they came from only when told
    named = outcomes_from_predictions(pred, s, source="model demo.pt")
    assert named.describe().endswith("; predictions from model demo.pt")

    table = per_class_table(o)
    assert [r["label"] for r in table.records] == o.label_names
    assert table.records[2]["recall"] == pytest.approx(1 / 3) and table.records[2]["support"] == 3


def test_most_confused_orders(labelled) -> None:
    s, pred = labelled
    o = load_outcomes(s, pred)
    low = most_confused(o, 3, by="truth")
    # lowest true-class probability first: pop (0), rock/c04 (0.05), ambient/c07 (0.20)
    assert [r["path"] for r in low.records] == ["pop/c002.wav", "rock/c004.wav", "ambient/c007.wav"]
    assert list(low.rows) == [s.paths.index(p) for p in ("pop/c002.wav", "rock/c004.wav", "ambient/c007.wav")]
    assert low.records[1]["truth"] == "rock" and low.records[1]["pred"] == "jazz"
    assert low.records[1]["p(truth)"] == "0.050"

    wrong = most_confused(o, 10, by="wrong")
    # only errors, most confident first: c04 (0.90), c00 (0.70), c07 (0.60), c02 (0.50)
    assert [r["path"] for r in wrong.records] == ["rock/c004.wav", "rock/c000.wav", "ambient/c007.wav",
                                                  "pop/c002.wav"]
    assert wrong.caption.startswith("4 of 4 misclassified")
    assert [r["p(pred)"] for r in wrong.records] == pytest.approx([0.9, 0.7, 0.6, 0.5])
    assert len(most_confused(o, 0)) == 0
    with pytest.raises(ExploreError, match="by must be one of"):
        most_confused(o, by="loss")

    text = wrong.text()
    assert text.splitlines()[1].split() == ["row", "path", "seconds", "truth", "pred", "p(pred)", "p(truth)"]
    assert "rock/c004.wav" in text.splitlines()[2]
    page = wrong._repr_html_()
    assert page.count("<tr>") == 1 + 4 and "<td>rock/c004.wav</td>" in page


def test_csv_predictions_give_the_same_outcomes(labelled, tmp_path: Path) -> None:
    s, pred = labelled
    full = outcomes_from_predictions(pred, s)
    csv_path = write_predictions_csv(pred, tmp_path / "p.csv", topk=2)
    recs = read_predictions_csv(csv_path)
    assert len(recs) == 8 and recs[0].topk[0][0] == recs[0].pred and len(recs[0].topk) == 2
    o = outcomes_from_csv(csv_path, s)
    # classes from a CSV: the store's labels, then other predicted names
    assert o.label_names == STORE_LABELS + ["jazz"]
    assert o.n_unlabelled == 1 and sorted(o.paths) == sorted(full.paths)

    def named(x: Outcomes) -> dict[str, tuple[str, str]]:
        return {p: (x.label_names[t], x.label_names[q]) for p, t, q in zip(x.paths, x.truth, x.pred, strict=False)}

    assert named(o) == named(full)
    assert o.accuracy == pytest.approx(full.accuracy)
    k = o.paths.index("rock/c000.wav")  # truth rock is second in its top-2: exact
    assert o.truth_exact[k] and o.truth_prob[k] == pytest.approx(0.25, abs=1e-4)
    k = o.paths.index("rock/c004.wav")  # top-2 jazz 0.90, ambient 0.05: rock only bounded by min(0.05, 0.05)
    assert not o.truth_exact[k] and o.truth_prob[k] == pytest.approx(0.05, abs=1e-4)
    row = most_confused(o, 10, by="truth").records
    marks = {r["path"]: r["p(truth)"] for r in row}
    assert marks["rock/c004.wav"].startswith("<=") and not marks["rock/c000.wav"].startswith("<=")
    assert load_outcomes(s, str(csv_path)).confusion().tolist() == o.confusion().tolist()


def test_bad_predictions_are_one_line_errors(labelled, tmp_path: Path) -> None:
    s, _ = labelled
    bad = tmp_path / "bad.csv"
    bad.write_text("file,label\nx.wav,rock\n", encoding="utf-8")
    with pytest.raises(ExploreError, match="header must start with path,pred,prob,topk,truth"):
        read_predictions_csv(bad)
    bad.write_text("path,pred,prob,topk,truth\nrock/c000.wav,rock,high,rock:0.5,rock\n", encoding="utf-8")
    with pytest.raises(ExploreError, match="line 2: probability 'high'"):
        read_predictions_csv(bad)
    bad.write_text("path,pred,prob,topk,truth\nrock/c000.wav,rock,0.5,rock=0.5,rock\n", encoding="utf-8")
    with pytest.raises(ExploreError, match="not label:probability"):
        read_predictions_csv(bad)
    with pytest.raises(ExploreError, match="cannot read predictions"):
        read_predictions_csv(tmp_path / "missing.csv")
    other = Predictions(["elsewhere/x.wav"], np.array([[1.0, 0.0, 0.0]]), MODEL_LABELS, [None])
    with pytest.raises(ExploreError, match="1 path\\(s\\) not in the store.*elsewhere/x.wav"):
        outcomes_from_predictions(other, s)
    with open(tmp_path / "other.csv", "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows([["path", "pred", "prob", "topk", "truth"], ["elsewhere/x.wav", "rock", "1", "", ""]])
    with pytest.raises(ExploreError, match="not in the store"):
        outcomes_from_csv(tmp_path / "other.csv", s)
    assert issubclass(ExploreError, ValueError)  # notebooks and CLIs treat it as bad input


def test_confusion_figures_inline_and_into_an_axes(labelled) -> None:
    s, pred = labelled
    o = outcomes_from_predictions(pred, s)
    fig = confusion_figure(o, title="t")
    ax = fig.axes[0]
    share = np.asarray(ax.images[0].get_array())
    cm = o.confusion()
    support = cm.sum(axis=1, keepdims=True)
    assert share == pytest.approx(np.divide(cm, support, out=np.zeros(cm.shape), where=support > 0))
    assert "3/7 correct" in ax.get_title()
    assert [t.get_text() for t in ax.get_xticklabels()] == o.label_names
    assert png_bytes(fig).startswith(PNG)

    host = Figure()
    a, b = host.subplots(1, 2)
    assert draw_confusion(cm, o.label_names, ax=b) is host
    assert len(b.images) == 1 and not a.images
    with pytest.raises(ValueError, match="4x4"):
        draw_confusion(cm[:2, :2], o.label_names)


def test_quick_train_writes_a_small_checkpoint(tmp_path: Path) -> None:
    spec = FeatureSpec.mel(n_bins=16)  # the fixed cost of a training run grows with the bins
    rng = np.random.default_rng(0)
    w = create_store(tmp_path / "s.zarr", {"mel": spec}, label_names=["a", "b"])
    w.add_clips([{"path": f"{'ab'[k % 2]}/{k}.wav", "hash": f"h{k}", "label": "ab"[k % 2], "duration": 1.0}
                 for k in range(8)], {"mel": [rng.normal(-40, 10, (40, 16)).astype(np.float32) for _ in range(8)]})
    model = tmp_path / "m.pt"
    result = quick_train(str(tmp_path / "s.zarr"), model, epochs=1, crop_seconds=None, val_fraction=0.0)
    assert result.epochs_run == 1 and result.config.width == 8 and result.config.run.device == "cpu"
    ckpt = load_checkpoint(model)
    assert ckpt.label_names == ["a", "b"] and ckpt.spec == spec


def test_colours_compare_across_clips_time_is_labelled_and_notes_reach_the_title(tmp_path: Path) -> None:
    """Fixed dB colour limits per feature (not autoscaled per panel), a time axis in seconds, a note in the title."""
    s = open_store(make_store(tmp_path / "s.zarr", ["rock", "ambient"], lengths=[40, 87]))
    quiet = plots.show_feature(s, 0, "mel").axes[0].collections[0]
    loud = plots.show_feature(s, 1, "mel").axes[0].collections[0]
    assert quiet.get_clim() == loud.get_clim() == plots.DB_LIMITS["mel"]
    fig = plots.show_clip(s, 1, note="predicted jazz (p 0.81)")
    assert "predicted jazz (p 0.81)" in fig._suptitle.get_text()
    assert [a.get_xlabel() for a in panels(fig)][-1] == "time (s)"
    cqt = [a for a in panels(fig) if a.get_title().startswith("cqt")][0]
    assert cqt.collections[0].get_clim() == plots.DB_LIMITS["cqt"]
    custom = plots.show_clip(s, 0, db_limits={"mel": (-10.0, 10.0)})
    assert panels(custom)[0].collections[0].get_clim() == (-10.0, 10.0)


def test_topk_labels_with_separators_round_trip(tmp_path: Path) -> None:
    """Labels holding ':' ';' or '%' cannot make the topk column ambiguous: they are escaped, and read back."""
    from specstore.infer.engine.predictions import escape_label, unescape_label

    names = ["a:b", "c;d", "50%:x", "plain"]
    for name in names:
        assert unescape_label(escape_label(name)) == name and ":" not in escape_label(name)
    probs = np.array([[0.5, 0.3, 0.15, 0.05], [0.1, 0.2, 0.3, 0.4]], dtype=np.float32)
    pred = Predictions(["x/1.wav", "x/2.wav"], probs, names, ["a:b", None])
    recs = read_predictions_csv(write_predictions_csv(pred, tmp_path / "p.csv", topk=4))
    assert [n for n, _ in recs[0].topk] == ["a:b", "c;d", "50%:x", "plain"]
    assert [n for n, _ in recs[1].topk] == ["plain", "50%:x", "c;d", "a:b"]
    assert recs[0].pred == "a:b" and recs[0].truth == "a:b" and recs[1].truth is None
    assert [p for _, p in recs[0].topk] == pytest.approx([0.5, 0.3, 0.15, 0.05], abs=1e-4)

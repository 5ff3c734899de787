"""``make features`` / ``specstore-features``: decode a corpus once into a feature store."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from specstore.common import ConfigError, run_cli, setup_logging
from specstore.common.options import add_options, given
from specstore.store.kinds import kind_names

from .corpus import CorpusError
from .extract_options import ExtractOptions
from .spec_options import add_spec_options, specs_from_args

EPILOG = """\
examples:
  specstore-features ~/music/gtzan data/gtzan.zarr
  specstore-features manifest.csv data/set.zarr --features mel --jobs 8 --layout zstd
  specstore-features ~/music/gtzan data/16k.zarr --sample-rate 16000 --hop 256 --n-mels 64 --cqt-bins 72
  specstore-features ~/music/gtzan data/mine.zarr --spec features.toml
  specstore-features ~/music/stems data/stems.zarr --group-by parent
  specstore-features ~/music/stems data/stems.zarr --group-by '^[^/]+/([^/_]+)_'

The corpus is a folder with one sub-folder per label (GTZAN style) or a CSV
with a header 'path,label[,group]' (label and group may be empty; relative
paths are relative to the CSV). wav, flac, ogg, opus, mp3 and aiff are read;
m4a/AAC (.m4a .m4b .aac) and wma through PyAV where it is installed
(pip install 'specstore[formats]'; otherwise such files are bad files naming it).
Rerunning the same command resumes an interrupted run and adds only new or
changed files; identical files are decoded once. Bad files are recorded in
the store's error table with their reason (`python -m specstore store info STORE`) and
never stop the run: among them links that lead out of the corpus folder (or
the manifest's folder; --follow-links follows them) and files whose header
declares more or less audio than they hold. One run writes a store at a
time; a store holds one corpus unless --add-corpus adds another.

Groups keep the stems, excerpts or movements of one work on one side of
every train/validation split and cross-validation fold. A manifest has a
group column; a folder corpus gets groups with --group-by: 'parent' (the
file's folder below its label folder: rock/album/t.wav is in group 'album';
files directly in a label folder get none) or a regular expression searched
in the path relative to the corpus root (the group is its first capture
group, else the whole match; files it does not match get none). Files
without a group are split by content; their count is logged. Each run sets
the groups anew: rerun with another --group-by (or none) to regroup without
decoding again.

Feature parameters default to 22 050 Hz mono; log-mel n_fft 2048, hop 512,
128 mels up to 8 kHz; CQT 84 bins from C1, hop 512. A --spec file holds one
TOML table per feature ([mel], [cqt]) of spec fields (sample_rate,
hop_length, n_bins, n_fft, fmin, fmax, bins_per_octave, dtype, ...); the
flags override it. The store records every feature's spec.
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="specstore features", description="Decode an audio corpus into a zarr v3 feature store (log-mel, CQT).",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("corpus", help="folder of label sub-folders, or a path,label CSV manifest")
    p.add_argument("store", help="output store: a local path or an fsspec URL (use --layout zstd for remote)")
    p.add_argument("--features", default=None,
                   help="comma-separated features: " + ", ".join(kind_names()) + " (default: the --spec file's tables, "
                        "else mel,cqt; musicnn is the pretrained musicnn's input, 16 kHz / hop 256, and features "
                        "beside it share its frame grid)")
    spec = p.add_argument_group("feature parameters (recorded in the store)")
    add_spec_options(spec)  # --spec, the grid's and every kind's options (store.kinds), each checked as parsed
    # the run's options, generated from ExtractOptions' fields (name, default, help, bounds: one home)
    add_options(p.add_argument_group("run"), ExtractOptions)
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(logging.DEBUG if args.verbose else logging.WARNING)
    features = tuple(f.strip() for f in (args.features or "").split(",") if f.strip())

    def body() -> int:
        if args.features is not None and not features:
            raise ConfigError(f"no features given; choose from {', '.join(kind_names())} (e.g. --features mel,cqt)")
        specs = specs_from_args(features, args)
        options = ExtractOptions(features=tuple(specs), specs=specs, **given(args, ExtractOptions))
        if not Path(args.corpus).expanduser().exists():  # at once, before librosa and zarr are imported
            raise CorpusError(f"corpus {args.corpus} does not exist")
        from .extract import extract

        summary = extract(args.corpus, args.store, options)
        print(summary.report())
        return 0

    return run_cli(
        body,
        interrupted="interrupted; the store holds everything committed so far, rerun to resume",
        verbose=args.verbose,
    )


if __name__ == "__main__":
    sys.exit(main())

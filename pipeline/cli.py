"""``make features`` / ``specstore-features``: decode a corpus once into a feature store."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from specstore.common import ConfigError, run_cli
from specstore.common.limits import field_limit
from specstore.common.options import bounded_argument
from specstore.store import FeatureSpec
from specstore.store.kinds import kind_names

from .corpus import CorpusError
from .extract_options import BLOCK_SECONDS, COMMIT_SECONDS, JOBS
from .spec_options import parse_fmax, specs_from_options

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
    spec.add_argument("--spec", default=None, metavar="FILE.toml",
                      help="feature specs from a TOML file: a [mel] and/or [cqt] table of spec fields")
    # each checked as it is parsed against the bound of the FeatureSpec field it sets
    bounded_argument(spec, "--sample-rate", limit=field_limit(FeatureSpec, "sample_rate"), default=None,
                     metavar="HZ", help="decode to this sample rate, Hz (every feature; default 22050)")
    bounded_argument(spec, "--hop", limit=field_limit(FeatureSpec, "hop_length"), default=None, metavar="SAMPLES",
                     help="hop between frames, samples (every feature; default 512)")
    bounded_argument(spec, "--n-mels", limit=field_limit(FeatureSpec, "n_bins"), default=None, metavar="N",
                     help="mel bands (default 128)")
    bounded_argument(spec, "--n-fft", limit=field_limit(FeatureSpec, "n_fft"), default=None, metavar="SAMPLES",
                     help="mel FFT size, samples (default 2048)")
    bounded_argument(spec, "--fmax", limit=field_limit(FeatureSpec, "fmax"), parse=parse_fmax,
                     default=argparse.SUPPRESS, metavar="HZ",
                     help="highest mel frequency, Hz, or none for half the sample rate (default 8000)")
    bounded_argument(spec, "--cqt-bins", limit=field_limit(FeatureSpec, "n_bins"), default=None, metavar="N",
                     help="CQT bins, 12 per octave from C1 (default 84)")
    bounded_argument(p, "--jobs", limit=JOBS, default=None, help="worker processes (default: all cores)")
    p.add_argument(
        "--layout",
        choices=("raw", "zstd"),
        default="raw",
        help="raw: uncompressed, memory-mapped reads (default); zstd: compressed, for archives/object stores",
    )
    p.add_argument("--backend", default="loky", help="joblib backend: loky (default), dask, ray, threading")
    p.add_argument(
        "--scheduler",
        default=None,
        help="cluster to use: a dask scheduler (tcp://host:8786) with --backend dask, "
        "or a ray address (auto, ray://host:10001) with --backend ray; default: a local one",
    )
    bounded_argument(p, "--block-seconds", limit=BLOCK_SECONDS, default=60.0,
                     help="decode long files in blocks of this many seconds (memory per worker; default 60)")
    bounded_argument(p, "--commit-seconds", limit=COMMIT_SECONDS, default=2.0,
                     help="commit finished shards at most this often (default 2; 0 = after every task): "
                          "an interruption loses at most this much work")
    p.add_argument(
        "--add-corpus",
        action="store_true",
        help="allow a store that holds another corpus to take this one too (its paths get their own prefix)",
    )
    p.add_argument(
        "--remove-missing", action="store_true", help="drop indexed paths whose files are no longer in the corpus"
    )
    p.add_argument(
        "--follow-links",
        action="store_true",
        help="follow links to files and folders outside the corpus root (default: recorded as bad files, "
        "so a downloaded corpus cannot pull in other audio of this machine)",
    )
    p.add_argument(
        "--group-by",
        default=None,
        metavar="parent|REGEX",
        help="group a folder corpus's files so that one work stays on one side of a split: 'parent' (the folder "
        "below the label folder) or a regular expression over the path (first capture group, else the match); "
        "a manifest uses its group column instead",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    features = tuple(f.strip() for f in (args.features or "").split(",") if f.strip())

    def body() -> int:
        if args.features is not None and not features:
            raise ConfigError(f"no features given; choose from {', '.join(kind_names())} (e.g. --features mel,cqt)")
        specs = specs_from_options(features, spec_file=args.spec, sample_rate=args.sample_rate, hop=args.hop,
                                   n_mels=args.n_mels, n_fft=args.n_fft, fmax=getattr(args, "fmax", "default"),
                                   cqt_bins=args.cqt_bins)
        if not Path(args.corpus).expanduser().exists():  # at once, before librosa and zarr are imported
            raise CorpusError(f"corpus {args.corpus} does not exist")
        from .extract import extract

        summary = extract(
            args.corpus,
            args.store,
            features=tuple(specs),
            specs=specs,
            jobs=args.jobs,
            backend=args.backend,
            scheduler=args.scheduler,
            layout=args.layout,
            block_seconds=args.block_seconds,
            commit_seconds=args.commit_seconds,
            progress=not args.no_progress,
            add_corpus=args.add_corpus,
            remove_missing=args.remove_missing,
            follow_links=args.follow_links,
            group_by=args.group_by,
        )
        print(summary.report())
        return 0

    return run_cli(
        body,
        interrupted="interrupted; the store holds everything committed so far, rerun to resume",
        verbose=args.verbose,
    )


if __name__ == "__main__":
    sys.exit(main())

"""``make features`` / ``specstore-features``: decode a corpus once into a feature store."""

from __future__ import annotations

import argparse
import logging
import sys

from store import run_cli

from .extract import extract

EPILOG = """\
examples:
  specstore-features ~/music/gtzan data/gtzan.zarr
  specstore-features manifest.csv data/set.zarr --features mel --jobs 8 --layout zstd

The corpus is a folder with one sub-folder per label (GTZAN style) or a CSV
with a header 'path,label[,group]' (label and group may be empty; relative
paths are relative to the CSV). wav, flac, ogg, opus and mp3 are read.
Rerunning the same command resumes an interrupted run and adds only new or
changed files; identical files are decoded once. Bad files are recorded in
the store's error table with their reason (`python -m store info STORE`) and
never stop the run. One run writes a store at a time; a store holds one
corpus unless --add-corpus adds another.
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="specstore-features", description="Decode an audio corpus into a zarr v3 feature store (log-mel, CQT).",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("corpus", help="folder of label sub-folders, or a path,label CSV manifest")
    p.add_argument("store", help="output store: a local path or an fsspec URL (use --layout zstd for remote)")
    p.add_argument("--features", default="mel,cqt", help="comma-separated features: mel, cqt (default: mel,cqt)")
    p.add_argument("--jobs", type=int, default=None, help="worker processes (default: all cores)")
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
    p.add_argument(
        "--block-seconds",
        type=float,
        default=60.0,
        help="decode long files in blocks of this many seconds (memory per worker; default 60)",
    )
    p.add_argument(
        "--commit-seconds",
        type=float,
        default=2.0,
        help="commit finished shards at most this often (default 2; 0 = after every task): "
        "an interruption loses at most this much work",
    )
    p.add_argument(
        "--add-corpus",
        action="store_true",
        help="allow a store that holds another corpus to take this one too (its paths get their own prefix)",
    )
    p.add_argument(
        "--remove-missing", action="store_true", help="drop indexed paths whose files are no longer in the corpus"
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    features = tuple(f.strip() for f in args.features.split(",") if f.strip())

    def body() -> int:
        summary = extract(
            args.corpus,
            args.store,
            features=features,
            jobs=args.jobs,
            backend=args.backend,
            scheduler=args.scheduler,
            layout=args.layout,
            block_seconds=args.block_seconds,
            commit_seconds=args.commit_seconds,
            progress=not args.no_progress,
            add_corpus=args.add_corpus,
            remove_missing=args.remove_missing,
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

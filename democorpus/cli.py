"""``python -m specstore demo-corpus`` (installed as ``specstore-demo-corpus``): write the demo corpus."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from specstore.common import run_cli, setup_logging
from specstore.common.limits import Limit
from specstore.common.options import bounded_argument

from .errors import DemoCorpusError
from .generate import generate_corpus
from .plan import FORMATS, MAX_SECONDS, MEDIAN_SECONDS, MIN_SECONDS, STYLES

__all__ = ["build_parser", "main"]

logger = logging.getLogger(__name__)


COMMAND = "specstore demo-corpus"

PER_STYLE = Limit(1, 100_000, "files per style; 100 000 files of each of the 7 styles is some 3 000 hours of audio")
SEED = Limit(0, 2**32 - 1, "a 32-bit seed, as the other commands take")
SECONDS = Limit(0.1, 600.0, "seconds per file; a file is synthesised whole, in several float64 arrays of its "
                            "length: 600 s of 44.1 kHz stereo is 420 MB each", kind=float)
JOBS = Limit(1, 256, "worker processes on this machine, each synthesising one file; beyond the cores they only "
                     "compete", optional=True)


def _csv_list(text: str) -> list[str]:
    """``"a, b,,c"`` -> ``["a", "b", "c"]``."""
    return [t.strip() for t in text.split(",") if t.strip()]


def build_parser() -> argparse.ArgumentParser:
    """The command's options; ``--help`` describes the corpus."""
    p = argparse.ArgumentParser(
        prog=COMMAND,
        description=(
            "Write a deterministic synthetic music corpus, one folder per style (label): "
            "OUT_DIR/<style>/<style>_<nnn>.<ext>. Styles: " + ", ".join(STYLES) + ". "
            "Formats cycle through wav/flac/ogg/mp3, 22.05/44.1 kHz, mono/stereo; durations are "
            f"log-normal (median {MEDIAN_SECONDS:g} s) between --min-seconds and --max-seconds."
        ),
        epilog=f"Example: {COMMAND} data/demo --per-style 10 --max-seconds 30. Installed as specstore-demo-corpus too.",
    )
    p.add_argument("out_dir", metavar="OUT_DIR", help="output directory (created if missing)")
    bounded_argument(p, "--per-style", limit=PER_STYLE, default=40, metavar="N", help="files per style (default: 40)")
    bounded_argument(p, "--seed", limit=SEED, default=0, metavar="S",
                     help="corpus seed; same seed -> same bytes (default: 0)")
    bounded_argument(p, "--min-seconds", limit=SECONDS, default=None, metavar="X",
                     help=f"shortest file, s (default: min({MIN_SECONDS:g}, --max-seconds))")
    bounded_argument(p, "--max-seconds", limit=SECONDS, default=MAX_SECONDS, metavar="X",
                     help=f"longest file, s (default: {MAX_SECONDS:g})")
    p.add_argument(
        "--formats",
        type=_csv_list,
        default=list(FORMATS),
        metavar="LIST",
        help=f"comma-separated formats to cycle (default: {','.join(FORMATS)})",
    )
    p.add_argument(
        "--styles",
        type=_csv_list,
        default=list(STYLES),
        metavar="LIST",
        help="comma-separated subset of styles (default: all)",
    )
    bounded_argument(p, "--jobs", "-j", limit=JOBS, default=None, metavar="N",
                     help="worker processes (default: all CPUs)")
    p.add_argument(
        "--prune", action="store_true", help="delete stale <style>_<nnn>.<ext> files left by a larger corpus"
    )
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar, warnings only")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; returns the exit status: 0, or 2 with one ``specstore: error:`` line on bad input."""
    args = build_parser().parse_args(argv)
    setup_logging(logging.WARNING if args.quiet else logging.INFO)

    def body() -> int:
        try:
            summary = generate_corpus(
                args.out_dir,
                n_per_style=args.per_style,
                seed=args.seed,
                min_seconds=args.min_seconds,
                max_seconds=args.max_seconds,
                formats=args.formats,
                styles=args.styles,
                jobs=args.jobs,
                prune=args.prune,
                progress=not args.quiet,
            )
        except OSError as exc:  # e.g. an unwritable OUT_DIR: one line, like any other bad input
            raise DemoCorpusError(str(exc)) from exc
        logger.info("per style: %s; per format: %s", summary.files_per_style, summary.files_per_format)
        return 0

    return run_cli(body, interrupted="interrupted; rerun the same command to finish the corpus")


if __name__ == "__main__":
    sys.exit(main())

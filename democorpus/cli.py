"""``python -m democorpus`` (installed as ``specstore-demo-corpus``): write the demo corpus."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from store import run_cli

from .generate import generate_corpus
from .plan import FORMATS, MAX_SECONDS, MEDIAN_SECONDS, MIN_SECONDS, STYLES, DemoCorpusError

__all__ = ["build_parser", "main"]

logger = logging.getLogger(__name__)


COMMAND = "python -m democorpus"


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
    p.add_argument("--per-style", type=int, default=40, metavar="N", help="files per style (default: 40)")
    p.add_argument("--seed", type=int, default=0, metavar="S", help="corpus seed; same seed -> same bytes (default: 0)")
    p.add_argument(
        "--min-seconds",
        type=float,
        default=None,
        metavar="X",
        help=f"shortest file, s (default: min({MIN_SECONDS:g}, --max-seconds))",
    )
    p.add_argument(
        "--max-seconds",
        type=float,
        default=MAX_SECONDS,
        metavar="X",
        help=f"longest file, s (default: {MAX_SECONDS:g})",
    )
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
    p.add_argument("--jobs", "-j", type=int, default=None, metavar="N", help="worker processes (default: all CPUs)")
    p.add_argument(
        "--prune", action="store_true", help="delete stale <style>_<nnn>.<ext> files left by a larger corpus"
    )
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar, warnings only")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; returns the exit status: 0, or 2 with one ``specstore: error:`` line on bad input."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING if args.quiet else logging.INFO, format="%(levelname)s %(name)s: %(message)s"
    )

    def body() -> int:
        if args.jobs is not None and args.jobs < 1:
            raise DemoCorpusError(f"--jobs must be >= 1, got {args.jobs}")
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

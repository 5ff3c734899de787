"""Command line: ``python -m store validate PATH [--deep]`` and ``python -m store info PATH``."""

from __future__ import annotations

import argparse
import sys

from .errors import run_cli
from .reader import open_store
from .validate import validate


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m store", description="Inspect and check a specstore feature store.")
    sub = parser.add_subparsers(dest="command", required=True)
    v = sub.add_parser("validate", help="check the committed state; exit 0 if valid, 1 if not")
    v.add_argument("path", help="store path or fsspec URL")
    v.add_argument("--deep", action="store_true", help="also read every clip and check its values are finite")
    i = sub.add_parser("info", help="print a summary of the store")
    i.add_argument("path", help="store path or fsspec URL")
    args = parser.parse_args(argv)

    def body() -> int:
        if args.command == "validate":
            problems = validate(args.path, deep=args.deep)
            for p in problems:
                print(f"invalid: {p}", file=sys.stderr)
            if not problems:
                print(f"{args.path}: valid")
            return 1 if problems else 0
        print(open_store(args.path).summary())
        return 0

    return run_cli(body)


if __name__ == "__main__":
    sys.exit(main())

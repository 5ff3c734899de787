"""Command line: ``python -m store validate|info|repair PATH``."""

from __future__ import annotations

import argparse
import sys

from .errors import run_cli
from .reader import open_store
from .validate import validate
from .writer import StoreWriter


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m store", description="Inspect, check and repair a specstore "
                                                                         "feature store.")
    sub = parser.add_subparsers(dest="command", required=True)
    v = sub.add_parser("validate", help="check the committed state; exit 0 if valid, 1 if not")
    v.add_argument("path", help="store path or fsspec URL")
    v.add_argument("--deep", action="store_true",
                   help="also read every chunk and check its checksum and that its values are finite")
    i = sub.add_parser("info", help="print a summary of the store")
    i.add_argument("path", help="store path or fsspec URL")
    r = sub.add_parser("repair", help="drop damaged shards from the index (a rerun of extraction decodes their "
                                      "files again); exit 0 when the store is whole afterwards")
    r.add_argument("path", help="store path or fsspec URL")
    r.add_argument("--quick", action="store_true",
                   help="only check that every chunk exists with its size (default: every checksum too)")
    args = parser.parse_args(argv)

    def body() -> int:
        if args.command == "validate":
            problems = validate(args.path, deep=args.deep)
            for p in problems:
                print(f"invalid: {p}", file=sys.stderr)
            if not problems:
                print(f"{args.path}: valid")
            return 1 if problems else 0
        if args.command == "repair":
            with StoreWriter.open(args.path) as w:
                report = w.repair(deep=not args.quick)
            for p in report.problems:
                print(f"damaged: {p}", file=sys.stderr)
            print(f"{args.path}: {report.line()}")
            return 0
        print(open_store(args.path).summary())
        return 0

    return run_cli(body)


if __name__ == "__main__":
    sys.exit(main())

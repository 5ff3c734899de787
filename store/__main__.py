"""Command line: ``python -m specstore store validate|info|repair PATH``.

zarr is imported only once the arguments are parsed and the store path is known to be there, so ``--help``,
a usage error and a mistyped path answer at once.
"""

from __future__ import annotations

import argparse
import sys

from specstore.common.cli import run_cli

from .errors import StoreNotFound
from .presence import check_store_present


def _problems(path: str, *, deep: bool) -> list[str]:
    """What ``validate`` finds wrong; a missing store is its one problem, found before zarr is imported."""
    try:
        check_store_present(path)
    except StoreNotFound as e:
        return [str(e)]
    from .validate import validate

    return validate(path, deep=deep)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="specstore store", description="Inspect, check and repair a specstore "
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
            problems = _problems(args.path, deep=args.deep)
            for p in problems:
                print(f"invalid: {p}", file=sys.stderr)
            if not problems:
                print(f"{args.path}: valid")
            return 1 if problems else 0
        check_store_present(args.path)  # a mistyped path is one line before zarr is imported
        if args.command == "repair":
            from .writer import StoreWriter

            with StoreWriter.open(args.path) as w:
                report = w.repair(deep=not args.quick)
            for p in report.problems:
                print(f"damaged: {p}", file=sys.stderr)
            print(f"{args.path}: {report.line()}")
            return 0
        from .reader import open_store

        print(open_store(args.path).summary())
        return 0

    return run_cli(body)


if __name__ == "__main__":
    sys.exit(main())

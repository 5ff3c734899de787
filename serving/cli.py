"""``specstore classify`` and ``specstore serve``: the console command ``specstore`` and its sub-commands.

Both take a checkpoint (``--model``) and the run options of ``make infer``
(device, budget, max batch, precision).  User errors print one line,
``specstore: error: ...``, and exit 2 (:func:`store.run_cli`);
``classify`` exits 1 when some files could not be classified (each named
on stderr with its reason) and 0 when all were.
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import os
import sys
from collections.abc import Sequence

from store import PROG, run_cli

__all__ = ["build_parser", "main"]

CLASSIFY_EPILOG = """\
examples:
  specstore classify song.mp3 other.flac --model models/genre.pt
  specstore classify ~/music/new/ --model models/genre.pt --csv > predictions.csv
  specstore classify a.wav --model models/genre.pt --json --topk 3

Each file is decoded with the checkpoint's own feature settings (the values
a store made by `make features` would hold), so the predictions equal
`make infer` on a store of the same files. Folders are searched recursively
for .wav .flac .ogg .opus .mp3; a file named on the command line is always
tried. Identical files are decoded once. Files that cannot be decoded are
listed on stderr, one line each, and the others still go through (exit 1).
"""

SERVE_EPILOG = """\
examples:
  specstore serve --model models/genre.pt                 # http://127.0.0.1:8000/
  specstore serve --model models/genre.pt --port 9000 --workers 4 --max-queue 128

API: POST /classify (multipart, one or many files; ?topk=5&picture=1),
GET /health, GET /metrics (Prometheus), GET / (the upload page).
Binds to 127.0.0.1 unless --host says otherwise; put a reverse proxy with
TLS in front of it to expose it (docs/serving.md).
"""


def _add_run_args(p: argparse.ArgumentParser) -> None:
    from infer.trust import add_trust_argument
    p.add_argument("--model", required=True, help="checkpoint (.pt) from `make train` or `make init-model`")
    p.add_argument("--device", default="auto", help="auto (CUDA if available), cpu, cuda, cuda:N (default auto)")
    p.add_argument("--budget-mb", type=float, default=None,
                   help="memory for one batch, MiB (CPU default 2048; CUDA: free memory minus the margin)")
    p.add_argument("--margin-mb", type=float, default=None, help="GPU memory kept free, MiB (default 1536)")
    p.add_argument("--max-batch", type=int, default=16, help="most clips in one batch (default 16)")
    p.add_argument("--precision", default="auto", choices=("auto", "fp32", "bf16", "fp16"),
                   help="auto: bf16/fp16 autocast on CUDA, fp32 on CPU (default auto)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads for the model (default: all cores)")
    p.add_argument("--batch-overhead-frames", type=float, default=None,
                   help="the planner's price of one more batch, padded frames (default: 64 on a CPU, where batches "
                        "cost little and may split to save padding; 1024 on a GPU)")
    add_trust_argument(p, "the --model checkpoint")
    p.add_argument("-v", "--verbose", action="store_true", help="log details")


def _options(args: argparse.Namespace, progress: bool) -> object:
    from infer.runtime import RunOptions

    return RunOptions(device=args.device, precision=args.precision, budget_mb=args.budget_mb,
                      margin_mb=args.margin_mb, max_batch=args.max_batch, threads=args.threads, progress=progress)


def cmd_classify(args: argparse.Namespace) -> int:
    from infer.predictions import COLUMNS, escape_label

    from .classify import classify_files
    from .model import Classifier

    progress = not args.no_progress and sys.stderr.isatty()
    classifier = Classifier(args.model, _options(args, progress),  # type: ignore[arg-type]
                            batch_overhead_frames=args.batch_overhead_frames, trust_model_code=args.trust_model_code)
    res = classify_files(args.inputs, classifier, topk=args.topk, jobs=args.jobs, progress=progress,
                         cache=args.cache)
    for f in res.failures:
        print(f"{PROG}: {f.path}: {f.reason}", file=sys.stderr)
    if args.json:
        json.dump([{"path": r.path, "duration_s": round(r.duration, 3),
                    "top": [{"label": lab, "prob": round(p, 6)} for lab, p in r.top]} for r in res.results]
                  + [{"path": f.path, "error": f.reason} for f in res.failures], sys.stdout, indent=1)
        print()
    elif args.csv:
        w = csv.writer(sys.stdout)
        w.writerow(COLUMNS)
        for r in res.results:
            pairs = ";".join(f"{escape_label(lab)}:{p:.4f}" for lab, p in r.top)
            w.writerow([r.path, r.top[0][0], f"{r.top[0][1]:.4f}", pairs, ""])
    else:
        width = min(60, max([len(r.path) for r in res.results] + [4]))
        print(f"{'file':<{width}}  {'seconds':>8}  top {args.topk}")
        for r in res.results:
            tops = "  ".join(f"{lab} {p:.3f}" for lab, p in r.top)
            print(f"{r.path:<{width}}  {r.duration:>8.1f}  {tops}")
    if not args.json and not args.csv and sys.stderr.isatty() or args.verbose:
        print(f"{len(res.results)} classified, {len(res.failures)} failed; {res.distinct} distinct clips "
              f"({res.cached} from the cache) in "
              f"{res.batches} batches, padding efficiency {res.efficiency:.3f}, {res.windowed} windowed, "
              f"OOM retries {res.oom_retries}", file=sys.stderr)
    return 1 if res.failures else 0


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from .app import Service, create_app
    from .config import ServeConfig, default_workers
    from .model import Classifier
    from .policy import BatchPolicy

    config = ServeConfig(
        host=args.host, port=args.port, workers=args.workers or default_workers(), max_file_mb=args.max_file_mb,
        max_files=args.max_files, max_seconds=args.max_seconds, max_queue=args.max_queue, timeout=args.timeout,
        topk=args.topk, policy=BatchPolicy(batching=args.batching, max_delay=args.max_delay_ms / 1000.0,
                                           fixed_size=args.fixed_batch))
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        logging.getLogger(__name__).warning("listening on %s: reachable from other machines; put a reverse proxy "
                                            "with TLS and authentication in front of it", args.host)
    classifier = Classifier(args.model, _options(args, False),  # type: ignore[arg-type]
                            batch_overhead_frames=args.batch_overhead_frames, trust_model_code=args.trust_model_code)
    app = create_app(Service(classifier, config))
    uvicorn.run(app, host=config.host, port=config.port, log_level="info" if args.verbose else "warning",
                timeout_graceful_shutdown=10)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description="Classify audio files by genre, or serve a model over "
                                     "HTTP, with memory-budgeted batching.")
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("classify", help="top-k genres of audio files (no store needed)", epilog=CLASSIFY_EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="Decode each file with the checkpoint's feature settings, batch the clips by "
                                   "length under the memory budget, and print the top-k genres.")
    c.add_argument("inputs", nargs="+", metavar="FILE_OR_DIR", help="audio files and/or folders of them")
    c.add_argument("--topk", type=int, default=5, help="genres listed per file (default 5)")
    fmt = c.add_mutually_exclusive_group()
    fmt.add_argument("--csv", action="store_true", help="CSV as `make infer` writes it: path,pred,prob,topk,truth")
    fmt.add_argument("--json", action="store_true", help="a JSON list, one object per file")
    c.add_argument("--jobs", type=int, default=1, help="decode worker processes (default 1)")
    c.add_argument("--cache", default=None, metavar="DIR",
                   help="keep decoded clips in DIR, keyed by content hash and feature settings, so files classified "
                        "again are not decoded again (default: no cache)")
    c.add_argument("--no-progress", action="store_true", help="no progress bars")
    _add_run_args(c)
    c.set_defaults(func=cmd_classify)

    s = sub.add_parser("serve", help="HTTP service: upload page, JSON API, Prometheus metrics", epilog=SERVE_EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="Serve MODEL over HTTP: uploads are decoded in worker processes and batched by "
                                   "length under the memory budget with concurrent requests.")
    s.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    s.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    s.add_argument("--workers", type=int, default=None, help="decode worker processes (default: cores, at most 4)")
    s.add_argument("--max-file-mb", type=float, default=50.0, help="largest upload per file, MiB (default 50)")
    s.add_argument("--max-files", type=int, default=16, help="files per request (default 16)")
    s.add_argument("--max-seconds", type=float, default=600.0, help="longest audio per file, s (default 600)")
    s.add_argument("--max-queue", type=int, default=64,
                   help="clips in progress at once; more get 503 + Retry-After (default 64)")
    s.add_argument("--timeout", type=float, default=120.0, help="seconds per request before 504 (default 120)")
    s.add_argument("--topk", type=int, default=5, help="genres per file unless ?topk= says (default 5)")
    s.add_argument("--batching", default="budget", choices=("budget", "fixed"),
                   help="budget: length-binned batches under the memory budget (default); fixed: --fixed-batch "
                        "clips in arrival order (the baseline)")
    s.add_argument("--max-delay-ms", type=float, default=50.0,
                   help="longest a clip waits for its batch to fill, ms (default 50)")
    s.add_argument("--fixed-batch", type=int, default=4, help="clips per batch with --batching fixed (default 4)")
    _add_run_args(s)
    s.set_defaults(func=cmd_serve)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """``specstore classify ...`` / ``specstore serve ...``."""
    # torch's OpenMP threads sleep instead of spinning when idle (set before torch is imported): the model
    # shares the cores with the decode workers, which spinning threads would slow down (as the Makefile does)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    return run_cli(lambda: int(args.func(args)), verbose=args.verbose)


if __name__ == "__main__":
    sys.exit(main())

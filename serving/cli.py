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
from typing import TYPE_CHECKING

from store import PROG, run_cli

if TYPE_CHECKING:
    from infer.run_options import RunOptions

    from .policy import BatchPolicy

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


def _options(args: argparse.Namespace, progress: bool) -> RunOptions:
    """The run options, checked (one line for a bad value) without importing torch."""
    from infer.run_options import RunOptions

    return RunOptions(device=args.device, precision=args.precision, budget_mb=args.budget_mb,
                      margin_mb=args.margin_mb, max_batch=args.max_batch, threads=args.threads, progress=progress)


def _check_model(path: str) -> None:
    """A missing checkpoint is one line before torch is imported (loading it would say the same, seconds later)."""
    if not os.path.isfile(path):
        from store import ConfigError

        raise ConfigError(f"no checkpoint at {path} (train one with `make train`)")


def cmd_classify(args: argparse.Namespace) -> int:
    _check_model(args.model)
    from infer.predictions import COLUMNS, escape_label

    from .classify import classify_files
    from .model import Classifier

    progress = not args.no_progress and sys.stderr.isatty()
    classifier = Classifier(args.model, _options(args, progress),
                            batch_overhead_frames=args.batch_overhead_frames, trust_model_code=args.trust_model_code)
    res = classify_files(args.inputs, classifier, topk=args.topk, jobs=args.jobs, progress=progress,
                         cache=args.cache)
    for f in res.failures:
        print(f"{PROG}: {f.path}: {f.reason}", file=sys.stderr)
    if args.json:  # strict JSON, whole or nothing: classify_files turns non-finite answers into failures
        print(json.dumps([{"path": r.path, "duration_s": round(r.duration, 3),
                           "top": [{"label": lab, "prob": round(p, 6)} for lab, p in r.top]} for r in res.results]
                         + [{"path": f.path, "error": f.reason} for f in res.failures], indent=1, allow_nan=False))
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
    from .config import ServeConfig, default_workers, is_loopback
    from .server import serve

    config = ServeConfig(
        host=args.host, port=args.port, allowed_hosts=tuple(args.allowed_host), cors_origins=tuple(args.cors_origin),
        workers=default_workers() if args.workers is None else args.workers, max_file_mb=args.max_file_mb,
        max_files=args.max_files, max_seconds=args.max_seconds, max_sample_rate=args.max_sample_rate,
        max_channels=args.max_channels, max_queue=args.max_queue,
        max_client_clips=args.max_client_clips, max_inflight_mb=args.max_inflight_mb, timeout=args.timeout,
        read_timeout=args.read_timeout, min_upload_kib_s=args.min_upload_kib_s, max_connections=args.max_connections,
        max_client_connections=args.max_client_connections, topk=args.topk,
        policy=_policy(args.batching, args.max_delay_ms / 1000.0, args.fixed_batch))
    _check_model(args.model)
    if not is_loopback(args.host):
        logging.getLogger(__name__).warning("listening on %s: reachable from other machines; put a reverse proxy "
                                            "with TLS and authentication in front of it", args.host)
    if not args.quiet:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        access = logging.getLogger("serving.access")
        access.addHandler(handler)
        access.setLevel(logging.INFO)
        access.propagate = False

    options = _options(args, False)  # a bad run option is one line before the port opens

    def load() -> object:
        from .model import Classifier

        return Classifier(args.model, options,
                          batch_overhead_frames=args.batch_overhead_frames, trust_model_code=args.trust_model_code)

    serve(load, config, log_level="info" if args.verbose else "warning",
          announce=lambda line: print(f"{PROG}: {line}", file=sys.stderr, flush=True))
    return 0


def _policy(batching: str, max_delay: float, fixed_size: int) -> BatchPolicy:
    from .policy import BatchPolicy

    return BatchPolicy(batching=batching, max_delay=max_delay, fixed_size=fixed_size)


def build_parser() -> argparse.ArgumentParser:
    from .config import ServeConfig

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
    d = ServeConfig.__dataclass_fields__
    s.add_argument("--host", default=d["host"].default,
                   help="address to listen on (default 127.0.0.1: this machine only)")
    s.add_argument("--port", type=int, default=d["port"].default, help="port (default %(default)s)")
    s.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                   help="a Host header value to answer (repeatable; '*' for any); default the loopback names, and "
                        "required with a --host other than loopback (a guard against DNS rebinding)")
    s.add_argument("--cors-origin", action="append", default=[], metavar="URL",
                   help="a web origin (https://site.example) whose pages may post to the API (repeatable; "
                        "default none: cross-origin posts get 403, the server's own page always works)")
    s.add_argument("--workers", type=int, default=None, help="decode worker processes (default: cores, at most 4)")
    s.add_argument("--max-file-mb", type=float, default=d["max_file_mb"].default,
                   help="largest upload per file, MiB (default %(default)g)")
    s.add_argument("--max-files", type=int, default=d["max_files"].default,
                   help="files per request (default %(default)s)")
    s.add_argument("--max-seconds", type=float, default=d["max_seconds"].default,
                   help="longest audio per file, s, checked from the header before decoding (default %(default)g)")
    s.add_argument("--max-sample-rate", type=int, default=d["max_sample_rate"].default,
                   help="highest sample rate an upload may declare, Hz, checked from the header before decoding "
                        "(default %(default)s)")
    s.add_argument("--max-channels", type=int, default=d["max_channels"].default,
                   help="most channels an upload may declare, checked from the header before decoding "
                        "(default %(default)s)")
    s.add_argument("--max-queue", type=int, default=d["max_queue"].default,
                   help="clips in progress at once; more get 503 + Retry-After; a request with more files gets "
                        "413 (default %(default)s)")
    s.add_argument("--max-client-clips", type=int, default=None,
                   help="clips in progress from one client address (default: half of --max-queue, at least "
                        "--max-files)")
    s.add_argument("--max-inflight-mb", type=float, default=None,
                   help="upload bytes held at once, MiB, reserved from each request's Content-Length before its "
                        "body is read; the bound on the server's temporary disk (default --max-queue x "
                        "--max-file-mb)")
    s.add_argument("--timeout", type=float, default=d["timeout"].default,
                   help="seconds from a request's last byte to its answer before 504 (default %(default)g)")
    s.add_argument("--read-timeout", type=float, default=d["read_timeout"].default,
                   help="seconds a client has to send a whole request (headers and body), or more for an upload "
                        "that keeps --min-upload-kib-s; slower clients are dropped with 408 (default %(default)g)")
    s.add_argument("--min-upload-kib-s", type=float, default=d["min_upload_kib_s"].default,
                   help="slowest average upload accepted beyond --read-timeout, KiB/s (default %(default)g)")
    s.add_argument("--max-connections", type=int, default=d["max_connections"].default,
                   help="connections open at once; more are answered 503 and closed (default %(default)s)")
    s.add_argument("--max-client-connections", type=int, default=d["max_client_connections"].default,
                   help="connections open at once from one client address (default %(default)s; behind a reverse "
                        "proxy, "
                        "the proxy's upstream connections)")
    s.add_argument("--topk", type=int, default=5, help="genres per file unless ?topk= says (default 5)")
    s.add_argument("--batching", default="budget", choices=("budget", "fixed"),
                   help="budget: length-binned batches under the memory budget (default); fixed: --fixed-batch "
                        "clips in arrival order (the baseline)")
    s.add_argument("--max-delay-ms", type=float, default=50.0,
                   help="longest a clip waits for its batch to fill, ms (default 50)")
    s.add_argument("--quiet", action="store_true", help="no access-log line per request")
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

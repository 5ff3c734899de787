"""``specstore classify``, ``serve`` and ``export``: the console command ``specstore`` and its sub-commands.

``classify`` and ``serve`` take a checkpoint (``--model``) and the run
options of ``make infer`` (device, budget, max batch, precision, the
planner's price of a batch: :mod:`specstore.infer.options.run_args`); ``export``
takes a checkpoint and writes it as ONNX or TorchScript
(:func:`specstore.infer.engine.export.export_model`).  User errors print one line,
``specstore: error: ...``, and exit 2 (:func:`specstore.common.run_cli`);
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

from specstore.common import PROG, run_cli, setup_logging
from specstore.common.options import add_options, given
from specstore.infer.options.run_args import add_run_options, run_options_given

if TYPE_CHECKING:
    from specstore.infer.models.calibration import Calibration

    from .answers import Answer
    from .classify import ClassifyResult

__all__ = ["build_parser", "main"]

CLASSIFY_EPILOG = """\
examples:
  specstore classify song.mp3 other.flac --model models/genre.pt
  specstore classify ~/music/new/ --model models/genre.pt --csv > predictions.csv
  specstore classify a.wav --model models/genre.pt --json --topk 3
  specstore classify song.mp3 --model musicnn-msd             # 50 tags, no training
  specstore classify --list-tags --model musicnn-mtt          # a tagger's vocabulary
  specstore classify ~/music/ --model musicnn-msd --labels rock,jazz,blues
  specstore classify long.mp3 --model models/genre.pt --segments 10   # genre over time, per 10 s

Shipped models (no training; --model takes their names): musicnn-msd (50
last.fm tags of the Million Song Dataset: genres, moods, eras, instruments)
and musicnn-mtt (50 MagnaTagATune tags), by Pons and Serra, ISC licence, (c)
Music Technology Group, Universitat Pompeu Fabra. They are taggers: each tag
is an independent score, several may be high at once, and the output says
"tags". Which one: musicnn-msd for popular music (rock, pop, metal, jazz,
Hip-Hop, electronic, eras, moods); it has no classical tag, so classical and
orchestral music belongs to musicnn-mtt (classical, strings, violin, cello,
piano, harpsichord, choir, opera). --list-tags says what each one knows.

Each file is decoded with the checkpoint's own feature settings (the values
a store made by `make features` would hold), so the predictions equal
`make infer` on a store of the same files. Folders are searched recursively
for .wav .flac .ogg .opus .mp3 .aiff .aif .aifc, and .m4a .m4b .aac .wma (decoded
through PyAV: pip install 'specstore[formats]'); a file named on the command line
is always tried. Identical files are decoded once. Files that cannot be decoded are
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


def _add_model_args(p: argparse.ArgumentParser) -> None:
    """``--model`` and the run options (:func:`specstore.infer.options.run_args.add_run_options`: an option not
    given is left out, so :class:`~specstore.infer.options.run_options.RunOptions` fills its default)."""
    from specstore.infer.models.shipped import shipped_names
    from specstore.infer.models.trust import add_trust_argument

    p.add_argument("--model", required=True, help="checkpoint (.pt) from `make train` or `make init-model`, or a "
                                                  f"shipped model's name ({', '.join(shipped_names())})")
    add_run_options(p)
    add_trust_argument(p, "the --model checkpoint")
    p.add_argument("-v", "--verbose", action="store_true", help="log details")


def _check_model(path: str) -> None:
    """A missing checkpoint is one line before torch is imported (loading it would say the same, seconds later);
    a shipped model's name (:mod:`specstore.infer.models.shipped`) is taken as it is."""
    from specstore.infer.models.shipped import is_shipped, no_checkpoint_hint

    if not os.path.isfile(path) and not is_shipped(path):
        from specstore.common import ConfigError

        raise ConfigError(f"no checkpoint at {path} ({no_checkpoint_hint()})")


SEGMENT_COLUMNS = ("start_s", "end_s")
"""With ``--segments``, the CSV's window columns, after ``path``: one row per window, no whole-file row."""


def _answer(res: ClassifyResult, segments: float | None, model: str, temperature: float | None) -> Answer:
    """The run as the server's answer (:mod:`specstore.serving.answers`): classified files in input order, then those
    that failed."""
    from .answers import Answer, Classified, Failed, model_name

    files: list[Classified | Failed] = [
        Classified(r.path, r.duration, r.frames, r.top, segments=r.segments if segments is not None else None,
                   segment_s=segments, answer=r.answer or None) for r in res.results]
    files += [Failed(f.path, f.reason) for f in res.failures]
    return Answer(model_name(model), list(res.label_names), files, res.outputs, temperature)


def _list_tags(model: str) -> int:
    """``--list-tags``: the model's vocabulary on stdout, one label a line (no engine, no memory probe); on
    stderr, ``#`` lines saying what it is and, for a shipped tagger, the music it fits (so a user picks between
    musicnn-msd and musicnn-mtt)."""
    from specstore.infer.models.shipped import SHIPPED, is_shipped, resolve_checkpoint

    ckpt = resolve_checkpoint(model)
    kind = "tags (independent scores)" if ckpt.outputs == "tags" else "labels (one softmax)"
    print(f"# {model}: {len(ckpt.label_names)} {kind}", file=sys.stderr)
    entry = SHIPPED.get(model) if is_shipped(model) else None
    if entry is not None and entry.fits:
        print(f"# fits {entry.fits}", file=sys.stderr)
    print("\n".join(ckpt.label_names))
    return 0


def cmd_classify(args: argparse.Namespace) -> int:
    _check_model(args.model)
    from specstore.common import ConfigError

    if not args.inputs and not args.list_tags:
        raise ConfigError("name audio files or folders to classify (or --list-tags to list the model's labels)")
    if args.list_tags:
        return _list_tags(args.model)
    from .classify import classify_files
    from .model import Classifier

    progress = not args.no_progress and sys.stderr.isatty()
    classifier = Classifier(args.model, run_options_given(args, progress=progress), labels=args.labels,
                            trust_model_code=args.trust_model_code)
    res = classify_files(args.inputs, classifier, topk=args.topk, jobs=args.jobs, progress=progress,
                         cache=args.cache, unknown_below=args.unknown_below, segments=args.segments)
    for f in res.failures:
        print(f"{PROG}: {f.path}: {f.reason}", file=sys.stderr)
    _print_results(res, args, classifier.calibration, classifier.name)
    if not args.json and not args.csv and sys.stderr.isatty() or args.verbose:
        print(f"{len(res.results)} classified, {len(res.failures)} failed; {res.distinct} distinct clips "
              f"({res.cached} from the cache) in "
              f"{res.batches} batches, padding efficiency {res.efficiency:.3f}, {res.windowed} windowed, "
              f"OOM retries {res.oom_retries}", file=sys.stderr)
    return 1 if res.failures else 0


def _print_results(res: ClassifyResult, args: argparse.Namespace, calibration: Calibration, model: str) -> None:
    """The results as JSON, CSV (``make infer``'s columns) or a table, with ``--segments`` each file's windows
    (JSON ``segments``; CSV one row per window, ``start_s,end_s`` after ``path``; indented table lines).

    The JSON is the server's answer (:func:`specstore.serving.answers.answer_json`: ``model``, ``labels``, ``outputs``,
    the calibration, ``files``), so a script reads both alike.  A single-label model's say how its
    probabilities were made (``calibration``: the JSON's ``calibration``/``temperature`` keys, the CSV's
    ``calibration`` column on every row, the table header).  A tagger's (``res.outputs == "tags"``) say
    "tags" and nothing of calibration (independent scores take no temperature): JSON ``"tags": [{"tag",
    "score"}]``, CSV ``path,tags,truth``, a "top N tags" table column; its windows have the same shape.
    """
    from specstore.infer.engine.predictions import COLUMNS, TAG_COLUMNS, escape_label
    from specstore.infer.models.calibration import UNCALIBRATED

    from .answers import answer_json

    tags = res.outputs == "tags"
    segmented = args.segments is not None
    t = calibration.temperature
    if args.json:  # strict JSON, whole or nothing: classify_files turns non-finite answers into failures
        print(json.dumps(answer_json(_answer(res, args.segments, model, t)), indent=1, allow_nan=False))
    elif args.csv:
        w = csv.writer(sys.stdout)
        columns = TAG_COLUMNS if tags else COLUMNS
        w.writerow(columns[:1] + SEGMENT_COLUMNS + columns[1:] if segmented else columns)
        for r in res.results:
            for seg in r.segments if segmented else [None]:
                said, top = (seg.answer, seg.top) if seg is not None else (r.answer, r.top)
                pairs = ";".join(f"{escape_label(lab)}:{p:.4f}" for lab, p in top)
                times = [f"{seg.start_s:.3f}", f"{seg.end_s:.3f}"] if seg is not None else []
                w.writerow([r.path, *times, pairs, ""] if tags else
                           [r.path, *times, said, f"{top[0][1]:.4f}", pairs, "", calibration.label()])
    else:
        what = (" tags (independent scores)" if tags else f" (probabilities {UNCALIBRATED})" if t is None
                else f" (probabilities temperature-scaled, T = {t:.2f})")
        _print_table(res, args, what)


def _print_table(res: ClassifyResult, args: argparse.Namespace, what: str) -> None:
    """The table: one line per file (``what`` in the header says how its scores were made), one indented line
    per window under it with ``--segments``."""
    width = min(60, max([len(r.path) for r in res.results] + [4]))
    shown = "answer  " if args.unknown_below is not None else ""
    print(f"{'file':<{width}}  {'seconds':>8}  {shown}top {args.topk}{what}")
    for r in res.results:
        tops = "  ".join(f"{lab} {p:.3f}" for lab, p in r.top)
        said = f"{r.answer}  " if shown else ""
        print(f"{r.path:<{width}}  {r.duration:>8.1f}  {said}{tops}")
        for seg in r.segments:
            span = f"{seg.start_s:.1f}-{seg.end_s:.1f} s"
            shown_seg = f"{seg.answer}  " if shown else ""
            tops = "  ".join(f"{lab} {p:.3f}" for lab, p in seg.top)
            print(f"  {span:<{width - 2}}  {'':>8}  {shown_seg}{tops}")


def cmd_serve(args: argparse.Namespace) -> int:
    """Every option is checked (the server's, the batching, the planner's, the run options, the model's path)
    before the port is bound: a bad value is one line, never a server that starts and then stops."""
    from .config import BatchingOptions, ServeConfig, is_loopback

    config = ServeConfig(**given(args, ServeConfig), policy=BatchingOptions(**given(args, BatchingOptions)).policy())
    options = run_options_given(args, progress=False)
    _check_model(args.model)
    from .server import serve  # uvicorn: once every option has passed
    if not is_loopback(config.host):
        logging.getLogger(__name__).warning("listening on %s: reachable from other machines; put a reverse proxy "
                                            "with TLS and authentication in front of it", config.host)
    if not args.quiet:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        access = logging.getLogger("specstore.serving.access")
        access.addHandler(handler)
        access.setLevel(logging.INFO)
        access.propagate = False

    def load() -> object:
        from .model import Classifier

        return Classifier(args.model, options, trust_model_code=args.trust_model_code)

    serve(load, config, log_level="info" if args.verbose else "warning",
          announce=lambda line: print(f"{PROG}: {line}", file=sys.stderr, flush=True))
    return 0


EXPORT_EPILOG = """\
examples:
  specstore export models/genre.pt                        # models/genre.onnx + models/genre.onnx.json
  specstore export models/genre.pt --format torchscript   # models/genre.torchscript.pt + .json
  specstore export musicnn-msd                            # ./musicnn-msd.onnx + .json (a shipped tagger)

The exported model takes x (batch x 1 x n_bins x frames, float32 dB, zero-
padded in time) and lengths (batch, int64 frames) and returns the logits,
masked exactly as here: any batch size, any number of frames. The JSON
sidecar says how to compute x (the feature settings), the labels, and how
logits become probabilities (docs/export.md shows onnxruntime reading it).
"""


def cmd_export(args: argparse.Namespace) -> int:
    from specstore.infer.options.export_options import ExportOptions, export_path

    options = ExportOptions(**given(args, ExportOptions))
    _check_model(args.model)
    out = export_path(args.model, options.format, options.out)  # a bad --out is one line before torch loads
    from specstore.infer.engine.export import export_model

    res = export_model(args.model, out, format=options.format, trust_model_code=args.trust_model_code)
    checked = ("not run to check it (no onnxruntime)" if res.max_difference is None else
               f"checked: {res.compared} within {res.max_difference:.2g} of the checkpoint's")
    print(f"{PROG}: wrote {res.path} and {res.sidecar} ({checked})", file=sys.stderr)
    return 0


def _export_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from specstore.infer.models.trust import add_trust_argument
    from specstore.infer.options.export_options import ExportOptions

    e = sub.add_parser("export", help="write the model as ONNX or TorchScript, with a JSON sidecar, for use "
                                      "outside specstore", epilog=EXPORT_EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="Export MODEL's network (the checkpoint's forward: masked, any batch size and "
                                   "length) and write beside it what a user needs to feed it.")
    e.add_argument("model", metavar="MODEL", help="checkpoint (.pt) from `make train` or `make init-model`, or a "
                                                  "shipped model's name (written to NAME.onnx here unless --out)")
    add_options(e, ExportOptions)
    add_trust_argument(e, "MODEL")
    e.add_argument("-v", "--verbose", action="store_true", help="log details")
    e.set_defaults(func=cmd_export)


def _classify_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from .config import ClassifyOptions

    c = sub.add_parser("classify", help="top-k genres of audio files (no store needed)", epilog=CLASSIFY_EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="Decode each file with the checkpoint's feature settings, batch the clips by "
                                   "length under the memory budget, and print the top-k genres.")
    c.add_argument("inputs", nargs="*", metavar="FILE_OR_DIR", help="audio files and/or folders of them")
    fmt = c.add_mutually_exclusive_group()
    fmt.add_argument("--csv", action="store_true", help="CSV as `make infer` writes it: "
                     "path,pred,prob,topk,truth,calibration (a tagger's: path,tags,truth)")
    fmt.add_argument("--json", action="store_true", help="the server's answer: one JSON object with the model, "
                     'labels and calibration (temperature or uncalibrated), and "files": one object per file, '
                     '"answer" and "top" (a tagger\'s: "tags": [{"tag", "score"}], no calibration), or "error"')
    fmt.add_argument("--list-tags", action="store_true", help="print the model's labels (a tagger's vocabulary), "
                                                              "one per line, and exit")
    add_options(c, ClassifyOptions, absent=False)
    c.add_argument("--no-progress", action="store_true", help="no progress bars")
    _add_model_args(c)
    c.set_defaults(func=cmd_classify)


def _serve_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from .config import BatchingOptions, ServeConfig

    s = sub.add_parser("serve", help="HTTP service: upload page, JSON API, Prometheus metrics", epilog=SERVE_EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="Serve MODEL over HTTP: uploads are decoded in worker processes and batched by "
                                   "length under the memory budget with concurrent requests.")
    add_options(s, ServeConfig)
    add_options(s, BatchingOptions)
    s.add_argument("--quiet", action="store_true", help="no access-log line per request")
    _add_model_args(s)
    s.set_defaults(func=cmd_serve)


def build_parser() -> argparse.ArgumentParser:
    """``specstore``'s parser: ``classify``, ``serve`` and ``export``, their options generated from their
    dataclasses (:mod:`specstore.serving.config`, :class:`~specstore.infer.options.run_options.RunOptions`,
    :class:`~specstore.infer.options.export_options.ExportOptions`)."""
    parser = argparse.ArgumentParser(prog=PROG, description="Classify audio files by genre, or serve a model over "
                                     "HTTP, with memory-budgeted batching; or export it for use elsewhere.")
    sub = parser.add_subparsers(dest="command", required=True)
    _classify_parser(sub)
    _serve_parser(sub)
    _export_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """``specstore classify ...`` / ``specstore serve ...`` / ``specstore export ...``."""
    # torch's OpenMP threads sleep instead of spinning when idle (set before torch is imported): the model
    # shares the cores with the decode workers, which spinning threads would slow down (as the Makefile does)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    args = build_parser().parse_args(argv)
    setup_logging(logging.INFO if args.verbose else logging.WARNING)
    return run_cli(lambda: int(args.func(args)), verbose=args.verbose)


if __name__ == "__main__":
    sys.exit(main())

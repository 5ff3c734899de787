"""``specstore VERB ...``: the one front door to every command.

Each verb is one of the project's commands, run with the arguments that
follow it; ``specstore VERB --help`` is that command's own help.  Only the
verb's command module is imported, so a ``--help``, a usage error or a
mistyped path answers before torch, librosa or zarr is imported.  The Make
targets run these verbs (``make train`` is ``specstore train``); the older
``specstore-*`` console commands are the same commands under their former
names.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from typing import NamedTuple

__all__ = ["VERBS", "Verb", "main"]


class Verb(NamedTuple):
    """A verb's command: the function ``module:function`` called with ``prefix`` and the verb's arguments."""

    module: str
    function: str
    prefix: tuple[str, ...]
    help: str


VERBS: dict[str, Verb] = {
    "features": Verb("specstore.pipeline.cli", "main", (), "decode an audio corpus into a feature store"),
    "train": Verb("specstore.infer.cli", "train_main", (), "train a classifier on a store (resumes if interrupted)"),
    "cv": Verb("specstore.infer.cli", "cv_main", (), "grouped k-fold cross-validation of a training recipe"),
    "infer": Verb("specstore.infer.cli", "predict_main", (), "predict every clip of a store; write a CSV"),
    "eval": Verb("specstore.infer.cli", "eval_main", (), "accuracy, top-k, per-class P/R/F1, confusion matrix"),
    "plan": Verb("specstore.infer.cli", "plan_main", (), "print the batch plan without running a model"),
    "init-model": Verb("specstore.infer.cli", "init_main", (), "write a randomly initialised checkpoint"),
    "classify": Verb("specstore.serving.cli", "main", ("classify",), "top-k genres of audio files, no store"),
    "serve": Verb("specstore.serving.cli", "main", ("serve",), "HTTP service: upload page, JSON API, metrics"),
    "export": Verb("specstore.serving.cli", "main", ("export",), "a model as ONNX or TorchScript with a sidecar"),
    "store": Verb("specstore.store.__main__", "main", (), "inspect, validate and repair a store"),
    "demo-corpus": Verb("specstore.democorpus.cli", "main", (), "write the synthetic demo corpus"),
    "realcorpus": Verb("specstore.realcorpus.generate", "main", (), "render the realistic development corpus"),
}
"""verb -> its command (the order is ``specstore --help``'s)."""

PROG = "specstore"


def usage() -> str:
    """``specstore --help``: the verbs, one line each."""
    width = max(map(len, VERBS))
    lines = [f"usage: {PROG} VERB [ARGS ...]", "",
             "Music-genre classification at corpus scale: audio -> feature store -> budgeted batches.", "",
             "verbs:"]
    lines += [f"  {name:<{width}}  {verb.help}" for name, verb in VERBS.items()]
    lines += ["", f"`{PROG} VERB --help` describes a verb and its options."]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``specstore VERB ARGS...``; its exit status (2 and one line for an unknown verb)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(usage(), file=sys.stdout if args else sys.stderr)
        return 0 if args else 2
    verb = VERBS.get(args[0])
    if verb is None:
        print(f"{PROG}: error: unknown verb {args[0]!r}; verbs: {', '.join(VERBS)}", file=sys.stderr)
        return 2
    command = getattr(importlib.import_module(verb.module), verb.function)
    return int(command([*verb.prefix, *args[1:]]))

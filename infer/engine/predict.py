"""``make infer``: classify every indexed path of a store and write the predictions CSV.

Flow: open the store (index only) -> load the checkpoint and refuse a feature-spec mismatch -> the engine
(:mod:`specstore.infer.engine.runtime`) measures the model's bytes per padded clip-frame, plans length-sorted batches of
distinct contents under the memory budget, reads and pads them ahead of the model from the store's mmap views, and runs
clips too long for any batch in windows -> softmax with the checkpoint's temperature (a tagger: sigmoids;
:mod:`specstore.infer.models.calibration`) -> one CSV row per indexed path (:mod:`specstore.infer.engine.predictions`).
Raw audio is never involved.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from torch import nn

from specstore.common import ConfigError, check_output_path
from specstore.infer.data import feature_specs
from specstore.infer.engine.predictions import (
    NO_UNKNOWN_FOR_TAGS,
    Predictions,
    check_unknown_below,
    select_labels,
    write_predictions_csv,
)
from specstore.infer.engine.runtime import Engine, RunOptions, RunStats
from specstore.infer.errors import PredictionsError
from specstore.infer.models.calibration import Calibration, probabilities
from specstore.infer.models.checkpoint import Checkpoint, check_store_matches
from specstore.infer.models.contract import ModelSpec
from specstore.infer.models.shipped import is_shipped, resolve_checkpoint
from specstore.infer.models.trust import Trust
from specstore.infer.options.cluster_options import ClusterOptions
from specstore.store import Store, open_store

if TYPE_CHECKING:
    from specstore.common.executors import Executor

__all__ = ["ClusterStats", "LoadedModel", "ModelLike", "PredictStats", "Predictions", "load_model", "open_inputs",
           "predict"]

log = logging.getLogger(__name__)


@dataclass
class PredictStats(RunStats):
    """Figures of one run: the engine's (:class:`~specstore.infer.engine.runtime.RunStats`), the clips, their audio and
    the time.

    Times in seconds, memory in bytes; ``clips``: indexed paths (``distinct``
    counts each content once); ``peak_kind``: what ``peak_bytes`` measured.
    """

    clips: int = 0
    audio_seconds: float = 0.0
    wall_seconds: float = 0.0
    peak_kind: str = "anonymous RSS"
    device: str = "cpu"

    def line(self) -> str:
        """The one-line summary printed after a run."""
        wall = max(self.wall_seconds, 1e-9)
        return (f"{self.clips} clips ({self.distinct} distinct) in {self.wall_seconds:.1f} s: "
                f"{self.clips / wall:.1f} clips/s, {self.audio_seconds / wall:,.0f} s audio/s; "
                f"{self.batches} batches, padding efficiency {self.efficiency:.3f}, "
                f"{self.windowed} windowed; peak {self.peak_kind} {self.peak_bytes / 2**20:.0f} MiB "
                f"(budget {self.budget_bytes / 2**20:.0f} MiB) on {self.device}; OOM retries {self.oom_retries}")


@dataclass
class ClusterStats(PredictStats):
    """A cluster run's figures (:mod:`specstore.infer.engine.distributed`): :class:`PredictStats` (the workers'
    loops summed, the peak the highest of one worker) and the units: in all, resumed from the journal, computed
    now; ``dropped``: duplicate results dropped; ``commits``: journal parts written; ``where``: the executor."""

    units: int = 0
    resumed: int = 0
    computed: int = 0
    dropped: int = 0
    commits: int = 0
    where: str = ""

    def line(self) -> str:
        return (f"{super().line()}; {self.units} units on {self.where}: {self.computed} computed, {self.resumed} "
                f"from the journal, {self.dropped} duplicate results dropped")


ModelLike = str | os.PathLike[str] | Checkpoint | nn.Module
"""What predict and evaluate run: a checkpoint (path or object), an ``nn.Module``, or an import path
``package.module:Class`` (see :mod:`specstore.infer.models.contract`)."""


@dataclass
class LoadedModel:
    """A model ready to run on a store: the module, its labels and feature, the checkpoint's ``extra``;
    ``outputs``: ``"classes"`` (a softmax) or ``"tags"`` (independent sigmoid scores,
    :mod:`specstore.infer.models.shipped`)."""

    module: nn.Module
    label_names: list[str]
    feature: str
    extra: dict[str, Any]
    name: str
    outputs: str = "classes"
    import_path: str | None = None
    """A checkpoint's model named by an import path (trusted, since it was built), else None (a built-in
    architecture, a module, or an import path the caller named)."""

    @property
    def calibration(self) -> Calibration:
        """The checkpoint's calibration (:mod:`specstore.infer.models.calibration`); uncalibrated for a module or import
        path, and for a tagger (its sigmoid scores take no temperature)."""
        return Calibration.of(self.extra, self.outputs)


def load_model(model: ModelLike, store: Store, *, feature: str | None = None,
               model_args: dict[str, Any] | None = None, trust_model_code: Trust = False) -> LoadedModel:
    """Resolve ``model`` against ``specstore.store``.

    A checkpoint (a path, an object, or a shipped model's name such as
    ``musicnn-msd``, :mod:`specstore.infer.models.shipped`) brings its labels and feature
    (refused if the store lacks it or its spec differs); one whose model is an import path is built only when
    ``trust_model_code`` (or the allow-list) trusts it (:mod:`specstore.infer.models.trust`).
    A module or an import path takes the store's label names and
    ``feature`` (default: the store's default); an import path, named here
    by the caller and so trusted, is built with ``model_args`` plus the
    store's ``n_bins``/``n_classes`` where its constructor takes them.
    """
    if isinstance(model, nn.Module) or (isinstance(model, str) and ":" in model and not Path(model).exists()
                                        and not is_shipped(model)):
        specs = feature_specs(store, feature)
        name = "+".join(specs)
        if isinstance(model, nn.Module):
            module, label = model, type(model).__name__
        else:
            spec = ModelSpec.for_class(model, model_args, trust_model_code=[model],
                                       n_bins=sum(s.n_bins for s in specs.values()), n_classes=len(store.label_names))
            module = spec.build([model])
            label = model
        return LoadedModel(module, list(store.label_names), name, {}, label)
    ckpt = model if isinstance(model, Checkpoint) else resolve_checkpoint(model)
    check_store_matches(ckpt, store)
    return LoadedModel(ckpt.build(trust_model_code=trust_model_code), list(ckpt.label_names), ckpt.feature,
                       dict(ckpt.extra), "<checkpoint>" if isinstance(model, Checkpoint) else str(model),
                       ckpt.outputs, None if ckpt.model.builtin else ckpt.model.target)


def open_inputs(store: str | os.PathLike[str] | Store, model: ModelLike, options: RunOptions | None,
                overrides: dict[str, Any], model_args: dict[str, Any] | None = None,
                trust_model_code: Trust = False) -> tuple[RunOptions, Store, LoadedModel]:
    """Options (``options`` updated by keyword ``overrides``), the store and the model resolved against it."""
    opts = options or RunOptions()
    if overrides:
        try:
            opts = dataclasses.replace(opts, **overrides)
        except TypeError as e:
            raise ConfigError(f"unknown run option: {e}") from None
    s = store if isinstance(store, Store) else open_store(store)
    return opts, s, load_model(model, s, model_args=model_args, trust_model_code=trust_model_code)


def _check_finite(probs: np.ndarray, paths: list[str], name: str) -> None:
    """Refuse (one line, nothing written) probabilities that are not all finite, as ``specstore classify`` refuses
    them for a file: a NaN never reaches a CSV (NaN weights in a checkpoint give NaN logits)."""
    bad = np.flatnonzero(~np.isfinite(probs).all(axis=1))
    if len(bad):
        raise PredictionsError(f"the model gave non-finite probabilities for {len(bad)} of {len(paths)} clips "
                               f"(the first: {paths[int(bad[0])]}) with {name}; no predictions are written (NaN "
                               "or infinite weights in the model, or values in the store)")


def predict(
    store: str | os.PathLike[str] | Store,
    checkpoint: ModelLike,
    out: str | os.PathLike[str] | None = None,
    *,
    topk: int = 5,
    unknown_below: float | None = None,
    labels: str | list[str] | None = None,
    model_args: dict[str, Any] | None = None,
    trust_model_code: Trust = False,
    options: RunOptions | None = None,
    executor: Executor | None = None,
    cluster: ClusterOptions | None = None,
    **overrides: Any,
) -> Predictions:
    """Classify every indexed path of ``specstore.store`` with ``checkpoint``; write the CSV to ``out`` if given.

    ``checkpoint``: a checkpoint path or :class:`~specstore.infer.models.checkpoint.Checkpoint`,
    an ``nn.Module`` or an import path (:data:`ModelLike`, with
    ``model_args`` for an import path); a checkpoint whose model is an import
    path needs ``trust_model_code=True`` (or the allow-list, see
    :mod:`specstore.infer.models.trust`).  Run options come from ``options`` and/or keyword overrides
    (``predict(s, m, device="cpu", budget_mb=512)``; see
    :class:`specstore.infer.engine.runtime.RunOptions`); ``topk`` labels are listed per clip;
    ``unknown_below`` (a probability in (0, 1], None: off): the CSV's ``pred`` is ``unknown`` where the
    top probability is below it (single-label models only: a tagger's scores are independent).
    ``labels`` (comma-separated or a list; None: all): the CSV lists only these of the model's labels
    (unknown ones refused in one line).  A tagger (``outputs == "tags"``, e.g. ``musicnn-msd``) gives sigmoid
    scores and writes ``path,tags,truth`` (:mod:`specstore.infer.engine.predictions`).
    ``out`` is checked before any work; probabilities that are not all finite are refused, nothing written.
    ``executor`` (an :class:`~specstore.common.executors.Executor`), or ``cluster`` with a backend
    (:class:`~specstore.infer.options.cluster_options.ClusterOptions`: dask, ray, ``--scheduler``, ``--jobs``),
    runs the model on workers in units journalled beside ``out``, resumable, with the same CSV
    (:mod:`specstore.infer.engine.distributed`; ``checkpoint`` must then be a checkpoint file); neither keeps
    this process's loop.
    Raises ``StoreError``, ``CheckpointError`` (spec mismatch included), ``DeviceError``, ``PredictionsError``
    and ``ConfigError`` with one-line messages.
    """
    t0 = time.perf_counter()
    if not isinstance(topk, int) or topk < 1:
        raise ConfigError(f"topk must be a positive integer, got {topk!r}")
    unknown_below = check_unknown_below(unknown_below)
    if out is not None:
        check_output_path(out, what="predictions")
    opts, s, loaded = open_inputs(store, checkpoint, options, overrides, model_args, trust_model_code)
    if loaded.outputs == "tags" and unknown_below is not None:
        raise PredictionsError(NO_UNKNOWN_FOR_TAGS)
    select_labels(loaded.label_names, labels)  # unknown labels refused before the model runs
    engine = Engine(opts)
    model = engine.prepare(loaded.module)
    run = None
    if executor is not None or (cluster is not None and cluster.backend is not None):
        from specstore.infer.engine.distributed import ClusterRun

        run = ClusterRun(s, checkpoint, loaded, opts, cluster or ClusterOptions(), out)
        logits = run.logits(model, engine, executor)
    else:
        res = engine.logits(model, s, np.arange(len(s)), feature=loaded.feature, desc="predicting")
        logits = res.logits
    if len(s) and logits.shape[1] != len(loaded.label_names):
        raise ConfigError(f"{loaded.name} gives {logits.shape[1]} classes; the labels are "
                          f"{len(loaded.label_names)} ({', '.join(loaded.label_names[:5])}...)")
    figures: dict[str, Any] = {"clips": len(s), "audio_seconds": float(s.durations.sum()),
                               "peak_kind": "GPU allocated" if engine.device.type == "cuda" else "anonymous RSS",
                               "device": str(engine.device)}
    stats = (ClusterStats(**run.figures(), **figures) if run is not None
             else PredictStats(**vars(res.run_stats()), **figures))
    probs = probabilities(logits, loaded.calibration, loaded.outputs) if len(s) else np.zeros(
        (0, len(loaded.label_names)), dtype=np.float32)
    _check_finite(probs, s.paths, loaded.name)
    truth = [s.label_names[label] if label >= 0 else None for label in s.labels.tolist()]
    stats.wall_seconds = time.perf_counter() - t0
    result = Predictions(list(s.paths), probs, list(loaded.label_names), truth, stats, loaded.outputs,
                         loaded.calibration.label()).subset(labels)  # labels kept after the (calibrated) softmax
    if out is not None:
        write_predictions_csv(result, out, topk=topk, unknown_below=unknown_below)
    if run is not None:
        run.finish()  # the CSV is whole: nothing is left to resume
    return result

"""The sum of the from-scratch model and a head on a pretrained backbone, trained and saved as one checkpoint.

:func:`train_sum` is what ``make train`` does when the default recipe chooses the sum (:mod:`.choice`), and
what a user calls to have it anyway: the from-scratch model trains on the store's own features (every feature
but the backbone's, as the recipe does; :func:`specstore.infer.train.train`) to ``MODEL.scratch.pt``, the head on the
backbone's cached clip embeddings (:func:`~.transfer.train_transfer`, reusing the cache the choice filled) to
``MODEL.transfer.pt``, and the two are saved together as a :class:`~specstore.infer.models.ensemble.SumClassifier` at
``MODEL``: the members' probabilities averaged, each after its own temperature.  The members' checkpoints stay
beside it (each runs and evaluates alone).  The sum's held-out figures and its own temperature come from the
members' logits on the validation clips (the head's from the embedding cache: no second pass of the backbone).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from specstore.common import check_output_path, write_atomic
from specstore.infer.data.split import SplitRule, training_rows
from specstore.infer.engine.runtime import Engine
from specstore.infer.models.calibration import Calibration, fit_temperature
from specstore.infer.models.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from specstore.infer.models.contract import spec_of
from specstore.infer.models.shipped import load_shipped
from specstore.store import Store, open_store

from ..errors import TrainError
from ..models.ensemble import average_probabilities
from .config import TrainConfig
from .recipe import resolve_validation
from .transfer import cached_logits, embeddings_path_for, train_transfer

__all__ = ["SumResult", "member_paths", "sum_checkpoint", "sum_feature", "train_sum"]

log = logging.getLogger(__name__)


def member_paths(model_path: str | os.PathLike[str]) -> tuple[Path, Path]:
    """``MODEL.scratch.pt`` and ``MODEL.transfer.pt``: where the sum's two members are saved, beside it."""
    p = Path(model_path)
    return p.with_name(f"{p.stem}.scratch{p.suffix or '.pt'}"), p.with_name(f"{p.stem}.transfer{p.suffix or '.pt'}")


def sum_feature(store: Store, backbone_feature: str, feature: str | None = None) -> tuple[str, str]:
    """``(the from-scratch model's feature, the sum's)``: the scratch model reads ``feature`` (default: the
    store's features) less the backbone's (all of them if that is the only one); the sum reads those parts, then
    the backbone's when it is not among them."""
    wanted = feature.split("+") if feature else list(store.specs)
    own = [f for f in wanted if f != backbone_feature] or wanted
    return "+".join(own), "+".join(own + ([backbone_feature] if backbone_feature not in own else []))


def _rows_of(feature: str, part: str, specs: dict[str, Any]) -> list[int]:
    """Input rows ``[start, stop)`` of ``part``'s bins (a ``+`` feature of parts) in ``feature``'s stacking."""
    start = 0
    for name in feature.split("+"):
        if name == part.split("+")[0]:
            return [start, start + sum(specs[p].n_bins for p in part.split("+"))]
        start += specs[name].n_bins
    raise TrainError(f"{part!r} is not part of {feature!r}")


def _temperature(member: Checkpoint) -> float:
    """What divides a member's logits in the sum: its fitted temperature, 1 when uncalibrated."""
    return member.calibration.temperature or 1.0


def sum_checkpoint(members: list[Checkpoint], feature: str, specs: dict[str, Any],
                   extra: dict[str, Any] | None = None) -> Checkpoint:
    """One checkpoint of the :class:`~specstore.infer.models.ensemble.SumClassifier` of ``members`` (trained checkpoints
    of the same labels, each reading one run of ``feature``'s parts, ``specs`` every part's spec); each member's
    temperature (1 when uncalibrated) divides its logits.  Built once here, so weights that do not fit fail now."""
    from ..models.ensemble import SumClassifier

    labels = members[0].label_names
    if any(m.label_names != labels for m in members):
        raise TrainError("the members of a sum must have the same labels in the same order")
    n_bins = sum(specs[p].n_bins for p in feature.split("+"))
    described = [{"model": m.model.to_dict(), "rows": _rows_of(feature, m.feature, specs),
                  "temperature": _temperature(m)} for m in members]
    net = SumClassifier(described, len(labels), n_bins)
    state = {f"members.{i}.{k}": v for i, m in enumerate(members) for k, v in m.state_dict.items()}
    net.load_state_dict(state)
    return Checkpoint.from_model(net, labels, feature, {p: specs[p] for p in feature.split("+")}, extra,
                                 model_spec=spec_of(net))


@dataclass
class SumResult:
    """What :func:`train_sum` did: the paths, the held-out accuracy of each member and of the sum (None without
    validation clips), its seconds, and the members' own summaries."""

    model_path: Path
    members: tuple[Path, Path]
    val_accuracy: dict[str, float | None]
    n_val: int
    seconds: float
    member_summaries: tuple[str, str]
    rules: dict[str, str]
    calibration: Calibration

    def summary(self) -> str:
        """What ``make train`` prints."""
        acc = self.val_accuracy
        held = ("; held-out accuracy " + ", ".join(f"{k} {v:.3f}" for k, v in acc.items() if v is not None)
                + f" on {self.n_val} clips") if acc.get("sum") is not None else " (no validation clips)"
        lines = [f"sum of the from-scratch model and the transfer head (probabilities averaged) -> {self.model_path} "
                 f"in {self.seconds:.1f} s{held}",
                 f"  members, each a checkpoint of its own: {self.members[0]}, {self.members[1]}"]
        lines += [f"  {name} (auto): {why}" for name, why in self.rules.items()]
        lines.append("  " + self.calibration.describe())
        for text in self.member_summaries:
            lines += ["  | " + line for line in text.splitlines()]
        return "\n".join(lines)


def train_sum(store: str | os.PathLike[str] | Store, model_path: str | os.PathLike[str], cfg: TrainConfig,
              backbone: str, *, progress: bool = True, threads: int | None = None, margin_mb: float | None = None,
              overwrite: bool = False, rules: dict[str, str] | None = None) -> SumResult:
    """Train the from-scratch model and a head on ``backbone`` (a shipped model's name) on ``specstore.store``; save
    their sum to ``model_path`` and the members beside it (:func:`member_paths`).  ``cfg``'s ``feature`` (default: the
    store's) less the backbone's is what the scratch model reads.  ``rules``: automatic choices made before (the
    recipe's backbone rule), recorded in the sum's checkpoint.  Raises :class:`TrainError`, ``CheckpointError`` and
    ``ConfigError`` in one line."""
    from .loop import config_path_for, train

    t0 = time.perf_counter()
    scratch_path, head_path = member_paths(model_path)
    if not overwrite:
        for p in (model_path, scratch_path, head_path):
            check_output_path(p, what="MODEL", stream=False)
    s = store if isinstance(store, Store) else open_store(store)
    shipped = load_shipped(backbone)
    own, feature = sum_feature(s, shipped.feature, cfg.feature)
    cache = embeddings_path_for(model_path)
    scratch = train(s, scratch_path, dataclasses.replace(cfg, feature=own, backbone=None), progress=progress,
                    threads=threads, margin_mb=margin_mb, overwrite=overwrite)
    head = train_transfer(s, head_path, dataclasses.replace(cfg, backbone=backbone, feature=None),
                          progress=progress, threads=threads, overwrite=overwrite, cache_path=cache)
    members = [load_checkpoint(scratch_path), load_checkpoint(head_path)]
    resolved, _ = resolve_validation(cfg, int((s.labels >= 0).sum()))
    _, val_rows = training_rows(s, SplitRule(resolved.val_fraction or 0.0, resolved.seed, resolved.val_offset))
    ckpt = sum_checkpoint(members, feature, dict(s.specs))
    accuracy: dict[str, float | None] = {"sum": None, "scratch": None, "transfer": None}
    calibration = Calibration()
    if len(val_rows):
        engine = Engine(dataclasses.replace(cfg.run, progress=False))
        z_scratch = engine.logits(engine.prepare(members[0].build()), s, val_rows, feature=own).logits
        z_head = cached_logits(head_path, s, val_rows, cache)
        if z_head is None:  # not cached (a fine-tuned head): one pass of the backbone over the validation clips
            z_head = engine.logits(engine.prepare(members[1].build()), s, val_rows, feature=shipped.feature).logits
        z_sum = average_probabilities([torch.from_numpy(np.asarray(z, dtype=np.float32)) for z in (z_scratch, z_head)],
                                      [_temperature(m) for m in members])
        truth = s.labels[val_rows].astype(np.int64)
        for name, z in (("sum", z_sum.numpy()), ("scratch", z_scratch), ("transfer", z_head)):
            accuracy[name] = float((np.asarray(z).argmax(1) == truth).mean())
        calibration = fit_temperature(z_sum.numpy(), truth)
    recorded = {**(rules or {}), "sum": ("the from-scratch model and the transfer head, each after its own "
                                         "temperature, probabilities averaged")}
    extra = {"trained": True, "store": str(s.location), "train_config": cfg.to_dict(),
             "n_train": int(members[0].extra.get("n_train", 0) or 0), "n_val": int(len(val_rows)),
             "sum": {"members": [str(scratch_path), str(head_path)], "backbone": backbone,
                     "val_accuracy": accuracy},
             "recipe": {"rules": recorded}, "licence": members[1].extra.get("licence", "")}
    if calibration.calibrated:
        extra["calibration"] = calibration.to_dict()
    ckpt.extra.update(extra)
    save_checkpoint(ckpt, model_path)
    write_atomic(config_path_for(model_path),
                 json.dumps({"model": ckpt.model.to_dict(), **extra}, indent=2) + "\n")
    return SumResult(Path(model_path), (scratch_path, head_path), accuracy, int(len(val_rows)),
                     time.perf_counter() - t0, (scratch.summary(), head.summary()), recorded, calibration)

"""Transfer: a head on a pretrained backbone's clip embeddings (``make train ARCH=musicnn``).

The backbone is a shipped model (:mod:`specstore.infer.models.shipped`; ``musicnn-msd`` by default for ``--arch
musicnn``, any with ``--backbone NAME``).  It runs once per distinct clip of the store (on the engine: batches planned
by length under the memory budget, masked, windows for clips too long for any batch), and its clip embeddings are cached
beside the model, ``MODEL.embeddings.npz``: a plain npz (no pickle) of the content hashes, the embeddings ``(n,
embedding_dim)`` float32, the backbone's name and its feature spec; entries of another backbone or spec are never used.
A second run (a new head, another seed, a cross-validation) reads them back and costs seconds.

The head is a logistic regression on the standardised embeddings (the training clips' mean and standard deviation), its
``C`` chosen by grouped cross-validation on the training clips
(:func:`~specstore.infer.train.stats_head.fit_linear_head`, as the statistics head's), then written into a
:class:`~specstore.infer.models.transfer.TransferClassifier`, saved as any checkpoint (the backbone's weights included).
With held-out validation clips a temperature is fitted on the head's logits for them and recorded
(``extra["calibration"]``, :mod:`specstore.infer.models.calibration`), as the training loop does for any model: a head
is a single-label softmax like any other; without them it is uncalibrated. With ``finetune = N`` the backbone's top
``N`` layers train with the head by SGD in the usual training loop (:func:`specstore.infer.train.train`), the head
starting from the closed-form fit; no cache is kept then, since the embeddings change as the layers train.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from specstore.common import atomic_path, check_output_path, write_atomic
from specstore.infer.data.split import SplitRule, split_keys, training_rows
from specstore.infer.engine.runtime import Engine
from specstore.infer.models.calibration import Calibration, fit_temperature
from specstore.infer.models.checkpoint import Checkpoint, check_store_matches, save_checkpoint
from specstore.infer.models.contract import spec_of
from specstore.infer.models.shipped import SHIPPED, load_shipped
from specstore.store import Store, open_store

from ..errors import TrainError
from .config import TrainConfig
from .distributed import one_process_only
from .recipe import resolve_validation
from .stats_head import fit_linear_head

__all__ = ["BACKBONES", "EmbeddingCache", "TransferResult", "backbone_for", "cached_logits", "clip_embeddings",
           "embeddings_path_for", "train_transfer"]

log = logging.getLogger(__name__)

BACKBONES = {"musicnn": "musicnn-msd"}
"""The shipped backbone an ``--arch`` means when ``--backbone`` is not given."""


def backbone_for(cfg: TrainConfig) -> str | None:
    """The shipped backbone ``cfg`` trains a head on (None: a model trained from scratch)."""
    if cfg.backbone == "none":
        return None
    name = cfg.backbone or BACKBONES.get(cfg.arch)
    if name is not None and name not in SHIPPED:
        raise TrainError(f"no shipped backbone {name!r}; shipped: {', '.join(SHIPPED)}")
    return name


def embeddings_path_for(model_path: str | os.PathLike[str]) -> Path:
    """``MODEL.embeddings.npz``: the backbone's cached clip embeddings, beside the model."""
    p = Path(model_path)
    return p.with_name(p.stem + ".embeddings.npz")


class _Embedder(nn.Module):
    """The backbone with ``forward = embed``, so the engine's prediction loop computes embeddings."""

    def __init__(self, backbone: nn.Module) -> None:
        super().__init__()
        self.backbone = backbone
        for name in ("time_stride", "masks_padding", "window_frames"):
            if hasattr(backbone, name):
                setattr(self, name, getattr(backbone, name))

    def forward(self, x: Tensor, lengths: Tensor) -> Tensor:
        embed: Any = self.backbone.embed
        return embed(x, lengths).float()


@dataclass
class EmbeddingCache:
    """Clip embeddings by content hash, for one backbone and feature spec (``key``); read and written as a
    plain npz (``allow_pickle=False``)."""

    path: Path
    key: str
    vectors: dict[str, np.ndarray] = field(default_factory=dict)

    @classmethod
    def open(cls, path: Path, key: str) -> EmbeddingCache:
        """The cache at ``path`` (empty when missing, unreadable, or made for another backbone or spec)."""
        cache = cls(path, key)
        if not path.is_file():
            return cache
        try:
            with np.load(path, allow_pickle=False) as z:
                if str(z["key"]) != key:
                    log.info("%s holds another backbone's embeddings; computing them again", path)
                    return cache
                cache.vectors = dict(zip((str(h) for h in z["hashes"]), z["embeddings"].astype(np.float32),
                                         strict=True))
        except (OSError, ValueError, KeyError) as e:
            log.warning("ignoring unreadable embedding cache %s: %s", path, e)
        return cache

    def save(self) -> None:
        """Write every entry atomically."""
        hashes = sorted(self.vectors)
        width = len(next(iter(self.vectors.values()))) if self.vectors else 0
        matrix = np.stack([self.vectors[h] for h in hashes]) if hashes else np.zeros((0, width), np.float32)
        with atomic_path(self.path) as tmp, open(tmp, "wb") as f:
            np.savez(f, key=np.array(self.key), hashes=np.array(hashes, dtype=str), embeddings=matrix)


def clip_embeddings(backbone: nn.Module, store: Store, feature: str, rows: np.ndarray, engine: Engine,
                    cache: EmbeddingCache | None = None) -> tuple[np.ndarray, int, float]:
    """``(len(rows), embedding_dim)`` float32 embeddings of store ``rows``, the number of distinct clips the
    backbone ran on (those not in ``cache``) and its seconds; new entries go into ``cache`` (saved)."""
    hashes = [str(store.hashes[int(r)]) for r in rows]
    todo = np.array([r for r, h in zip(rows, hashes, strict=True) if cache is None or h not in cache.vectors],
                    dtype=np.int64)
    computed: dict[str, np.ndarray] = {}
    t0 = time.perf_counter()
    if len(todo):
        model = engine.prepare(_Embedder(backbone))
        res = engine.logits(model, store, todo, feature=feature, desc="embedding")
        computed = {str(store.hashes[int(r)]): res.logits[i].astype(np.float32) for i, r in enumerate(todo)}
        if cache is not None:
            cache.vectors.update(computed)
            cache.save()
    seconds = time.perf_counter() - t0
    table = cache.vectors if cache is not None else computed
    return np.stack([table[h] for h in hashes]), len(computed), seconds


@dataclass
class TransferResult:
    """What :func:`train_transfer` did: the model, the head's choice and figures, the backbone's pass."""

    model_path: Path
    backbone: str
    n_train: int
    n_val: int
    embedded: int
    backbone_seconds: float
    seconds: float
    fit: dict[str, Any]
    val_accuracy: float | None
    rules: dict[str, str]

    def summary(self) -> str:
        """What ``make train`` prints."""
        cv = self.fit.get("cv", {}).get(f"{self.fit['c']:g}", {})
        clips = self.n_train + self.n_val
        lines = [f"transfer head on {self.backbone}: {self.n_train} training clips, {self.n_val} held out; the "
                 f"backbone ran on {self.embedded} of them in {self.backbone_seconds:.1f} s ({clips - self.embedded} "
                 f"from the embedding cache); {self.seconds:.1f} s in all -> {self.model_path}",
                 f"  head: C={self.fit['c']:g}" + (f", grouped {self.fit['folds']}-fold cross-validated accuracy "
                                                   f"{cv['accuracy']:.3f}" if cv else " (too few works to choose)")]
        if self.val_accuracy is not None:
            lines.append(f"  held-out accuracy {self.val_accuracy:.3f} on {self.n_val} clips")
        lines += [f"  {name} (auto): {why}" for name, why in self.rules.items()]
        return "\n".join(lines)


def train_transfer(store: str | os.PathLike[str] | Store, model_path: str | os.PathLike[str], cfg: TrainConfig, *,
                   progress: bool = True, threads: int | None = None, overwrite: bool = False,
                   cache_path: str | os.PathLike[str] | None = None, rules: dict[str, str] | None = None) -> Any:
    """Fit a head on ``cfg``'s backbone (:func:`backbone_for`) for ``specstore.store``'s labels; save it to
    ``model_path`` (see the module docstring).  ``cache_path``: the embedding cache (default
    :func:`embeddings_path_for`; cross-validation's folds share one); ``rules``: automatic choices made before, recorded
    with the head's. Returns a :class:`TransferResult` (with ``finetune``: the training loop's
    :class:`~specstore.infer.train.TrainResult`); both have ``summary()``.  Raises :class:`TrainError`,
    ``CheckpointError`` (the store lacks the backbone's feature) and ``ConfigError`` in one line."""
    t0 = time.perf_counter()
    name = backbone_for(cfg)
    if name is None:
        raise TrainError(f"--arch {cfg.arch} has no pretrained backbone; name one with --backbone")
    one_process_only(f"training a head on the {name} backbone")
    if not overwrite:
        check_output_path(model_path, what="MODEL", stream=False)
    if threads:
        torch.set_num_threads(threads)
    s = store if isinstance(store, Store) else open_store(store)
    if not s.label_names:
        raise TrainError(f"{s.location} has no labels; a classifier needs label names")
    shipped = load_shipped(name)
    check_store_matches(shipped, s)
    cfg, val_rule = resolve_validation(cfg, int((s.labels >= 0).sum()))
    train_rows, val_rows = training_rows(s, SplitRule(cfg.val_fraction or 0.0, cfg.seed, cfg.val_offset))
    if len(np.unique(s.labels[train_rows])) < 2:
        raise TrainError("the training split holds fewer than two labels; a classifier needs at least two")
    backbone = shipped.build()
    engine = Engine(dataclasses.replace(cfg.run, progress=progress))
    cache = None if cfg.finetune else EmbeddingCache.open(Path(cache_path or embeddings_path_for(model_path)),
                                                          _cache_key(shipped))
    rows = np.concatenate([train_rows, val_rows])
    emb, embedded, backbone_seconds = clip_embeddings(backbone, s, shipped.feature, rows, engine, cache)
    train_emb, val_emb = emb[:len(train_rows)], emb[len(train_rows):]
    dim = train_emb.shape[1]
    from ..models.transfer import TransferClassifier

    net = TransferClassifier(name, len(s.label_names), dim, cfg.finetune)
    shift, scale = train_emb.mean(axis=0), 1.0 / np.maximum(train_emb.std(axis=0), 1e-6)
    with torch.no_grad():
        net.shift.copy_(torch.from_numpy(shift))
        net.scale.copy_(torch.from_numpy(scale))
    keys = split_keys(s)
    y = s.labels[train_rows].astype(np.int64)
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1, user_api="blas"):  # small problems: one BLAS thread is several times faster
        fit = fit_linear_head(net.head, (train_emb - shift) * scale, y, [keys[int(r)] for r in train_rows],
                              seed=cfg.seed, what="transfer head")
    val_acc, calibration = None, Calibration()
    if len(val_rows):
        with torch.no_grad():
            val_logits = net.head_logits(torch.from_numpy(val_emb)).numpy()
        val_acc = float((val_logits.argmax(1) == s.labels[val_rows]).mean())
        calibration = fit_temperature(val_logits, s.labels[val_rows].astype(np.int64))  # as the training loop
    rules = {**(rules or {}), **({"val_fraction": val_rule} if val_rule else {})}
    rules["head"] = (f"a logistic regression on the standardised {dim}-value {name} embeddings, C by grouped "
                     "cross-validation on the training clips")
    fit_dict = {"c": fit.c, "folds": fit.folds, "cv": fit.cv}
    extra = {"trained": True, "train_config": cfg.to_dict(), "store": str(s.location), "n_train": int(len(train_rows)),
             "n_val": int(len(val_rows)), "transfer": {"backbone": name, "embedding_dim": dim, "head": fit_dict,
                                                        "backbone_seconds": round(backbone_seconds, 3),
                                                        "val_accuracy": val_acc},
             "recipe": {"rules": rules}, "licence": shipped.extra.get("licence", "")}
    ckpt = Checkpoint.from_model(net, s.label_names, shipped.feature, shipped.specs[shipped.feature], extra,
                                 model_spec=spec_of(net))
    if cfg.finetune:
        return _finetune(s, model_path, cfg, net, shipped.feature, extra, progress=progress, threads=threads,
                         overwrite=overwrite)
    if calibration.calibrated:  # a fine-tuned head gets the loop's own fit instead
        extra["calibration"] = ckpt.extra["calibration"] = calibration.to_dict()
        log.info("%s", calibration.describe())
    save_checkpoint(ckpt, model_path)
    write_atomic(Path(model_path).with_name(Path(model_path).stem + ".config.json"),
                 json.dumps({"train_config": cfg.to_dict(), "model": spec_of(net).to_dict(), **extra}, indent=2) + "\n")
    return TransferResult(Path(model_path), name, len(train_rows), len(val_rows), embedded, backbone_seconds,
                          time.perf_counter() - t0, fit_dict, val_acc, rules)


def cached_logits(model_path: str | os.PathLike[str], store: Store, rows: np.ndarray,
                  cache_path: str | os.PathLike[str] | None = None) -> np.ndarray | None:
    """``(len(rows), n_classes)`` logits of a saved transfer head on store ``rows`` from the embedding cache, with
    no pass of the backbone; None when the model is not a frozen-backbone head or a row is not cached."""
    from specstore.infer.models.checkpoint import load_checkpoint

    from ..models.transfer import TransferClassifier

    ckpt = load_checkpoint(model_path)
    info = ckpt.extra.get("transfer")
    if not info or ckpt.model.kwargs.get("finetune"):
        return None
    cache = EmbeddingCache.open(Path(cache_path or embeddings_path_for(model_path)),
                                _cache_key(load_shipped(info["backbone"])))
    hashes = [str(store.hashes[int(r)]) for r in rows]
    if any(h not in cache.vectors for h in hashes):
        return None
    net = ckpt.build()
    assert isinstance(net, TransferClassifier)
    with torch.no_grad():
        return net.head_logits(torch.from_numpy(np.stack([cache.vectors[h] for h in hashes]))).numpy()


def _cache_key(shipped: Checkpoint) -> str:
    """What the cached embeddings depend on: the backbone's name, model and weights (a BLAKE2b digest), and its
    feature spec."""
    digest = hashlib.blake2b(digest_size=16)
    for k in sorted(shipped.state_dict):
        digest.update(k.encode())
        digest.update(shipped.state_dict[k].detach().cpu().contiguous().numpy().tobytes())
    return json.dumps({"backbone": shipped.extra.get("shipped"), "model": shipped.model.to_dict(),
                       "weights": digest.hexdigest(),
                       "spec": {k: v.to_dict() for k, v in shipped.specs.items()}}, sort_keys=True)


def _finetune(s: Store, model_path: str | os.PathLike[str], cfg: TrainConfig, net: nn.Module, feature: str,
              extra: dict[str, Any], *, progress: bool, threads: int | None, overwrite: bool) -> Any:
    """``finetune > 0``: the usual training loop (:func:`specstore.infer.train.train`) on ``net``, its head fitted in
    closed form and its backbone's top layers unfrozen; the rest of the backbone stays frozen (and in eval
    mode).  Returns the loop's :class:`~specstore.infer.train.TrainResult`."""
    from .loop import train

    cfg = dataclasses.replace(cfg, feature=feature, backbone=None)
    return train(s, model_path, cfg, model=net, progress=progress, threads=threads, overwrite=overwrite)

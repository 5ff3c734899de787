"""specstore's inference side (torch): train, run and evaluate classifiers on a feature store.

Read it as:

* engine: :mod:`infer.runtime` (:class:`Engine`, :class:`RunOptions`) on
  :mod:`infer.device` (device, precision, memory figures) and
  :mod:`infer.cost` (a model's measured bytes per padded clip-frame);
* planner and budget: :mod:`infer.budget` (the one cost rule) and
  :mod:`infer.planner` (length-binned batches under it);
* models: :mod:`infer.contract` (what any model needs), :mod:`infer.models`
  (masked CNN / ResNet), :mod:`infer.windows` (over-long clips),
  :mod:`infer.checkpoint`, :mod:`infer.shipped` (the shipped models by name: the musicnn taggers);
* data: :mod:`infer.data` (Dataset, BatchSampler, collate, prefetch), :mod:`infer.collate`,
  :mod:`infer.augment`, :mod:`infer.split`;
* train: :mod:`infer.train` (a head on a shipped backbone: :mod:`infer.train.transfer`, and the recipe's
  choice of it: :mod:`infer.train.choice`); predict: :mod:`infer.predict`; eval:
  :mod:`infer.evaluate` (:mod:`infer.metrics`, :mod:`infer.plots`); the
  predictions CSV: :mod:`infer.predictions`; notebooks: :mod:`infer.explore`
  (built on the above; nothing here imports it).

``infer.predict(store, model, out_csv)``, ``infer.train(store, model_path)``
and ``infer.evaluate(store, model, out_dir)`` are what ``make infer``, ``make
train`` and ``make eval`` run.
"""

from typing import TYPE_CHECKING

from store.lazy import lazy_package

__all__ = lazy_package(__name__, {
    "budget": ("Budget", "CostModel", "PlanError"),
    "checkpoint": ("Checkpoint", "CheckpointError", "load_checkpoint", "save_checkpoint"),
    "contract": ("ModelSpec",),
    "cost": ("measure_cost_per_frame",),
    "data": ("BudgetBatchSampler", "PadCollate", "StoreDataset", "pad_collate", "prefetch"),
    "evaluate": ("Report", "evaluate"),
    "planner": ("Plan", "plan_batches", "shuffled_training_plan", "training_plan"),
    "predict": ("PredictStats", "predict"),
    "predictions": ("Predictions",),
    "run_options": ("RunOptions",),
    "runtime": ("Engine",),
    "shipped": ("load_shipped", "resolve_checkpoint", "shipped_names"),
    "train": ("TrainConfig", "TrainError", "TrainResult", "train"),
    "train.transfer": ("train_transfer",),
})

if TYPE_CHECKING:
    from .budget import Budget, CostModel, PlanError
    from .checkpoint import Checkpoint, CheckpointError, load_checkpoint, save_checkpoint
    from .contract import ModelSpec
    from .cost import measure_cost_per_frame
    from .data import BudgetBatchSampler, PadCollate, StoreDataset, pad_collate, prefetch
    from .evaluate import Report, evaluate
    from .planner import Plan, plan_batches, shuffled_training_plan, training_plan
    from .predict import PredictStats, predict
    from .predictions import Predictions
    from .run_options import RunOptions
    from .runtime import Engine
    from .shipped import load_shipped, resolve_checkpoint, shipped_names
    from .train import TrainConfig, TrainError, TrainResult, train
    from .train.transfer import train_transfer

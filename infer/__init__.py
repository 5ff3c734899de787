"""specstore's inference side (torch): train, run and evaluate classifiers on a feature store.

Read it as:

* engine: :mod:`specstore.infer.runtime` (:class:`Engine`, :class:`RunOptions`) on
  :mod:`specstore.infer.device` (device, precision, memory figures) and
  :mod:`specstore.infer.cost` (a model's measured bytes per padded clip-frame);
* planner and budget: :mod:`specstore.infer.budget` (the one cost rule) and
  :mod:`specstore.infer.planner` (length-binned batches under it);
* models: :mod:`specstore.infer.contract` (what any model needs), :mod:`specstore.infer.models`
  (masked CNN / ResNet), :mod:`specstore.infer.windows` (over-long clips),
  :mod:`specstore.infer.checkpoint`, :mod:`specstore.infer.shipped` (the shipped models by name: the musicnn taggers);
* data: :mod:`specstore.infer.data` (Dataset, BatchSampler, collate, prefetch), :mod:`specstore.infer.collate`,
  :mod:`specstore.infer.augment`, :mod:`specstore.infer.split`;
* train: :mod:`specstore.infer.train` (a head on a shipped backbone: :mod:`specstore.infer.train.transfer`, and the
  recipe's
  choice of it: :mod:`specstore.infer.train.choice`); predict: :mod:`specstore.infer.predict`; eval:
  :mod:`specstore.infer.evaluate` (:mod:`specstore.infer.metrics`, :mod:`specstore.infer.plots`); the
  predictions CSV: :mod:`specstore.infer.predictions`; notebooks: :mod:`specstore.infer.explore`
  (built on the above; nothing here imports it).

``specstore.infer.predict(store, model, out_csv)``, ``specstore.infer.train(store, model_path)``
and ``specstore.infer.evaluate(store, model, out_dir)`` are what ``make infer``, ``make
train`` and ``make eval`` run.
"""

if __name__ != "specstore.infer":  # one name per module: the folder is imported through specstore/
    raise ImportError(f"specstore's infer/ is the package specstore.infer; import it by that name, not as "
                      f"{__name__!r}")

from typing import TYPE_CHECKING

from specstore.common.lazy import lazy_package

__all__ = lazy_package(__name__)

if TYPE_CHECKING:  # the exports, each imported on first use (specstore.common.lazy)
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

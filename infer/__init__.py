"""specstore's inference side (torch): train, run and evaluate classifiers on a feature store.

Its rooms, each importing only those below it (an import-linter contract, ``make lint``):

* :mod:`~specstore.infer.explore`: notebook helpers, built on everything else;
* :mod:`~specstore.infer.train`: the training loop, its recipe, transfer heads, sums, cross-validation;
* :mod:`~specstore.infer.evaluation`: the report, metrics, figures, baselines;
* :mod:`~specstore.infer.engine`: the engine (device, precision, budget, plan, batch loop), windows for
  over-long clips, a store's predictions and their CSV;
* :mod:`~specstore.infer.data`: the Dataset, the budgeted BatchSampler, the padding collate, the loader;
* :mod:`~specstore.infer.batching`: the budget (the one cost rule), the planner and the constraints;
* :mod:`~specstore.infer.options`: the torch-free settings every command line is generated from;
* :mod:`~specstore.infer.models`: the architectures and their config, the model contract, checkpoints,
  trust, the shipped models, calibration and export.

:mod:`~specstore.infer.cli` is the commands.  ``specstore.infer.predict(store, model, out_csv)``,
``specstore.infer.train(store, model_path)`` and ``specstore.infer.evaluate(store, model, out_dir)`` are what
``make infer``, ``make train`` and ``make eval`` run.
"""

if __name__ != "specstore.infer":  # one name per module: the folder is imported through specstore/
    raise ImportError(f"specstore's infer/ is the package specstore.infer; import it by that name, not as "
                      f"{__name__!r}")

from typing import TYPE_CHECKING

from specstore.common.lazy import lazy_package

__all__ = lazy_package(__name__)

if TYPE_CHECKING:  # the exports, each imported on first use (specstore.common.lazy)
    from .batching.budget import Budget, CostModel
    from .batching.planner import Plan, plan_batches, shuffled_training_plan, training_plan
    from .data import BudgetBatchSampler, PadCollate, StoreDataset, pad_collate, prefetch
    from .engine.cost import measure_cost_per_frame
    from .engine.predict import PredictStats, predict
    from .engine.predictions import Predictions
    from .engine.runtime import Engine
    from .errors import CheckpointError, PlanError, TrainError
    from .evaluation.evaluate import Report, evaluate
    from .models.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
    from .models.contract import ModelSpec
    from .models.shipped import load_shipped, resolve_checkpoint, shipped_names
    from .options.run_options import RunOptions
    from .train import TrainConfig, TrainResult, train
    from .train.transfer import train_transfer

"""specstore's inference side: batch planner, masked models, training, prediction, evaluation.

``infer.predict(store, model, out_csv, device="auto", budget_mb=None)``,
``infer.train(store, model_path, epochs=30, arch="cnn")`` and
``infer.evaluate(store, model, out_dir, split="all")`` mirror the Make targets.
"""

from .checkpoint import Checkpoint, CheckpointError, load_checkpoint, save_checkpoint
from .evaluate import Report, evaluate
from .planner import Plan, plan_batches, shuffled_training_plan
from .predict import PredictOptions, Predictions, predict
from .train import TrainConfig, TrainResult, train

__all__ = [
    "Checkpoint", "CheckpointError", "Plan", "PredictOptions", "Predictions", "Report", "TrainConfig",
    "TrainResult", "evaluate", "load_checkpoint", "plan_batches", "predict", "save_checkpoint",
    "shuffled_training_plan", "train",
]

"""Looking at a store and a model's results, in a notebook: figures, outcomes, the most-confused clips.

* :mod:`~specstore.infer.explore.figures`: a clip's spectrograms (:func:`show_clip`),
  the length histogram, label counts, and the confusion matrix (inline or
  PNG, from :mod:`specstore.infer.evaluation.plots`);
* :mod:`~specstore.infer.explore.outcomes`: predictions joined to the store by path,
  the metrics (:mod:`specstore.infer.evaluation.metrics`), the confusion matrix, the
  most-confused clips;
* :class:`Predictions` and the ``make infer`` CSV (:mod:`specstore.infer.engine.predictions`,
  one schema for writing and reading), re-exported here;
* :func:`quick_train`: a tiny model in seconds for a store without a checkpoint.

The notebook ``examples/explore_store.ipynb`` calls these.  They build on
the core modules (``make eval`` and ``make infer`` use the same metrics,
figure and CSV code); nothing in the core imports this package.
"""

from specstore.infer.engine.predictions import (
    COLUMNS,
    CsvPrediction,
    Predictions,
    read_predictions_csv,
    write_predictions_csv,
)
from specstore.infer.errors import PlotError
from specstore.infer.errors import PredictionsError as ExploreError

from .figures import (
    DB_LIMITS,
    UNLABELLED,
    confusion_matrix_figure,
    label_counts,
    plot_confusion,
    plot_durations,
    plot_label_counts,
    save_figure,
    show_clip,
    show_feature,
    specshow_kwargs,
)
from .outcomes import (
    Outcomes,
    Table,
    classification_metrics,
    confusion_figure,
    load_outcomes,
    metrics_from_confusion,
    most_confused,
    outcomes_from_csv,
    outcomes_from_predictions,
    per_class_table,
)
from .quick_model import quick_train

__all__ = [
    "COLUMNS",
    "DB_LIMITS",
    "UNLABELLED",
    "CsvPrediction",
    "ExploreError",
    "Outcomes",
    "PlotError",
    "Predictions",
    "Table",
    "classification_metrics",
    "confusion_figure",
    "confusion_matrix_figure",
    "label_counts",
    "load_outcomes",
    "metrics_from_confusion",
    "most_confused",
    "outcomes_from_csv",
    "outcomes_from_predictions",
    "per_class_table",
    "plot_confusion",
    "plot_durations",
    "plot_label_counts",
    "quick_train",
    "read_predictions_csv",
    "save_figure",
    "show_clip",
    "show_feature",
    "specshow_kwargs",
    "write_predictions_csv",
]

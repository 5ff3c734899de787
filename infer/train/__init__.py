"""Training: one module per concern.

* :mod:`.config`: :class:`TrainConfig` (every option, its CLI flag and help,
  TOML/JSON config files);
* :mod:`.schedule`: the learning-rate schedule;
* :mod:`.resume`: the resume file;
* :mod:`.recipe`: the ``auto`` options, resolved from the training data by fixed rules;
* :mod:`.stats_head`: the statistics head (a logistic regression on band statistics, fitted in closed form);
* :mod:`.prepare`: the run and the model, before the first step;
* :mod:`.batches`: the crop, the augmentation and the budgeted batches (re-exported by :mod:`.prepare`);
* :mod:`.steps`: one optimiser step's mechanics (mixup, weight average, OOM split);
* :mod:`.epoch`: one epoch's pass and its validation;
* :mod:`.distributed`: several processes under torchrun (DDP: the shared budget, broadcasts, BatchNorm averaging);
* :mod:`.debug`: the test hooks a distributed run obeys (off unless their environment variables are set);
* :mod:`.report`: ``metrics.csv``, TensorBoard scalars, the held-out report;
* :mod:`.loop`: :func:`train`, the run itself (``make train``, ``make train NPROC=N``).
* :mod:`.transfer`: a head on a pretrained backbone's cached clip embeddings (``make train ARCH=musicnn``);
* :mod:`.ensemble`: the sum of the from-scratch model and such a head, saved as one checkpoint;
* :mod:`.choice`: the recipe's rule between the three, from the training clips alone.

Data come through :mod:`specstore.infer.data` (the store dataset with per-item crops
and :mod:`specstore.infer.data.augment`'s SpecAugment, the budgeted batch sampler, the
padding collate); batches are planned by :func:`specstore.infer.batching.planner.training_plan`
under the engine's :class:`~specstore.infer.batching.budget.Budget`; the split is
:mod:`specstore.infer.data.split`'s.  The names below are imported on first use (:mod:`specstore.common.lazy`), so
``from specstore.infer.train.config import TrainConfig`` (the commands' options) costs no torch.
"""

from typing import TYPE_CHECKING

from specstore.common.lazy import lazy_package

__all__ = lazy_package(__name__)

if TYPE_CHECKING:  # the exports, each imported on first use (specstore.common.lazy)
    from ..batching.planner import MIN_TRAINING_EFFICIENCY, training_plan
    from ..data.split import training_rows
    from ..errors import TrainError
    from .config import TrainConfig, add_config_arguments, config_from_args
    from .loop import TrainResult, config_path_for, metrics_path_for, train
    from .resume import resume_path_for
    from .schedule import lr_at

"""The run defaults, in one place: device, precision, memory budget, batch size and its price (and their bounds).

Every command that runs a model (``make infer``, ``make eval``, ``make
plan``, ``make train``) and every object that plans batches
(:class:`~specstore.infer.engine.runtime.RunOptions`, :class:`~specstore.infer.batching.budget.Budget`,
:class:`~specstore.infer.data.BudgetBatchSampler`, the training config's runtime
fields) takes its default from here; the command lines and the Makefile pass
an option only when the user sets it.  The bounds here are applied by
:class:`~specstore.infer.engine.runtime.RunOptions` (beside each of its fields).  Training's
own defaults (epochs, learning rate, crops, ...) live in
:mod:`specstore.infer.train.config`.  Pure constants: no torch.
"""

from __future__ import annotations

from typing import Final, TypedDict

__all__ = ["CPU_BATCH_OVERHEAD_FRAMES", "CPU_BUDGET_MB", "CUDA_MARGIN_MB", "DEFAULT_BATCH_OVERHEAD_FRAMES", "DEVICE",
           "EVAL_SPLITS", "MAX_BATCH", "MAX_BATCH_LIMIT", "MAX_BATCH_OVERHEAD_FRAMES", "MAX_BUDGET_MB",
           "MAX_LOADER_WORKERS", "MAX_SEED", "PLAIN_MODEL", "PRECISION", "PRECISIONS"]

DEVICE = "auto"
"""``auto`` (CUDA when available, else CPU), ``cpu``, ``cuda`` or ``cuda:N``."""

PRECISIONS = ("auto", "fp32", "bf16", "fp16")
"""``precision`` settings: auto = bf16 autocast on CUDA where supported (else fp16), fp32 on CPU."""

PRECISION = "auto"
"""The default of :data:`PRECISIONS`."""

MAX_BATCH = 16
"""Most clips in one batch (the seed article's advice)."""

MAX_BATCH_LIMIT = 4096
"""The largest ``max_batch`` accepted: the planner's dynamic programme tries every batch size up to it for
every clip (``O(clips x max_batch)`` steps), and 4096 clips is already the GPU check's largest batch."""

MAX_BUDGET_MB = float(2**20)
"""The largest memory budget (and GPU margin) accepted, MiB: 1 TiB.  The planner charges a batch
``B * T * cost_per_frame + overhead`` bytes in float64 and compares it with the budget; up to 2**40 bytes
these figures stay 2**13 times below 2**53, where float64 stops counting single bytes, and frame counts
stay far inside int64.  1 TiB per batch is beyond any machine's RAM or GPU today."""

MAX_SEED = 2**32 - 1
"""The largest seed ``train``, ``cv`` and ``init`` take: training passes its seed to scikit-learn's
``random_state`` (the statistics head's logistic regression), which takes no more."""

MAX_LOADER_WORKERS = 64
"""The most DataLoader worker processes accepted: each holds its own reader of the store, and beyond the
cores they only compete for them."""

CPU_BUDGET_MB = 2048.0
"""Memory (MiB) one batch may use on CPU unless configured: inference and training alike (the measured
cost per frame already includes what training keeps for backward)."""

CUDA_MARGIN_MB = 1536.0
"""GPU memory (MiB) kept free beyond the budget (the seed keeps 1.5 GB); the budget on CUDA is the free
memory minus this margin, capped by a configured budget."""

DEFAULT_BATCH_OVERHEAD_FRAMES = 1024.0
"""The planner's price of one more batch, in padded frames (~24 s of audio at 43 frames/s), on a GPU: it
splits a batch only where that saves more padding, so batches stay full, as a GPU (milliseconds per launch
and copy) wants.  A padding/batch-count trade-off rather than a device constant; ``inf`` gives the fewest
batches.  Measured figures: docs/serving.md, "The price of a batch"."""

CPU_BATCH_OVERHEAD_FRAMES = 64.0
"""The price of one more batch on a CPU, padded frames: a CPU batch costs little beyond its frames, so the
planner may split wherever that saves padding (docs/serving.md).  The engine
(:class:`~specstore.infer.engine.runtime.Engine`) chooses between the two by device."""

MAX_BATCH_OVERHEAD_FRAMES = float(1 << 30)
"""The largest price of a batch a user may set, padded frames: 2**30 frames (290 days at 43 frames/s)
outweighs any batch's padding, so more would act as the same: the fewest batches."""

EVAL_SPLITS = ("auto", "all", "train", "val")
"""``make eval``'s ``--split``: auto (the held-out split on the store the model was trained on, every clip
elsewhere), or one of :data:`specstore.infer.data.split.SPLITS`; here so the command line offers them without torch."""


class PlainModel(TypedDict):
    """The :class:`~specstore.infer.models.config.ModelConfig` fields that make the plain CNN (see :data:`PLAIN_MODEL`).
    """

    pooling: str
    freq_pooling: str
    stem_freq_kernel: int
    input_time_pool: int


PLAIN_MODEL: Final[PlainModel] = {"pooling": "mean", "freq_pooling": "mean", "stem_freq_kernel": 3,
                                  "input_time_pool": 1}
"""The plain CNN: mean pooling over time and frequency, a 3x3 stem, no input pooling.  ``ModelConfig``'s
defaults are the training recipe's model; the benchmarks, ``plan`` and ``init-model`` and many tests build
this one (``ModelConfig(**PLAIN_MODEL, ...)``), as they did when these were its defaults, so their figures
stay comparable.  Read only."""

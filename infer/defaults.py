"""The run defaults, in one place: device, precision, memory budget, batch size.

Every command that runs a model (``make infer``, ``make eval``, ``make
plan``, ``make train``) and every object that plans batches
(:class:`~infer.runtime.RunOptions`, :class:`~infer.budget.Budget`,
:class:`~infer.data.BudgetBatchSampler`, the training config's runtime
fields) takes its default from here; the command lines and the Makefile pass
an option only when the user sets it.  Training's own defaults (epochs,
learning rate, crops, ...) live in :mod:`infer.train.config`.  Pure
constants: no torch.
"""

from __future__ import annotations

__all__ = ["CPU_BUDGET_MB", "CUDA_MARGIN_MB", "DEVICE", "MAX_BATCH", "PRECISION", "PRECISIONS"]

DEVICE = "auto"
"""``auto`` (CUDA when available, else CPU), ``cpu``, ``cuda`` or ``cuda:N``."""

PRECISIONS = ("auto", "fp32", "bf16", "fp16")
"""``precision`` settings: auto = bf16 autocast on CUDA where supported (else fp16), fp32 on CPU."""

PRECISION = "auto"
"""The default of :data:`PRECISIONS`."""

MAX_BATCH = 16
"""Most clips in one batch (the seed article's advice)."""

CPU_BUDGET_MB = 2048.0
"""Memory (MiB) one batch may use on CPU unless configured: inference and training alike (the measured
cost per frame already includes what training keeps for backward)."""

CUDA_MARGIN_MB = 1536.0
"""GPU memory (MiB) kept free beyond the budget (the seed keeps 1.5 GB); the budget on CUDA is the free
memory minus this margin, capped by a configured budget."""

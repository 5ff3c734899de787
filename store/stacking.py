"""A clip's stored features as one model input: the parts stacked along the bin axis.

A feature such as ``"mel+cqt"`` is its stored parts (each ``(n_frames,
bins)`` in the store's dtype, on one frame grid) stacked frame by frame
into ``(n_bins, n_frames)`` float32.  Reading from a store
(:class:`specstore.infer.data.StoreDataset`) and decoding a file in memory
(``specstore classify``, the server) both go through :func:`stack_parts`,
so the same stored values give the same model input.  Numpy only.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from specstore.common.errors import ConfigError

__all__ = ["stack_parts"]


def stack_parts(parts: Sequence[np.ndarray]) -> np.ndarray:
    """``(sum of bins, n_frames)`` float32 from ``(n_frames, bins)`` parts, in the order given.

    float16 values convert to float32 exactly, so features computed in the
    store's dtype give exactly the input a store of them gives.  Raises
    :class:`~specstore.common.ConfigError` for no parts or parts of different lengths.
    """
    if not parts:
        raise ConfigError("a clip needs at least one feature part")
    if any(p.ndim != 2 for p in parts) or len({int(p.shape[0]) for p in parts}) != 1:
        raise ConfigError(f"feature parts must be (n_frames, bins) arrays on one frame grid, got shapes "
                          f"{[tuple(p.shape) for p in parts]}")
    out = np.empty((sum(int(p.shape[1]) for p in parts), int(parts[0].shape[0])), dtype=np.float32)
    b = 0
    for p in parts:
        out[b:b + p.shape[1]] = p.T
        b += p.shape[1]
    return out

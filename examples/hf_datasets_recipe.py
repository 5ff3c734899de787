"""Export a specstore store (or some of its clips) to a Hugging Face ``datasets.Dataset``.

    . .venv/bin/activate      # once per shell, after make install (the README's set-up)
    python examples/hf_datasets_recipe.py data/demo.zarr data/demo-hf --labelled-only

:func:`to_hf_dataset` writes one row per clip with ``datasets.Dataset.from_generator``:

* ``features``: ``Array2D(shape=(None, n_bins))``, the clip's ``(frames, bins)`` values in the
  store's dtype (float16 by default: the same bytes, no loss) or float32;
* ``n_frames`` (int32), ``duration`` (float32, seconds), ``path`` (string), ``row`` (int64,
  the clip's store row) and ``label`` (``ClassLabel`` with the store's label names; -1 = none).

The rows are written to Arrow files under ``cache_dir`` (the copy is the point of an export:
the result is a self-contained dataset for the Hub, ``save_to_disk`` or any ``datasets``
pipeline).  ``ds.with_format("torch")`` reads it back as tensors; ``features`` is ``(T, bins)``
there, so a specstore-contract model takes ``x = features.T[None, None]``.

Copy this file into your project (it needs ``pip install datasets``; specstore itself does not).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from datasets import Array2D, ClassLabel, Dataset, Features, Value

from specstore.common import ConfigError
from specstore.store import Store, open_store

__all__ = ["hf_features", "to_hf_dataset"]


def hf_features(s: Store, feature: str, dtype: str) -> Features:
    """The ``datasets.Features`` schema of an export of ``feature`` from ``s``."""
    return Features({
        "features": Array2D(shape=(None, s.specs[feature].n_bins), dtype=dtype),
        "n_frames": Value("int32"),
        "duration": Value("float32"),
        "path": Value("string"),
        "row": Value("int64"),
        "label": ClassLabel(names=list(s.label_names)),
    })


def _rows(where: str, generation: int, feature: str, rows: list[int], dtype: str) -> Iterator[dict[str, Any]]:
    """One example per store row (a generator ``from_generator`` runs; its arguments are all plain values)."""
    s = open_store(where)
    if s.generation != generation:
        raise ConfigError(f"the store at {where} changed during the export (commit {generation} -> {s.generation})")
    view = s.feature(feature)
    for row in rows:
        yield {"features": np.asarray(view.frames(row), dtype=dtype), "n_frames": int(s.lengths[row]),
               "duration": float(s.durations[row]), "path": s.paths[row], "row": int(row),
               "label": int(s.labels[row])}


def to_hf_dataset(store: str | Store, feature: str | None = None, *, rows: Sequence[int] | None = None,
                  labelled_only: bool = False, dtype: str | None = None, cache_dir: str | None = None) -> Dataset:
    """A ``datasets.Dataset`` of the store's clips ``rows`` (default all; ``labelled_only`` keeps labelled ones).

    ``dtype``: ``"float16"`` or ``"float32"`` (default: the feature's stored dtype);
    ``cache_dir``: where ``datasets`` writes the Arrow files (default its own cache).  The
    store's URL and commit are part of the generator's arguments, so a changed store is never
    served from a stale cache.
    """
    s = store if isinstance(store, Store) else open_store(store)
    feature = feature or s.default_feature
    if feature not in s.specs:
        raise ConfigError(f"store has no feature {feature!r}; it has {', '.join(s.specs)}")
    dtype = dtype or str(s.specs[feature].dtype)
    if dtype not in ("float16", "float32"):
        raise ConfigError(f"dtype must be float16 or float32, not {dtype!r}")
    chosen = np.arange(len(s)) if rows is None else np.asarray(rows, dtype=np.int64)
    if len(chosen) and (chosen.min() < 0 or chosen.max() >= len(s)):
        raise ConfigError(f"rows must lie in [0, {len(s)}) for a store of {len(s)} clips")
    if labelled_only:
        chosen = chosen[s.labels[chosen] >= 0]
    kwargs = {"where": str(s.location), "generation": s.generation, "feature": feature,
              "rows": [int(r) for r in chosen], "dtype": dtype}
    return Dataset.from_generator(_rows, features=hf_features(s, feature, dtype), gen_kwargs=kwargs,
                                  cache_dir=cache_dir)


def main(argv: list[str] | None = None) -> Dataset:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("store")
    p.add_argument("out", help="folder for Dataset.save_to_disk")
    p.add_argument("--feature", default=None)
    p.add_argument("--dtype", default=None, choices=("float16", "float32"))
    p.add_argument("--labelled-only", action="store_true")
    p.add_argument("--cache-dir", default=None)
    args = p.parse_args(argv)
    ds = to_hf_dataset(args.store, args.feature, labelled_only=args.labelled_only, dtype=args.dtype,
                       cache_dir=args.cache_dir)
    ds.save_to_disk(args.out)
    first = ds.with_format("torch")[0]
    print(f"{len(ds)} clips -> {args.out}; row 0: {first['path']} {tuple(first['features'].shape)} "
          f"{first['features'].dtype}, label {ds.features['label'].int2str(int(first['label']))}")
    return ds


if __name__ == "__main__":
    main()

"""The bounds of the extraction run's own settings: ``--jobs``, ``--block-seconds``, ``--commit-seconds``.

One home for each bound and its reason: ``specstore-features`` checks them
as its command line is parsed (:func:`specstore.common.options.bounded_argument`) and
:func:`specstore.pipeline.extract` checks the same values when called from Python.
The feature parameters' bounds are :class:`specstore.store.FeatureSpec`'s.  Pure: no
audio libraries.
"""

from __future__ import annotations

from specstore.common.limits import Limit

__all__ = ["BLOCK_SECONDS", "COMMIT_SECONDS", "JOBS"]

JOBS = Limit(1, 4096, "tasks decoding at once: worker processes here, or a dask or ray cluster's workers, each "
                      "holding a block of audio; 4096 is beyond any cluster this tool drives", optional=True)
"""``--jobs``: unset means all cores."""

BLOCK_SECONDS = Limit(0.0, 600.0, "seconds of audio a worker decodes at once, at the file's own rate and channels: "
                                  "600 s of 48 kHz stereo float32 is 230 MB per worker", kind=float, low_open=True)
"""``--block-seconds``: how long files are streamed (the values do not depend on it)."""

COMMIT_SECONDS = Limit(0.0, 3600.0, "seconds of finished work an interruption may lose; 0 commits after every task",
                       kind=float)
"""``--commit-seconds``: how often finished shards are committed into the index."""

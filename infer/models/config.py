"""A model's configuration, without torch: :class:`ModelConfig`, its bounds and the architecture names.

What command lines, training configs and checkpoint readers need to check a
model's settings (the band statistics, the bounds on every field and on the
parameter count; the architectures' and poolings' names and sizes, read from
their registries in :mod:`specstore.infer.models.registry`) is here, so that
``--help``, a usage error or a bad value answers before torch is imported;
the models themselves are :mod:`specstore.infer.models`, which re-exports all of this.
Pure: no torch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from specstore.common import ConfigError
from specstore.common.limits import Limit, bounded, check_fields, field_limit
from specstore.common.options import described, option
from specstore.common.records import from_record
from specstore.infer.errors import ModelConfigError
from specstore.infer.models.registry import ARCH_REGISTRY, FREQ_POOLING_REGISTRY, POOLING_REGISTRY

__all__ = [
    "ARCHS",
    "BAND_STATS",
    "FREQ_POOLINGS",
    "MAX_PARAMETERS",
    "MAX_TIME_STRIDE",
    "MIN_FRAMES",
    "POOLINGS",
    "ModelConfig",
    "ModelConfigError",
    "check_parameter_count",
]

ARCHS = ARCH_REGISTRY.names
"""The architectures' names (a live view of :data:`~specstore.infer.models.registry.ARCH_REGISTRY`)."""
BAND_STATS = ("mean", "std", "delta")
"""Statistics of every input bin the statistics head sees, in order: mean, standard deviation and mean
absolute frame-to-frame change over the clip's real frames (normalised input units)."""
POOLINGS = POOLING_REGISTRY.names
"""The time poolings' names (a live view of :data:`~specstore.infer.models.registry.POOLING_REGISTRY`)."""
FREQ_POOLINGS = FREQ_POOLING_REGISTRY.names
"""The frequency poolings' names (a live view of :data:`~specstore.infer.models.registry.FREQ_POOLING_REGISTRY`)."""
MIN_FRAMES = 1
"""Shortest clip (frames) the models accept: lengths shrink as ceil(L/stride)."""


MAX_PARAMETERS = 10**9
"""Most parameters a model that a file may build without trust may ask for (4 GB of float32 weights), counted from
its settings before anything is built: a built-in model's config, a shipped model class's keyword arguments, a sum
of models' members together; the recipe's CNN has under 1 M, the default ResNet 2.8 M, musicnn 0.8 M."""


def check_parameter_count(n: int, what: str, fix: str = "") -> None:
    """Refuse (:class:`ModelConfigError`, one line) a model that ``what`` describes with ``n`` parameters, counted
    from its settings before anything is built, when ``n`` is above :data:`MAX_PARAMETERS`; ``fix``: what to
    lower.  Every model a file may build without trust passes here (a sum of models with its members' total)."""
    if n > MAX_PARAMETERS:
        raise ModelConfigError(f"{what} asks for {n:,} parameters, above the bound of {MAX_PARAMETERS:,} (4 GB of "
                               f"float32 weights){'; ' + fix if fix else ''}")


MAX_TIME_STRIDE = 2**16
"""Largest total time stride (frames) a config may give: every batch is padded to a multiple of it, and
65 536 frames is 25 min at 43 frames/s."""
_DB_RANGE = 1000.0
"""Bound of the input normalisation's dB figures: float32 powers and magnitudes lie within +-450 dB."""


@dataclass(frozen=True)
class ModelConfig:
    """Architecture hyper-parameters; saved in checkpoints via :meth:`to_dict`.

    ``arch``: ``"cnn"`` (``depth`` conv blocks, each conv3x3-BN-ReLU then a
    2x2 max pool over frequency and time) or ``"resnet"`` (a conv stem with a
    2x2 max pool, then ``depth`` stages of ``blocks_per_stage`` residual
    blocks; stages after the first halve frequency and time with a stride-2
    conv).  Channels of block/stage ``i`` are ``min(width * 2**i, max_width)``.
    ``time_kernel`` (odd) is the convs' kernel size along time (3 by default;
    1 gives a model with a one-frame receptive field in time, used to test
    windowing).  ``time_pool=False`` keeps full time resolution (no striding
    in time).  ``input_mean``/``input_std`` (dB) define the fixed input
    normalisation ``(x - input_mean) / input_std``; ``bin_mean``/``bin_std``
    (``n_bins`` values each, dB) replace it with a per-bin one.  ``pooling``:
    ``"mean"`` (MaskedGAP), ``"meanstd"`` (mean and standard deviation over
    real frames) or ``"attention"`` (see :mod:`specstore.infer.models`).  ``input_time_pool``:
    average this many input frames into one before the first conv (after
    normalisation and masking), which divides the cost of every layer by it.
    ``freq_pooling``: ``"mean"`` averages the last activations over
    frequency; ``"keep"`` keeps every (channel, frequency row) pair as a
    feature of its own (the head then sees where in the spectrum, e.g. which
    register, a pattern occurs).  ``stem_freq_kernel`` (odd): the first
    conv's kernel size along frequency (13 by default: an octave of CQT
    bins, so the first layer sees every interval before any pooling blurs
    semitones; 3 like the others is the plain CNN).  ``stats_head``: add a second,
    linear classifier on the clip's per-bin statistics (see
    :class:`~specstore.infer.models.MaskedClassifier`); its logits, times ``stats_weight``, are added
    to the CNN's in eval mode.  ``pool_window`` (input frames, a multiple of
    the time stride; 0 = the whole clip): pool and classify each window of
    that many frames from the clip's start on its own and average the
    windows' logits, weighted by their real frames, so a long clip is judged
    as the training crops of that length were.

    Every numeric field is bounded (its :class:`~specstore.common.limits.Limit`, stated
    beside it with the reason), the total time stride is at most
    :data:`MAX_TIME_STRIDE` and the parameter count (:attr:`n_parameters`,
    computed from the config) at most :data:`MAX_PARAMETERS`: a config is
    checked when it is made, so a checkpoint cannot make the loader allocate
    more than that.

    The defaults are the training recipe's model (``make train``: pooling
    ``meanstd``, frequency pooling ``keep``, stem kernel 13, input time pool
    2; :class:`~specstore.infer.train.TrainConfig` offers these fields as its own
    options, with this help).  ``n_bins``, ``n_classes`` and
    ``bin_mean``/``bin_std`` describe the data: training fills them from the
    store; ``stats_head``, ``stats_weight`` and ``pool_window`` are set by the
    recipe's auto rules.  The plain CNN of the benchmarks and many tests
    (mean pooling, stem kernel 3, no input pooling) is
    :data:`specstore.infer.options.defaults.PLAIN_MODEL`.
    """

    arch: str = "cnn"
    n_bins: int = bounded(128, 1, 16384, "input rows, the bins of every stacked feature; mel and CQT use "
                                         "16-256 each")
    n_classes: int = bounded(10, 1, 100_000, "labels; a tag vocabulary of a few thousand is already large")
    width: int = described(bounded(32, 1, 4096, "channels of the first block; the recipe uses 32, ResNet-50's "
                                                "widest layer has 2048"),
                           "channels of the first block (built-in models)")
    depth: int = described(bounded(4, 1, 16, "blocks or stages, each halving time: 2**16 frames of stride is 25 min "
                                             "at 43 frames/s"), "blocks / stages (built-in models)")
    blocks_per_stage: int = bounded(2, 1, 64, "residual blocks per stage; ResNet-152's longest stage has 36")
    max_width: int = bounded(512, 1, 4096, "the channel cap, as width")
    dropout: float = described(bounded(0.1, 0.0, 1.0, "a probability; 1 would drop every feature", high_open=True),
                               "dropout before the head (built-in models)")
    time_kernel: int = bounded(3, 1, 255, "the convs' kernel along time, frames; 255 frames is 6 s at "
                                          "43 frames/s", odd=True)
    time_pool: bool = True
    input_mean: float = bounded(-40.0, -_DB_RANGE, _DB_RANGE, "dB; float32 powers and magnitudes lie within "
                                                               "+-450 dB")
    input_std: float = bounded(40.0, 0.0, _DB_RANGE, "dB, a scale: positive", low_open=True)
    bn_momentum: float = bounded(0.1, 0.0, 1.0, "BatchNorm's running-statistics momentum", low_open=True)
    bn_eps: float = bounded(1e-5, 0.0, 1.0, "added to the variance of roughly unit-scale activations",
                             low_open=True)
    bin_mean: tuple[float, ...] | None = None
    """Per-bin input means (``n_bins`` values, dB): each within :attr:`input_mean`'s bounds."""
    bin_std: tuple[float, ...] | None = None
    """Per-bin input scales (``n_bins`` values, dB): each within :attr:`input_std`'s bounds."""
    pooling: str = option("meanstd", "pooling over time (built-in models): mean, meanstd (mean and standard "
                                     "deviation), attention", choices=POOLINGS)
    input_time_pool: int = described(bounded(2, 1, 256, "input frames averaged into one; 256 frames is 6 s at "
                                                        "43 frames/s"),
                                     "average this many frames into one at the model's input, dividing every "
                                     "layer's cost by it (built-in models)")
    freq_pooling: str = option("keep", "frequency at the end of the built-in models: mean (averaged) or keep (each "
                                       "frequency row a feature of its own: the head sees the register)",
                               choices=FREQ_POOLINGS)
    stem_freq_kernel: int = described(bounded(13, 1, 255, "the first conv's kernel along frequency, bins; 13 spans "
                                                          "an octave of CQT bins", odd=True),
                                      "the first conv's kernel along frequency, bins (odd; 13 spans an octave of "
                                      "CQT bins) (built-in models)")
    stats_head: bool = False
    stats_weight: float = bounded(1.0, 0.0, 1e6, "a weight on logits; the recipe chooses 0-2")
    pool_window: int = bounded(0, 0, 2**24, "input frames, 0 = the whole clip; 2**24 frames is 4 days at "
                                            "43 frames/s")

    def __post_init__(self) -> None:
        check_fields(self, ModelConfigError)
        for name in ("time_pool", "stats_head"):
            if not isinstance(getattr(self, name), bool):
                raise ModelConfigError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if self.arch not in ARCHS:
            raise ModelConfigError(f"unknown arch {self.arch!r}; expected one of {ARCHS}")
        if self.pooling not in POOLINGS:
            raise ModelConfigError(f"unknown pooling {self.pooling!r}; expected one of {POOLINGS}")
        if self.freq_pooling not in FREQ_POOLINGS:
            raise ModelConfigError(f"unknown freq_pooling {self.freq_pooling!r}; expected one of {FREQ_POOLINGS}")
        self._check_bin_normalisation()
        if self.time_stride > MAX_TIME_STRIDE:
            raise ModelConfigError(f"the model's time stride (input_time_pool x 2**depth = {self.time_stride} "
                                   f"frames) is above its bound {MAX_TIME_STRIDE}: every clip would be padded to "
                                   "a multiple of it")
        check_parameter_count(self.n_parameters, "the model config", "lower width, max_width, depth or the kernel "
                                                                     "sizes")

    def _check_bin_normalisation(self) -> None:
        """``bin_mean``/``bin_std``: both or neither, ``n_bins`` finite values each within the bounds of
        ``input_mean``/``input_std``; stored as tuples of floats."""
        if (self.bin_mean is None) != (self.bin_std is None):
            raise ModelConfigError("give bin_mean and bin_std together (or neither)")
        for name, like in (("bin_mean", "input_mean"), ("bin_std", "input_std")):
            values = getattr(self, name)
            if values is None:
                continue
            if isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
                raise ModelConfigError(f"{name} must be a list of {self.n_bins} numbers")
            if len(values) != self.n_bins:
                raise ModelConfigError(f"{name} must hold {self.n_bins} finite numbers (one per bin), "
                                       f"got {len(values)}")
            limit: Limit = field_limit(type(self), like)
            for i, v in enumerate(values):
                limit.check(f"{name}[{i}]", v, ModelConfigError)
            object.__setattr__(self, name, tuple(float(v) for v in values))

    @property
    def time_stride(self) -> int:
        """Input frames per output frame: ``input_time_pool x 2**depth`` (``input_time_pool`` without
        ``time_pool``), the same for both archs."""
        return self.input_time_pool * (2**self.depth if self.time_pool else 1)

    @property
    def n_parameters(self) -> int:
        """Parameters of the model this config builds (trainable or not), counted from the config alone,
        before any tensor is allocated: the check that bounds what a checkpoint can make the loader
        allocate."""
        arch = ARCH_REGISTRY.get(self.arch)
        channels, rows = arch.last_activations(self)
        features = channels * FREQ_POOLING_REGISTRY.get(self.freq_pooling).kept_rows(rows)
        pooling = POOLING_REGISTRY.get(self.pooling)
        n = arch.n_parameters(self) + (pooling.head_inputs(features) + 1) * self.n_classes
        n += pooling.n_parameters(features)
        if self.stats_head:
            n += (len(BAND_STATS) * self.n_bins + 1) * self.n_classes
        return n

    @property
    def channels(self) -> list[int]:
        """Output channels of each block (cnn) or stage (resnet)."""
        return [min(self.width * 2**i, self.max_width) for i in range(self.depth)]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (what checkpoints hold)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        """Inverse of :meth:`to_dict`; rejects unknown fields with one clear error."""
        return from_record(cls, data, "model config", ModelConfigError)

    @classmethod
    def check_field(cls, name: str, value: Any, error: type[ConfigError] = ModelConfigError) -> None:
        """Check one bounded field's value alone (e.g. a training option that becomes it), as
        construction would."""
        field_limit(cls, name).check(name, value, error)


"""Training configuration: one dataclass that is the CLI, the config file and the checkpoint record.

Every field of :class:`TrainConfig` carries its help text (and, where
needed, how the command line spells or parses it) in its metadata;
:func:`add_config_arguments` builds the ``train`` command's options from the
fields and :func:`config_from_args` reads them back, so adding a training
option is one edit: a field here.  :meth:`TrainConfig.from_file` reads a
TOML or JSON file holding any subset of the fields (``--config FILE``);
options given on the command line override the file.  The resolved
configuration is written next to the checkpoint (``<model>.config.json``)
and into the checkpoint itself.  Light: it imports no torch, so the commands' ``--help``
and their option errors answer at once.

One home per setting: the built-in model's options (``width``, ``pooling``,
...) are fields of :class:`~specstore.infer.models.config.ModelConfig`;
:class:`TrainConfig` names them (:func:`_of`), takes their defaults, bounds
and help from there, and holds the :class:`ModelConfig` they make
(:attr:`TrainConfig.model`), built, and so checked, once when the config is
made.  The run's settings (``device``, ``max_batch``, ...) are a
:class:`~specstore.infer.options.run_options.RunOptions` the config holds
(:attr:`TrainConfig.run`), of which a recipe records :data:`RUN_RECORDED`.
Both stay flat in the command line, the config files, ``to_dict`` and the
resume key, in the order every run recorded them (:data:`RUN_PLACES`), so
files written before read the same.  What only a recipe has stays here: the auto fields (None = derived
from the data: ``stats_head``, ``stats_weight``, ``pool_seconds``, which
becomes the model's ``pool_window`` in frames once the feature's hop is
known), the input ``normalization`` fitted on training frames, and
``arch`` with ``model_args``, which may name a user's model by import path
(a :class:`ModelConfig` knows only the built-in architectures).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tomllib
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from specstore.common import ConfigError
from specstore.common.limits import Limit, bounded, field_limit
from specstore.common.options import add_options, borrowed, described, given, option, option_fields
from specstore.common.records import from_record
from specstore.infer.errors import TrainError
from specstore.infer.models.config import ARCHS, ModelConfig
from specstore.infer.options.defaults import MAX_SEED
from specstore.infer.options.run_options import RunOptions

__all__ = ["RUNTIME_FIELDS", "RUN_PLACES", "RUN_RECORDED", "TrainConfig", "TrainError", "add_config_arguments",
           "config_from_args", "model_options"]


RUN_PLACES: dict[str, tuple[str, ...]] = {"class_weighted": ("max_batch", "budget_mb"),
                                          "grad_checkpoint": ("loader_workers",), "feature": ("device", "precision")}
"""The :class:`RunOptions` settings a recipe records, each after the recipe field it has always followed in the
flat record (the command line's options, ``to_dict``, ``MODEL.config.json``)."""
RUN_RECORDED = tuple(name for names in RUN_PLACES.values() for name in names)
"""The run settings a recipe records (flat, beside its own fields).  The others (threads, GPU margin, memory
layout, the planner's price of a batch, progress bars) are the command's: :func:`~specstore.infer.train.train`
takes threads and margin as arguments."""
RUNTIME_FIELDS = ("device", "precision", "budget_mb", "loader_workers")
"""Fields that may change between an interrupted run and its resumption (they do not change the result)."""
NORMALIZATIONS = ("global", "bin")
"""``normalization``: one mean and std for every input bin, or one per bin."""
SELECTS = ("last", "best")
"""``select``: the weights at the end of the schedule, or at the best validation epoch."""


def _optional_seconds(text: str) -> float | None:
    """``--crop-seconds``: a positive number of seconds, or 0/none/whole for whole clips."""
    if text.strip().lower() in ("0", "none", "whole"):
        return None
    return float(text)


def _optional_count(text: str) -> int | None:
    """A positive integer, or auto (None: the recipe derives it from the training data)."""
    return None if text.strip().lower() == "auto" else int(text)


def _optional_float(text: str) -> float | None:
    """A number, or auto (None: chosen at the end of training, :mod:`specstore.infer.train.stats_head`)."""
    return None if text.strip().lower() == "auto" else float(text)


def _optional_name(text: str) -> str | None:
    """A name, or auto (None: the recipe chooses, :mod:`.choice`)."""
    return None if text.strip().lower() == "auto" else text.strip()


def _json_object(text: str) -> dict[str, Any]:
    """``--model-args``: a JSON object of keyword arguments."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not JSON: {e}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object, e.g. '{\"width\": 16}'")
    return value


_RULE = ("kind", "low_open", "high_open", "optional")
"""The keywords of :func:`_opt` and :func:`_auto` that are the bound's rule
(:class:`~specstore.common.limits.Limit`)."""


def _opt(default: Any, help: str, bound: tuple[float, float, str] | None = None, **meta: Any) -> Any:
    """A recipe field with its command-line help (``meta``: ``parse``, ``choices``, ``metavar``) and, for a
    number, its ``bound``: ``(low, high, why)``, with ``kind``, ``low_open``, ``high_open``, ``optional`` in
    ``meta`` (:func:`specstore.common.limits.bounded`), checked when the config is made and as the command line is
    parsed."""
    if bound is None:
        return option(default, help, **meta)
    rule = {k: meta.pop(k) for k in _RULE if k in meta}
    return described(bounded(default, *bound, **rule), help, **meta)


def _auto(help: str, bound: tuple[float, float, str] | None = None, **meta: Any) -> Any:
    """A recipe field whose default (None) is auto: derived from the training data (:mod:`.recipe`); a number's
    ``bound`` as :func:`_opt`'s."""
    return _opt(None, help, bound, shown="auto", **({"optional": True} if bound else {}), **meta)


def _of(cls: type, name: str) -> Any:
    """A field that is field ``name`` of ``cls`` (:class:`ModelConfig`): its default, bounds and help live there,
    once; the config builds (and so checks) the ``cls`` it holds from it."""
    return borrowed(cls, name, of=cls.__name__)


def _recipe_run(**recorded: Any) -> RunOptions:
    """The run options a recipe holds: ``recorded`` (of :data:`RUN_RECORDED`), no progress bars (the command's)."""
    return RunOptions(**recorded, progress=False)


@dataclass(frozen=True)
class TrainConfig:
    """Everything that determines a training run; JSON-able, saved in the checkpoint's ``extra``.

    Units: ``lr`` per step (AdamW), ``crop_seconds`` seconds, mask widths in
    frames / bins.  See each field's help (``make train --help`` lists them
    with their defaults).  The fields made with :func:`_of` are the built-in
    model's (:attr:`model`): their defaults, bounds and help are those of
    :class:`ModelConfig`.  :attr:`run`: the run options (device, precision,
    memory budget, ``max_batch``, loader workers: :data:`RUN_RECORDED`;
    ``TrainConfig(run=RunOptions(device="cpu"))``); the others must keep
    their defaults, and progress bars are always off here (the command's).
    :meth:`from_dict` and :meth:`to_dict` spell them flat, beside the
    recipe's fields, as every config file and checkpoint has.
    """

    epochs: int = _opt(15, "passes over the training clips",
                       (1, 10_000, "passes over the training clips; the recipe's 15 take minutes, 10 000 would take "
                                       "days"))
    lr: float = _opt(3e-3, "peak learning rate of AdamW (after warm-up, then cosine decay)",
                     (0.0, 10.0, "AdamW's step size; above 1 every model here diverges"), low_open=True)
    weight_decay: float = _opt(1e-2, "AdamW weight decay (not applied to BatchNorm weights and biases)",
                               (0.0, 10.0, "decoupled: each step shrinks the weights by lr times it; the recipe's "
                                           "is 0.01"))
    warmup_fraction: float = _opt(0.1, "share of the epochs spent warming the learning rate up from lr/25",
                                  (0.0, 1.0, "a share of the epochs"), high_open=True)
    final_lr_ratio: float = _opt(0.01, "learning rate at the end, as a share of lr", (0.0, 1.0, "a share of lr"),
                                 low_open=True)
    ema: float = _opt(0.0, "validate and save an exponential moving average of the weights, with this decay per "
                           "step (e.g. 0.99; 0 disables)", (0.0, 1.0, "a decay per step; 1 would never move"),
                      high_open=True)
    label_smoothing: float = _opt(0.0, "cross-entropy label smoothing",
                                  (0.0, 1.0, "a share of the target; 1 would leave no label"), high_open=True)
    class_weighted: bool = _opt(False, "weight the loss by inverse class frequency")
    crop_seconds: float | None = _opt(10.0, "random crop per clip and epoch, seconds; 0 = whole clips",
                                      (0.0, 3600.0, "seconds; an hour is longer than a crop needs to be, and 0 "
                                                    "means whole clips"),
                                      kind=float, low_open=True, optional=True, parse=_optional_seconds,
                                      metavar="SECONDS")
    crops_per_clip: int | None = _auto("random crops of every training clip an epoch may draw from (each with "
                                            "its own crop and augmentation); auto: enough for crops_per_epoch, 1-8 "
                                            "per clip (infer/train/recipe.py)",
                                      (1, 1024, "crops of each clip the sampler draws from; auto takes 1-8"),
                                      kind=int, parse=_optional_count, metavar="N|auto")
    crops_per_epoch: int | None = _auto("crops trained per epoch, a fresh random subset each epoch of the "
                                             "crops_per_clip crops of every clip; auto: 480 (30 batches of 16), or "
                                             "every clip once when there are more clips, or all crops when "
                                             "crops_per_clip is set; whole clips (no crop): each clip once",
                                     (1, 10**7, "crops trained per epoch; ten million is days per epoch"),
                                     kind=int, parse=_optional_count, metavar="N|auto")
    time_masks: int = _opt(2, "SpecAugment time masks per clip (0 disables)",
                           (0, 64, "masks per clip, each a pass over the crop; the recipe uses 2"))
    time_mask_frames: int = _opt(24, "widest time mask, frames",
                                 (0, 2**16, "frames; 65 536 is 25 min at 43 frames/s, longer than any crop"))
    freq_masks: int = _opt(2, "SpecAugment frequency masks per clip (0 disables)",
                           (0, 64, "masks per clip, each a pass over the crop; the recipe uses 2"))
    freq_mask_bins: int = _opt(12, "widest frequency mask, bins",
                               (0, field_limit(ModelConfig, "n_bins").upper, "bins; no model's input has more"))
    gain_db: float = _opt(6.0, "random gain per clip and epoch, uniform in +-this many dB (0 disables)",
                          (0.0, 120.0, "dB; 120 dB spans hearing's whole range"))
    tilt_db: float = _opt(0.0, "random spectral tilt per clip and epoch: a ramp across each feature's bins between "
                               "two gains uniform in +-this many dB (an equaliser; 0 disables)",
                          (0.0, 120.0, "dB; 120 dB spans hearing's whole range"))
    pitch_shift: int = _opt(2, "random pitch shift per clip and epoch, uniform in +-this many semitones, as a "
                               "roll of the CQT bins (stores with a CQT; 0 disables)",
                            (0, 48, "semitones: 4 octaves of CQT bins; the default CQT spans 7"))
    mixup: float = _opt(0.0, "mixup: mix each batch with itself shuffled, weight ~ Beta(a, a) (0 disables)",
                        (0.0, 100.0, "Beta(a, a)'s parameter; at 100 every mix is already within a few % of half "
                                     "and half"))
    val_fraction: float | None = _auto("share of works (groups) or contents held out for validation (they "
                                            "do not train); auto: 10 % when that is 60 clips or more (enough to "
                                            "measure and to choose stats_weight), else none: every clip trains "
                                            "(judge such a corpus with specstore-cv)",
                                      (0.0, 1.0, "a share of the works"), kind=float, high_open=True,
                                      parse=_optional_float, metavar="FRACTION|auto")
    val_offset: float = _opt(0.0, "start of the held-out interval of split scores (cross-validation folds hold out "
                                  "[k/K, (k+1)/K); 0 for a plain validation split)",
                             (0.0, 1.0, "a split score"), high_open=True)
    val_every: int | None = _auto("validate every this many epochs, and after the last; auto: every epoch with "
                                       "select=best (it chooses), else every third of the schedule (validation "
                                       "then only reports, and a pass over the held-out clips costs many "
                                       "training steps)", (1, 10_000, "epochs, as many as a run may have"),
                                  kind=int, parse=_optional_count, metavar="N|auto")
    select: str = _opt("last", "which weights are saved: last (the end of the schedule: validation only reports) or "
                               "best (the epoch with the best validation accuracy, then loss: noisy on few "
                               "validation clips)", choices=SELECTS)
    seed: int = _opt(0, "split and training seed (every random draw derives from it)",
                     (0, MAX_SEED, "scikit-learn's random_state, the statistics head's, takes at most 2**32 - 1"))
    arch: str = _opt("cnn", "model: cnn, resnet, or an import path package.module:Class of any nn.Module with "
                            "forward(x, lengths) (see infer/models/contract.py)", metavar="ARCH")
    backbone: str | None = _auto("a shipped model (e.g. musicnn-msd, musicnn-mtt) whose clip embeddings a "
                                 "transfer head learns from (its feature must be in the store), or none (the model "
                                 "trains from scratch); auto: musicnn-msd with --arch musicnn; with a built-in arch "
                                 "(cnn, resnet), chosen by grouped cross-validation on the training clips when the "
                                 "store holds a shipped backbone's feature, else none (infer/train/choice.py)",
                                 parse=_optional_name, metavar="NAME|none|auto")
    finetune: int = _opt(0, "with a backbone: also train its top N layers (SGD through the backbone, no embedding "
                            "cache); 0: a head on the frozen backbone, fitted in seconds on cached clip embeddings",
                         (0, 256, "layers from the backbone's top; a shipped backbone has a few dozen, and more "
                                  "than it has is refused once it is loaded"), metavar="LAYERS")
    model_args: dict[str, Any] | None = _opt(None, "keyword arguments (a JSON object) for an import-path model; "
                                                   "n_bins/n_classes/input_mean/input_std are filled in when its "
                                                   "constructor takes them", parse=_json_object, metavar="JSON")
    width: int = _of(ModelConfig, "width")
    depth: int = _of(ModelConfig, "depth")
    dropout: float = _of(ModelConfig, "dropout")
    pooling: str = _of(ModelConfig, "pooling")
    freq_pooling: str = _of(ModelConfig, "freq_pooling")
    stem_freq_kernel: int = _of(ModelConfig, "stem_freq_kernel")
    input_time_pool: int = _of(ModelConfig, "input_time_pool")
    normalization: str = _opt("bin", "input normalisation fitted on training frames (built-in models): global "
                                        "(one mean and std) or bin (per frequency bin)",
                              choices=NORMALIZATIONS)
    pool_seconds: float | None = _auto("classify a clip window by window, each this many seconds long (from "
                                            "its start), averaging the windows' logits (built-in models); 0 = pool "
                                            "the whole clip at once; auto: the training crop's length (so a long "
                                            "clip is judged as training saw it)",
                                      (0.0, 3600.0, "seconds; an hour's window is the whole of any music clip (0 "
                                                    "says so)"), kind=float, parse=_optional_float,
                                      metavar="SECONDS|auto")
    stats_head: bool | None = _auto("a statistics head beside the CNN (built-in models): a logistic "
                                         "regression on each clip's per-bin mean, std and frame-to-frame change, "
                                         "fitted before the CNN trains (its strength chosen by grouped "
                                         "cross-validation on the training clips); the model's output adds its "
                                         "logits to the CNN's; auto: on for the built-in models")
    stats_weight: float | None = _auto("weight of the statistics head's logits in the model's output; auto: "
                                            "the least log-loss on the validation split when it holds 60 clips or "
                                            "more, else 1",
                                      (0.0, field_limit(ModelConfig, "stats_weight").upper, "a weight on logits, as "
                                       "the model's"), kind=float, parse=_optional_float, metavar="W|auto")
    grad_checkpoint: bool = _opt(False, "gradient checkpointing: recompute activations in backward, so the "
                                        "memory budget packs larger batches (slower steps)")
    feature: str | None = _opt(None, "feature to train on: one the store holds, or several joined by '+' "
                                     "(stacked frame by frame, e.g. mel+cqt); default: every feature the store "
                                     "holds, stacked", metavar="NAME")
    run: RunOptions = dataclasses.field(default_factory=_recipe_run)

    def __post_init__(self) -> None:
        self._check_recipe()
        self._check_run()
        try:
            self.model  # noqa: B018  (built, and so checked, once: the fields it takes from here)
        except TrainError:
            raise
        except ConfigError as e:
            raise TrainError(str(e)) from None

    @cached_property
    def model(self) -> ModelConfig | None:
        """The built-in model this recipe trains (None for an import-path ``arch``, which ``model_args``
        configures and whose own business its fields are).

        Its data fields (``n_bins``, ``n_classes``, ``bin_mean``/``bin_std``) keep :class:`ModelConfig`'s
        defaults here: training fills them from the store (:func:`~specstore.infer.train.prepare.model_spec_for`), as
        it turns ``pool_seconds`` into ``pool_window`` frames; a given ``stats_head``/``stats_weight`` is
        checked here, an auto one set by the recipe."""
        if self.arch not in ARCHS:
            return None
        auto: dict[str, Any] = {k: v for k, v in (("stats_head", self.stats_head),
                                                   ("stats_weight", self.stats_weight)) if v is not None}
        return ModelConfig(arch=self.arch, **_taken(self, ModelConfig), **auto)

    def _check_run(self) -> None:
        """The run options hold only what a recipe records (:data:`RUN_RECORDED`; a run resumes with other values
        of :data:`RUNTIME_FIELDS`): the others must keep their defaults (threads and the GPU margin are
        :func:`~specstore.infer.train.train`'s arguments), and progress bars are off (the command's)."""
        if not isinstance(self.run, RunOptions):
            raise TrainError(f"run must be RunOptions, not {type(self.run).__name__}")
        plain = RunOptions()
        kept = [f.name for f in dataclasses.fields(RunOptions)
                if f.name not in (*RUN_RECORDED, "progress") and getattr(self.run, f.name) != getattr(plain, f.name)]
        if kept:
            raise TrainError(f"a training config records no {', '.join(kept)} (the command's, not the recipe's)")
        if self.run.progress:
            object.__setattr__(self, "run", dataclasses.replace(self.run, progress=False))

    def _check_recipe(self) -> None:
        """The recipe's own fields: each number against its bound (the model's and the run's fields are checked
        by the :class:`ModelConfig` and :class:`RunOptions` this config holds: a user model's width is its own
        business), then what the bounds do not say."""
        for f in dataclasses.fields(self):
            limit: Limit | None = f.metadata.get("limit")
            if limit is not None and "of" not in f.metadata:
                limit.check(f.name, getattr(self, f.name), TrainError)
        if self.normalization not in NORMALIZATIONS:
            raise TrainError(f"normalization must be global or bin, not {self.normalization!r}")
        if self.val_offset + (self.val_fraction or 0.0) > 1 + 1e-12:
            raise TrainError(f"val_offset must be in [0, 1 - val_fraction], got {self.val_offset!r}")
        if self.select not in SELECTS:
            raise TrainError(f"select must be best or last, not {self.select!r}")
        if self.arch not in ARCHS and ":" not in self.arch:
            raise TrainError(f"arch must be one of {', '.join(ARCHS)} or an import path package.module:Class, "
                             f"not {self.arch!r}")
        if self.model_args is not None and self.arch in ARCHS:
            raise TrainError("model_args is for import-path models; the built-ins take width, depth, dropout, "
                             "pooling")

    def to_dict(self) -> dict[str, Any]:
        """Every field, flat: the model's and the recorded run settings (:data:`RUN_RECORDED`) beside the
        recipe's, in the order ``--config`` files, ``MODEL.config.json`` and resume keys have always held
        them (:data:`RUN_PLACES`)."""
        own = dataclasses.asdict(self)
        del own["run"]
        flat: dict[str, Any] = {}
        for name, value in own.items():
            flat[name] = value
            flat.update((r, getattr(self.run, r)) for r in RUN_PLACES.get(name, ()))
        return flat

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        """The config of ``data``: any subset of the flat fields :meth:`to_dict` writes (the recorded run
        settings among them); the rest keep their defaults."""
        if "run" in data:
            raise TrainError("unknown training config field(s): run (its settings are flat: device, max_batch, ...)")
        own = {k: v for k, v in data.items() if k not in RUN_RECORDED}
        try:
            run = _recipe_run(**{k: v for k, v in data.items() if k in RUN_RECORDED})
        except ConfigError as e:
            raise TrainError(str(e)) from None
        except TypeError as e:
            raise TrainError(f"bad training config: {e}") from None
        return from_record(cls, {**own, "run": run}, "training config", TrainError)

    @classmethod
    def from_file(cls, path: str | Path) -> TrainConfig:
        """Read a ``.toml`` or ``.json`` file of config fields (a ``[train]`` table is accepted in TOML, and a
        run's ``MODEL.config.json``, whose ``train_config`` holds them).

        An ``arch`` import path read here is code a file names: training builds it only when trusted
        (:mod:`specstore.infer.models.trust`)."""
        p = Path(path)
        try:
            text = p.read_text(encoding="utf-8")
        except OSError as e:
            raise TrainError(f"cannot read the config file {p}: {e.strerror or e}") from None
        try:
            if p.suffix.lower() == ".toml":
                data: Any = tomllib.loads(text)
                data = data.get("train", data)
            elif p.suffix.lower() == ".json":
                data = json.loads(text)
                if isinstance(data, dict) and isinstance(data.get("train_config"), dict):
                    data = data["train_config"]
            else:
                raise TrainError(f"config file {p} must be .toml or .json")
        except (tomllib.TOMLDecodeError, json.JSONDecodeError) as e:
            raise TrainError(f"config file {p} is not valid {p.suffix[1:].upper()}: {e}") from None
        if not isinstance(data, dict):
            raise TrainError(f"config file {p} must hold a table of training options")
        return cls.from_dict(data)

    def resume_key(self) -> dict[str, Any]:
        """The fields a resumed run must share with the interrupted one."""
        return {k: v for k, v in self.to_dict().items() if k not in RUNTIME_FIELDS}


AUTO_FIELDS = tuple(f.name for f in dataclasses.fields(TrainConfig) if f.metadata.get("shown") == "auto")
"""Fields whose default (None) is auto: derived from the training data by :mod:`specstore.infer.train.recipe`."""


def _taken(config: TrainConfig, cls: type) -> dict[str, Any]:
    """The fields of ``config`` that are fields of ``cls`` (:func:`_of`), by name."""
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.metadata.get("of") == cls.__name__}


def model_options(config: TrainConfig) -> tuple[str, ...]:
    """The names of the :class:`ModelConfig` fields a recipe sets (the rest keep :class:`ModelConfig`'s
    defaults, the data's are filled from the store)."""
    return tuple(_taken(config, ModelConfig))


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """One option per :class:`TrainConfig` field and recorded run setting (:data:`RUN_RECORDED`, from
    :class:`RunOptions`' fields), in the record's order (:func:`specstore.common.options.add_options`); an
    option not given is absent from the parsed namespace, so a config file or the defaults fill it."""
    for f in option_fields(TrainConfig):
        add_options(parser, TrainConfig, [f.name])
        for name in RUN_PLACES.get(f.name, ()):  # one at a time: the record's order, not RunOptions'
            add_options(parser, RunOptions, [name])


def config_from_args(args: argparse.Namespace, base: TrainConfig | None = None) -> TrainConfig:
    """``base`` (or the defaults) with every option given on the command line applied."""
    return TrainConfig.from_dict({**(base or TrainConfig()).to_dict(), **given(args, TrainConfig),
                                  **given(args, RunOptions, RUN_RECORDED)})

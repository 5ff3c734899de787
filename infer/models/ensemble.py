"""The sum of models: several trained models reading parts of one input, their probabilities averaged.

:class:`SumClassifier` is what the default recipe saves when it chooses the sum of the from-scratch CNN and a
head on a pretrained backbone (:mod:`specstore.infer.train.ensemble`).  Each member reads its own rows of the input
(its feature's bins: the CNN ``mel+cqt``, the head ``musicnn``, all on one frame grid in one store), its logits
are divided by its own temperature (fitted on the validation clips when it trained), and the sum's logits are
``log(mean of the members' softmax probabilities)``: a softmax of them gives the averaged probabilities.

A member is rebuilt from its :class:`~specstore.infer.models.contract.ModelSpec` with no trust granted, so only the
built-in architectures and the shipped model classes (:data:`specstore.infer.models.trust.SHIPPED_MODELS`: the transfer
head, musicnn) can be members of a saved sum; a checkpoint naming other code as a member is refused as any untrusted
import path is. A sum has 2 to :data:`MAX_MEMBERS` members, none of them a sum, and their parameters together, counted
from their specs before the first member is built (:meth:`SumClassifier.count_parameters`), are held to the one bound on
a model's size (:data:`~specstore.infer.models.MAX_PARAMETERS`), as are their temperatures to
:data:`~specstore.infer.models.calibration.TEMPERATURE_LIMIT`.

The model contract (:mod:`specstore.infer.models.contract`) holds for the sum when it holds for every member: it masks
padding when each member does (so each pads its own input to its own stride, and the sum's time stride is
the members' largest, which the engine pads batches to and probes the cost with); its receptive field is the
largest.  A clip too long for any batch windows exactly (``pooled_sum``/``classify``) when every member does
and their window alignments divide one another (the windows then start on the largest); otherwise (musicnn's
187-frame patches beside a CNN's 640-frame pooling windows: a common multiple of half an hour) its windows'
logits are averaged, as for any masked model without ``pooled_sum``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from specstore.common import ConfigError
from specstore.infer.models.config import ModelConfig, check_parameter_count

if TYPE_CHECKING:
    from specstore.infer.models.contract import ModelSpec

__all__ = ["MAX_MEMBERS", "SUM_TARGET", "SumClassifier", "average_probabilities"]


def average_probabilities(logits: list[Tensor], temperatures: list[float] | Tensor) -> Tensor:
    """``log(mean_i softmax(logits_i / T_i))``, ``(B, n_classes)`` float32: logits whose softmax is the members'
    averaged probabilities (what :class:`SumClassifier` returns, computed from its members' logits)."""
    logp = torch.stack([torch.log_softmax(z.float() / t, dim=1) for z, t in zip(logits, temperatures, strict=True)])
    return torch.logsumexp(logp, dim=0) - math.log(len(logits))


MAX_MEMBERS = 16
"""Most members a sum may have: the recipe's has two (the CNN and the head); every member is a model of its own."""
SUM_TARGET = "specstore.infer.models.ensemble:SumClassifier"
"""The import path a checkpoint names a sum by."""


def _read_members(members: Any, n_bins: Any) -> tuple[list[ModelSpec], list[tuple[int, int]], list[float]]:
    """The members' specs, input rows and temperatures, checked (one line each) before anything is built: two to
    :data:`MAX_MEMBERS` members, rows within ``n_bins``, temperatures within
    :data:`~specstore.infer.models.calibration.TEMPERATURE_LIMIT`, no sum as a member."""
    from specstore.infer.models.calibration import TEMPERATURE_LIMIT
    from specstore.infer.models.contract import ModelSpec

    ModelConfig.check_field("n_bins", n_bins, ConfigError)
    if not isinstance(members, list) or not 2 <= len(members) <= MAX_MEMBERS:
        count = len(members) if isinstance(members, list) else repr(members)[:40]
        raise ConfigError(f"a sum of models needs at least two members and at most {MAX_MEMBERS}, got {count}")
    specs, rows, temperatures = [], [], []
    for i, m in enumerate(members):
        try:
            start, stop = (int(v) for v in m["rows"])
            temperature = m.get("temperature", 1.0)
            spec = ModelSpec.from_dict(m["model"])
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ConfigError(f"member {i} of the sum is unreadable ({type(e).__name__}: {e})") from None
        if not 0 <= start < stop <= n_bins:
            raise ConfigError(f"member {i} reads rows [{start}, {stop}) of a {n_bins}-row input")
        TEMPERATURE_LIMIT.check(f"member {i}'s temperature", temperature)
        if spec.target == SUM_TARGET:
            raise ConfigError(f"member {i} is itself a sum of models; a sum's members are single models")
        specs.append(spec)
        rows.append((start, stop))
        temperatures.append(float(temperature))
    return specs, rows, temperatures


class SumClassifier(nn.Module):
    """Averaged probabilities of ``members``: ``[{"model": ModelSpec dict, "rows": [start, stop],
    "temperature": T}, ...]`` (input rows ``[start, stop)`` of ``n_bins``; ``T`` in [0.01, 100] divides the
    member's logits).
    """

    def __init__(self, members: list[dict[str, Any]], n_classes: int, n_bins: int) -> None:
        from specstore.infer.models.contract import exact_windows, masks_padding, time_stride, window_align

        specs, rows, temperatures = _read_members(members, n_bins)
        ModelConfig.check_field("n_classes", n_classes, ConfigError)
        check_parameter_count(self.count_parameters(members, n_classes, n_bins),
                              f"a sum of {len(specs)} models (its members together)")
        super().__init__()
        self.rows: list[tuple[int, int]] = rows
        self.n_bins = n_bins
        """Rows of the input (every member's rows lie within)."""
        self.members = nn.ModuleList()
        for i, spec in enumerate(specs):
            model = spec.build(False, source=f"member {i} of a sum of models")
            if not masks_padding(model):
                raise ConfigError(f"member {i} ({spec.target}) does not mask padding; a sum needs members that do")
            self.members.append(model)
        self.temperature: Tensor
        self.register_buffer("temperature", torch.tensor(temperatures, dtype=torch.float32), persistent=False)
        self.init_kwargs: dict[str, Any] = {"members": [dict(m) for m in members], "n_classes": n_classes,
                                            "n_bins": n_bins}
        self.time_stride = max(time_stride(m) for m in self.members)
        aligns = [window_align(m) for m in self.members]
        self.window_align = max(aligns)
        self.receptive_field = max(int(getattr(m, "receptive_field", 1)) for m in self.members)
        self._widths: tuple[int, ...] | None = None
        if all(exact_windows(m) for m in self.members) and math.lcm(*aligns) == self.window_align:
            self.pooled_sum = self._pooled_sum
            self.classify = self._classify

    @classmethod
    def count_parameters(cls, members: list[dict[str, Any]], n_classes: int, n_bins: int) -> int:
        """The members' parameters together, each counted from its spec before any member is built
        (:func:`~specstore.infer.models.counts.spec_parameters`): what the bound on a model's size holds a sum to."""
        from .counts import spec_parameters

        specs, _, _ = _read_members(members, n_bins)
        return sum(spec_parameters(spec, source=f"member {i} of a sum of models") for i, spec in enumerate(specs))

    def _parts(self, x: Tensor) -> list[Tensor]:
        return [x[:, :, a:b] for a, b in self.rows]

    def combine(self, logits: list[Tensor]) -> Tensor:
        """The members' ``logits`` combined after their temperatures (:func:`average_probabilities`)."""
        return average_probabilities(logits, self.temperature)

    def member_logits(self, x: Tensor, lengths: Tensor | Any) -> list[Tensor]:
        """Each member's own logits ``(B, n_classes)`` (before its temperature)."""
        return [m(part, lengths) for m, part in zip(self.members, self._parts(x), strict=True)]

    def forward(self, x: Tensor, lengths: Tensor | Any) -> Tensor:
        """Logits ``(B, n_classes)``: log of the members' averaged probabilities."""
        return self.combine(self.member_logits(x, lengths))

    def _pooled_sum(self, x: Tensor, lengths: Tensor | Any, pool_start: Tensor | None = None,
                    pool_stop: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """``pooled_sum`` (:mod:`specstore.infer.engine.windows`): every member's sums side by side, then their counts
        as columns (summed over windows like the sums); the count returned is the first member's."""
        sums, counts = [], []
        for m, part in zip(self.members, self._parts(x), strict=True):
            fn: Any = m.pooled_sum  # present on every member (checked when the sum was built)
            s, c = fn(part, lengths, pool_start, pool_stop)
            sums.append(s.float())
            counts.append(c.float())
        self._widths = tuple(int(s.shape[1]) for s in sums)
        return torch.cat([*sums, torch.stack(counts, dim=1)], dim=1), counts[0]

    def _classify(self, sums: Tensor, counts: Tensor) -> Tensor:
        """``classify``: each member's logits from its own summed sums and counts, combined as :meth:`forward`."""
        if self._widths is None or sums.shape[1] != sum(self._widths) + len(self._widths):
            raise ValueError("classify() reads the sums of this model's pooled_sum(); call that first")
        logits, at = [], 0
        own = sums[:, sum(self._widths):]
        for i, (m, w) in enumerate(zip(self.members, self._widths, strict=True)):
            classify: Any = m.classify
            logits.append(classify(sums[:, at:at + w], own[:, i]))
            at += w
        return self.combine(logits)

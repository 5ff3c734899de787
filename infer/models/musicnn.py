"""musicnn in PyTorch: the pretrained music tagger of Pons & Serra (MTG, UPF 2019), ported from its checkpoint.

Written from the TF1 checkpoint's tensor names and shapes (``tools/musicnn_convert.py``
reads them; :mod:`specstore.infer.models.pretrained` loads the converted tensors).  One 3 s *patch*
(187 frames of the ``musicnn`` feature: 16 kHz, n_fft 512, hop 256, 96 mel bands,
``log10(1 + 10000 * power)``) goes through:

* front end: batch norm of the input, then two *timbral* blocks (vertical
  convolutions 7 frames x 38 / 67 mel bands, 204 filters each) and three *temporal*
  blocks (horizontal convolutions 128 / 64 / 32 frames x 1 band, 51 filters each);
  each block is conv, ReLU, batch norm, max over the frequency axis: 561 channels
  per frame;
* mid end: three 1-D convolutions over time (7 frames, 64 filters, ReLU, batch
  norm), the second and third with residual connections; the front end's 561 and
  the three 64-wide outputs are concatenated: 753 channels per frame;
* back end: max and mean over the patch's 187 frames (the 753-wide pooled layers),
  interleaved (1506), batch norm, dense 200 + ReLU + batch norm (the *penultimate*
  layer, the clip embedding), dense to 50 tag logits.

A clip ``(B, 1, 96, T)`` with ``lengths`` is cut into 187-frame patches from frame 0,
as the original extractor does.  Unlike the original, which drops a trailing partial
patch (and so gives nothing for a clip under 3 s), the partial patch is zero-padded
to 187 frames (zero is silence in this feature) and every patch is weighted by its
real frames when patches are averaged: clip tag probabilities are the weighted mean
of the patches' sigmoid outputs, the clip embedding the weighted mean of their
penultimate layers.  Each patch is computed on its own frames only, so a clip's
outputs in a padded batch equal its outputs alone: the batch's patches past a
clip's end are computed, as any model computes its padding, and weigh 0.  No
shape depends on the values of ``lengths``, so the model traces and exports.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from specstore.common import ConfigError
from specstore.infer.models.config import ModelConfig, check_parameter_count

from .sizes import MUSICNN_BACKBONE_PARAMETERS

__all__ = ["EMBEDDING_DIM", "N_MELS", "PATCH_FRAMES", "MusiCNN", "build_musicnn"]

PATCH_FRAMES = 187
"""Frames per patch: 3 s at 16 kHz / hop 256 (``librosa.time_to_frames(3, ...) + 1``, as the original)."""
N_MELS = 96
"""Mel bands of the input."""
EMBEDDING_DIM = 200
"""Width of the penultimate layer (the clip embedding)."""
BN_EPS = 1e-3
"""``tf.compat.v1.layers.batch_normalization``'s epsilon."""
_TIMBRAL = ((7, 38), (7, 67))  # (frames, mel bands): int(0.4 * 96), int(0.7 * 96)
_TEMPORAL = (128, 64, 32)  # frames
_FRONT_FILTERS = (204, 51)  # int(1.6 * 128), int(1.6 * 32)
_MID_FILTERS = 64


def _same_pad(kernel: int) -> tuple[int, int]:
    """TensorFlow's 'same' padding for a stride-1 kernel: the odd extra frame goes after."""
    return (kernel - 1) // 2, kernel - 1 - (kernel - 1) // 2


class _FrontBlock(nn.Module):
    """Conv over (time, mel), ReLU, batch norm, max over the mel axis: ``(N, 1, T, 96) -> (N, C, T)``."""

    def __init__(self, filters: int, frames: int, bands: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, filters, (frames, bands))
        self.bn = nn.BatchNorm2d(filters, eps=BN_EPS)
        self.pad = (0, 0, *_same_pad(frames))  # time padded 'same', mel 'valid'

    def forward(self, x: Tensor) -> Tensor:
        y = self.bn(F.relu(self.conv(F.pad(x, self.pad))))
        return y.amax(dim=3)


class _MidBlock(nn.Module):
    """1-D conv over time (7 frames, 'same'), ReLU, batch norm: ``(N, C, T) -> (N, 64, T)``."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv1d(channels, _MID_FILTERS, 7, padding=3)
        self.bn = nn.BatchNorm1d(_MID_FILTERS, eps=BN_EPS)

    def forward(self, x: Tensor) -> Tensor:
        return self.bn(F.relu(self.conv(x)))


class MusiCNN(nn.Module):
    """The musicnn tagger (``MSD_musicnn`` / ``MTT_musicnn`` layout) with patch cutting and weighted averaging.

    ``forward(x, lengths)``: ``x`` ``(B, 1, 96, T)`` musicnn features (zero
    beyond each clip's length), ``lengths`` ``(B,)`` real frames -> ``(B,
    n_classes)`` logits of the clip's tag probabilities (``torch.logit`` of
    :meth:`tags`, so ``sigmoid(forward) == tags``).  :meth:`embed`: ``(B, 200)``
    clip embeddings.  :meth:`patch_layers`: the original's per-patch outputs.
    """

    time_stride = PATCH_FRAMES
    """Batches are padded to whole patches."""
    masks_padding = True
    embedding_dim = EMBEDDING_DIM
    """Width of :meth:`embed`'s output."""
    n_bins = N_MELS

    def __init__(self, n_classes: int = 50) -> None:
        check_parameter_count(self.count_parameters(n_classes), f"musicnn with {n_classes} outputs")
        super().__init__()
        self.n_classes = n_classes
        self.input_bn = nn.BatchNorm2d(1, eps=BN_EPS)
        self.timbral = nn.ModuleList(_FrontBlock(_FRONT_FILTERS[0], t, f) for t, f in _TIMBRAL)
        self.temporal = nn.ModuleList(_FrontBlock(_FRONT_FILTERS[1], t, 1) for t in _TEMPORAL)
        front = len(_TIMBRAL) * _FRONT_FILTERS[0] + len(_TEMPORAL) * _FRONT_FILTERS[1]  # 561
        self.mid = nn.ModuleList([_MidBlock(front), _MidBlock(_MID_FILTERS), _MidBlock(_MID_FILTERS)])
        self.pooled_width = front + 3 * _MID_FILTERS  # 753
        self.pool_bn = nn.BatchNorm1d(2 * self.pooled_width, eps=BN_EPS)
        self.dense = nn.Linear(2 * self.pooled_width, EMBEDDING_DIM)
        self.dense_bn = nn.BatchNorm1d(EMBEDDING_DIM, eps=BN_EPS)
        self.out = nn.Linear(EMBEDDING_DIM, n_classes)

    @classmethod
    def count_parameters(cls, n_classes: int = 50) -> int:
        """Trainable parameters of ``MusiCNN(n_classes)``, from ``n_classes`` alone (checked against
        :class:`~specstore.infer.models.ModelConfig`'s bound on it) before anything is built."""
        ModelConfig.check_field("n_classes", n_classes)
        return MUSICNN_BACKBONE_PARAMETERS + (EMBEDDING_DIM + 1) * n_classes

    def patch_layers(self, patches: Tensor) -> dict[str, Tensor]:
        """The original graph on ``(N, 187, 96)`` patches (time, mel): ``logits`` ``(N, n_classes)``,
        ``penultimate`` ``(N, 200)``, ``mean_pool`` and ``max_pool`` ``(N, 753)``."""
        x = self.input_bn(patches.unsqueeze(1))  # (N, 1, T, 96)
        front = torch.cat([b(x) for b in (*self.timbral, *self.temporal)], dim=1)  # (N, 561, T)
        h1 = self.mid[0](front)
        h2 = self.mid[1](h1) + h1
        h3 = self.mid[2](h2) + h2
        feats = torch.cat([front, h1, h2, h3], dim=1)  # (N, 753, T)
        max_pool, mean_pool = feats.amax(dim=2), feats.mean(dim=2)
        flat = torch.stack([max_pool, mean_pool], dim=2).flatten(1)  # TF's (753, 2) flattened: max, mean
        penultimate = self.dense_bn(F.relu(self.dense(self.pool_bn(flat))))
        return {"logits": self.out(penultimate), "penultimate": penultimate, "mean_pool": mean_pool,
                "max_pool": max_pool}

    def patches(self, x: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """A clip's own patches only, as the original cuts them (:meth:`patch_grid` less the patches past each
        clip's end): ``(N, 187, 96)`` patches, the clip index ``(N,)`` and the real frames ``(N,)`` of each; a
        clip of 0 frames gives one silent patch (weight 1)."""
        grid, real = self.patch_grid(x, lengths)
        keep = real.flatten() > 0
        clip = torch.arange(real.shape[0], device=real.device)[:, None].expand_as(real).flatten()
        return grid[keep], clip[keep], real.flatten()[keep]

    def patch_grid(self, x: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        """Every clip cut into the batch's number of patches, ``P = ceil(T / 187)``: ``(B * P, 187, 96)`` patches
        (frames past a clip's length zero) and their weights ``(B, P)``, the real frames of each (0 for a patch
        past the clip's end; a clip of 0 frames weighs its first, silent patch 1).

        Unlike :meth:`patches` no shape depends on the lengths' values, so the graph traces and exports
        (``specstore export``) for any batch and length; the patches past a clip's end are computed and given
        weight 0, as any model computes the padding of a batch (the planner charges the padded frames).
        """
        if x.dim() != 4 or x.shape[1] != 1 or x.shape[2] != N_MELS:
            raise ConfigError(f"musicnn takes (B, 1, {N_MELS}, T) musicnn features, not {tuple(x.shape)}")
        lengths = lengths.to(device=x.device, dtype=torch.long)
        def cut(t: Tensor) -> Tensor:  # (B, C, T) -> (B, C, P, 187), the last patch zero-padded
            return F.pad(t, (0, PATCH_FRAMES - 1)).unfold(2, PATCH_FRAMES, PATCH_FRAMES)

        grid = cut(x[:, 0])  # (B, 96, P, 187)
        frames = cut(torch.ones_like(x[:1, 0, :1]))[0, 0] > 0  # (P, 187): cells holding one of the T frames
        index = frames.long().flatten().cumsum(0).reshape(frames.shape) - 1  # each cell's frame index
        inside = (index[None] < lengths[:, None, None]) & frames[None]  # (B, P, 187): a clip's real frames
        real = inside.sum(dim=2)  # (B, P)
        grid = grid * inside[:, None].to(grid.dtype)
        real[:, 0] = real[:, 0].clamp(min=1)  # a clip of 0 frames: its first patch (silence) stands for it
        return grid.permute(0, 2, 3, 1).reshape(-1, PATCH_FRAMES, N_MELS), real

    def clip_outputs(self, x: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        """``(tags, embedding)``: per clip, the frame-weighted means of the patches' sigmoid outputs
        ``(B, n_classes)`` and penultimate layers ``(B, 200)`` (:meth:`patch_grid`)."""
        scores, embedding, counts = self._owned_sums(x, lengths, None, None)
        return scores / counts[:, None], embedding / counts[:, None]

    receptive_field = 0
    """Frames of context a patch's outputs need beyond the patch itself: none (windows of a long clip are cut
    on patch boundaries, :mod:`specstore.infer.engine.windows`, so they need no overlap)."""

    def _owned_sums(self, x: Tensor, lengths: Tensor, pool_start: Tensor | None,
                    pool_stop: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
        """``(score sums (B, n_classes), embedding sums (B, 200), counts (B,))`` over the patches that start in
        ``[pool_start, pool_stop)`` (frames; default: all), each patch weighted by its real frames."""
        patches, real = self.patch_grid(x, lengths)
        out = self.patch_layers(patches)
        start = (torch.ones_like(real[0]).cumsum(0) - 1) * PATCH_FRAMES  # (P,) first frame of each patch
        owned = torch.ones_like(real, dtype=torch.bool)
        if pool_start is not None:
            owned &= start[None] >= pool_start.to(start.device)[:, None]
        if pool_stop is not None:
            owned &= start[None] < pool_stop.to(start.device)[:, None]
        w = (real * owned).to(patches.dtype)

        def summed(values: Tensor) -> Tensor:
            return (values.reshape(*real.shape, -1) * w[..., None]).sum(dim=1)

        return summed(torch.sigmoid(out["logits"])), summed(out["penultimate"]), w.sum(dim=1)

    def pooled_sum(self, x: Tensor, lengths: Tensor, pool_start: Tensor | None = None,
                   pool_stop: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """``(sums (B, n_classes), counts (B,))``: the patches' sigmoid outputs times their real frames, summed
        over the patches that start in ``[pool_start, pool_stop)`` (frames; default: all), and those frames.
        Summed over the windows of a clip too long for any batch (cut on patch boundaries), :meth:`classify`
        gives exactly the whole clip's logits (:func:`specstore.infer.engine.windows.run_windowed`)."""
        scores, _, counts = self._owned_sums(x, lengths, pool_start, pool_stop)
        return scores, counts

    def embedding_sum(self, x: Tensor, lengths: Tensor, pool_start: Tensor | None = None,
                      pool_stop: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """As :meth:`pooled_sum`, for the penultimate layer: summed over windows and divided by the counts, the
        whole clip's :meth:`embed` (a head on this backbone windows exactly too)."""
        _, embedding, counts = self._owned_sums(x, lengths, pool_start, pool_stop)
        return embedding, counts

    def classify(self, sums: Tensor, counts: Tensor) -> Tensor:
        """Logits ``(B, n_classes)`` of :meth:`pooled_sum`'s sums and counts (summed over windows)."""
        return torch.logit(sums / counts[:, None], eps=1e-7)

    def tags(self, x: Tensor, lengths: Tensor) -> Tensor:
        """Tag probabilities ``(B, n_classes)``: independent sigmoid scores averaged over patches."""
        return self.clip_outputs(x, lengths)[0]

    def embed(self, x: Tensor, lengths: Tensor) -> Tensor:
        """Clip embeddings ``(B, 200)``: the penultimate layer averaged over patches, weighted by real frames."""
        return self.clip_outputs(x, lengths)[1]

    def forward(self, x: Tensor, lengths: Tensor) -> Tensor:
        """Logits ``(B, n_classes)`` whose sigmoid is :meth:`tags` (``torch.logit`` with eps 1e-7)."""
        return torch.logit(self.tags(x, lengths), eps=1e-7)


def build_musicnn(config: ModelConfig) -> MusiCNN:
    """A musicnn with ``config.n_classes`` outputs (fresh weights;
    :func:`specstore.infer.models.pretrained.load_musicnn` loads the shipped ones); the config must have 96 bins."""
    if config.n_bins != N_MELS:
        raise ConfigError(f"musicnn reads {N_MELS} mel bands (the musicnn feature), not {config.n_bins}")
    return MusiCNN(config.n_classes)

"""Models a user might write, kept here to prove the model contract (infer/models/contract.py) with code we do not own.

* :class:`TinyUserNet`: masks its padding (a strided masked conv, then a masked mean), has ``time_stride`` 2,
  takes ``n_bins`` and ``n_classes`` from the store;
* :class:`PoolsOverPadding`: ignores ``lengths`` (a plain mean over all frames), says ``masks_padding = False``
  and runs on equal windows of ``window_frames``.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class TinyUserNet(nn.Module):
    time_stride = 2

    def __init__(self, n_bins: int, n_classes: int, width: int = 8, input_mean: float = -40.0,
                 input_std: float = 20.0) -> None:
        super().__init__()
        self.mean, self.std = input_mean, input_std
        self.conv = nn.Conv2d(1, width, (n_bins, 3), stride=(1, 2), padding=(0, 1))
        self.head = nn.Linear(width, n_classes)

    def forward(self, x: Tensor, lengths: Tensor) -> Tensor:
        steps = torch.arange(x.shape[-1], device=x.device)[None, :]
        x = ((x - self.mean) / self.std) * (steps < lengths[:, None]).to(x.dtype)[:, None, None, :]
        h = torch.relu(self.conv(x))[:, :, 0, :]  # (B, C, T/2)
        out_len = (lengths + 1) // 2
        keep = (torch.arange(h.shape[-1], device=x.device)[None, :] < out_len[:, None]).to(h.dtype)
        pooled = (h * keep[:, None, :]).sum(-1) / out_len[:, None].to(h.dtype)
        return self.head(pooled)


class PoolsOverPadding(nn.Module):
    masks_padding = False
    window_frames = 32

    def __init__(self, n_bins: int, n_classes: int) -> None:
        super().__init__()
        self.proj = nn.Linear(n_bins, n_classes)

    def forward(self, x: Tensor, lengths: Tensor) -> Tensor:
        return self.proj((x[:, 0] / 40.0).mean(dim=-1))  # every frame, padding included

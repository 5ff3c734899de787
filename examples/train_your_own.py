"""Train your own PyTorch model on a specstore store: the plain loop, with the three data imports.

    . .venv/bin/activate      # once per shell, after make install (the README's set-up)
    python examples/train_your_own.py data/demo.zarr --epochs 5 --out models/mine.pt

What it does (every step is ordinary PyTorch; specstore supplies the data pieces):

1. splits the store's labelled clips into training and held-out rows (a seeded shuffle);
2. ``StoreDataset`` + ``BudgetBatchSampler(..., shuffle=True)`` + ``PadCollate`` in a
   ``torch.utils.data.DataLoader``: length-binned batches of whole clips (or random crops)
   that never exceed ``--budget-mb`` for *this* model (its bytes per padded clip-frame are
   measured by ``measure_cost_per_frame``);
3. trains :class:`GenreNet` (a model defined here: ``forward(x, lengths) -> logits``) with
   AdamW for ``--epochs`` epochs, calling ``sampler.set_epoch(epoch)`` so every epoch gets new
   batches (and new crops);
4. evaluates on the whole held-out clips (sorted, unshuffled batches under the inference budget);
5. saves a specstore checkpoint (``Checkpoint.from_model(..., model_spec=ModelSpec(...))`` and
   ``save_checkpoint``): the model is recorded by import path and JSON arguments, never pickled;
6. runs ``specstore.infer.engine.predict`` on that checkpoint, as ``make infer`` would, and checks that its
   probabilities for the held-out clips are the ones step 4 computed.

The checkpoint names the model ``train_your_own:GenreNet``, so ``make infer``/``specstore.infer.engine.predict``
can rebuild it wherever this file's folder is importable (``PYTHONPATH=examples``) and the caller
trusts that code (``--trust-model-code``, ``trust_model_code=True``, or the
``SPECSTORE_TRUSTED_MODULES`` allow-list: importing a module runs it); a model in your own
package would be ``yourpackage.models:YourNet``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader

from specstore import infer
from specstore.infer.data import BudgetBatchSampler, PadCollate, StoreDataset  # the three imports
from specstore.infer.engine.cost import measure_cost_per_frame
from specstore.infer.models.checkpoint import Checkpoint, save_checkpoint
from specstore.infer.models.contract import ModelSpec
from specstore.store import open_store

#: The import path the checkpoint records (``__main__`` is not importable later, the file's name is).
MODULE = Path(__file__).stem if __name__ == "__main__" else __name__


class GenreNet(nn.Module):
    """A small user model following specstore's model contract (:mod:`specstore.infer.models.contract`).

    ``x``: ``(B, 1, n_bins, T)`` dB values, zero beyond each clip's ``lengths`` (frames).
    Two 1-D convolutions over time (the mel bins are the input channels), the second with
    stride 2 (hence ``time_stride = 2``), re-masked after each, then a masked mean over the
    real frames and a linear layer: a clip's logits do not depend on its batch-mates.
    ``input_mean``/``input_std`` (dB) map the input to roughly unit scale.
    """

    time_stride = 2

    def __init__(self, n_bins: int, n_classes: int, width: int = 32, input_mean: float = -45.0,
                 input_std: float = 15.0) -> None:
        super().__init__()
        self.input_mean, self.input_std = input_mean, input_std
        self.conv1 = nn.Conv1d(n_bins, width, kernel_size=5, padding=2)
        self.conv2 = nn.Conv1d(width, width, kernel_size=3, stride=2, padding=1)
        self.head = nn.Linear(width, n_classes)

    @staticmethod
    def _mask(h: Tensor, lengths: Tensor) -> Tensor:
        keep = torch.arange(h.shape[-1], device=h.device)[None, :] < lengths[:, None]
        return h * keep[:, None, :].to(h.dtype)

    def forward(self, x: Tensor, lengths: Tensor) -> Tensor:
        h = self._mask((x[:, 0] - self.input_mean) / self.input_std, lengths)  # (B, n_bins, T)
        h = self._mask(torch.relu(self.conv1(h)), lengths)
        lengths = (lengths + 1) // 2  # frames after the stride-2 conv
        h = self._mask(torch.relu(self.conv2(h)), lengths)
        return self.head(h.sum(dim=-1) / lengths[:, None].to(h.dtype))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("store", help="a specstore store (path or URL) with labelled clips")
    p.add_argument("--out", default="models/train_your_own.pt", help="checkpoint to write")
    p.add_argument("--predictions", default=None, help="also write infer.predict's CSV here")
    p.add_argument("--feature", default=None, help="feature to train on (default: the store's default)")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--width", type=int, default=32, help="GenreNet channels")
    p.add_argument("--lr", type=float, default=3e-3, help="AdamW learning rate")
    p.add_argument("--budget-mb", type=float, default=512.0, help="memory one batch may use, MiB")
    p.add_argument("--max-batch", type=int, default=16, help="most clips in one batch")
    p.add_argument("--crop-seconds", type=float, default=None, help="random crop per clip and epoch (default: whole)")
    p.add_argument("--val-fraction", type=float, default=0.25, help="share of labelled clips held out")
    p.add_argument("--workers", type=int, default=0, help="DataLoader worker processes")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the recipe; returns what it measured (also printed)."""
    args = parse_args(argv)
    t0 = time.perf_counter()
    torch.manual_seed(args.seed)
    s = open_store(args.store)
    feature = args.feature or s.default_feature
    n_bins, n_classes = s.specs[feature].n_bins, len(s.label_names)

    # 1. a held-out split of the labelled clips
    labelled = np.flatnonzero(s.labels >= 0)
    rng = np.random.default_rng(args.seed)
    n_val = max(1, int(round(len(labelled) * args.val_fraction)))
    val_rows = np.sort(rng.choice(labelled, size=n_val, replace=False))
    train_rows = np.setdiff1d(labelled, val_rows)

    # 2. the data path: dataset, budgeted shuffled batches, padding collate
    kwargs = {"n_bins": n_bins, "n_classes": n_classes, "width": args.width}
    model = GenreNet(**kwargs)
    cost = measure_cost_per_frame(model, n_bins, training=True)  # bytes per padded clip-frame, with backward
    train_ds = StoreDataset(s, feature, rows=train_rows, crop_seconds=args.crop_seconds, seed=args.seed)
    sampler = BudgetBatchSampler(train_ds, budget_mb=args.budget_mb, cost=cost, max_batch=args.max_batch,
                                 frame_align=model.time_stride, shuffle=True, seed=args.seed)
    loader = DataLoader(train_ds, batch_sampler=sampler, collate_fn=PadCollate(model.time_stride),
                        num_workers=args.workers)

    # 3. the training loop
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    losses: list[float] = []
    largest = 0  # bytes of the largest batch, by the budget's rule
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)  # new batches (and crops) every epoch
        model.train()
        total, seen = 0.0, 0
        for batch in loader:
            largest = max(largest, int(sampler.budget.bytes(len(batch), batch.n_frames)))
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(batch.x, batch.lengths), batch.labels)
            loss.backward()
            optimizer.step()
            total += float(loss.detach()) * len(batch)
            seen += len(batch)
        losses.append(total / seen)
        print(f"epoch {epoch + 1}/{args.epochs}: loss {losses[-1]:.4f}, {len(sampler)} batches")

    # 4. evaluation on whole held-out clips: sorted batches under the inference budget
    model.eval()
    eval_cost = measure_cost_per_frame(model, n_bins)
    val_ds = StoreDataset(s, feature, rows=val_rows)
    val_sampler = BudgetBatchSampler(val_ds, budget_mb=args.budget_mb, cost=eval_cost, max_batch=args.max_batch,
                                     frame_align=model.time_stride)
    val_logits = np.zeros((len(val_ds), n_classes), dtype=np.float32)
    with torch.no_grad():
        for batch in DataLoader(val_ds, batch_sampler=val_sampler, collate_fn=PadCollate(model.time_stride)):
            val_logits[batch.ids] = model(batch.x, batch.lengths).numpy()
    val_probs = torch.softmax(torch.from_numpy(val_logits), dim=1).numpy()
    val_accuracy = float((val_probs.argmax(1) == val_ds.labels).mean())
    print(f"held-out accuracy {val_accuracy:.3f} on {len(val_ds)} clips")

    # 5. a specstore checkpoint: weights + an import path and JSON arguments to rebuild the model
    spec = ModelSpec(f"{MODULE}:GenreNet", kwargs)
    ckpt = Checkpoint.from_model(model, s.label_names, feature, s.specs[feature], model_spec=spec,
                                 extra={"epochs": args.epochs, "val_accuracy": val_accuracy, "losses": losses})
    out = save_checkpoint(ckpt, args.out)

    # 6. the built-in prediction on it (what `make infer` runs)
    # The checkpoint names this file's class: loading it imports this module, which we trust (it is ours).
    pred = infer.predict(s, out, args.predictions, device="cpu", budget_mb=args.budget_mb, progress=False,
                         trust_model_code=[spec.target])
    diff = float(np.abs(pred.probs[val_rows] - val_probs).max())
    print(pred.stats.line())
    print(f"checkpoint {out} ({spec.target}); infer.predict agrees with the loop's own evaluation to {diff:.1e}")
    return {
        "losses": losses, "val_accuracy": val_accuracy, "val_rows": val_rows.tolist(), "val_probs": val_probs,
        "predict_probs": pred.probs, "max_prob_diff": diff, "checkpoint": str(out), "model_target": spec.target,
        "largest_batch_bytes": largest, "budget_bytes": sampler.budget.budget_bytes,
        "seconds": time.perf_counter() - t0,
    }


if __name__ == "__main__":
    result = main()
    print(json.dumps({k: result[k] for k in ("val_accuracy", "max_prob_diff", "checkpoint", "seconds")}))

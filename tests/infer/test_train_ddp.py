"""``make train NPROC=2``: the real training path under torchrun (2 ranks, gloo, CPU, a tiny store and model).

The first step's gradient equals the mean of the two ranks' batches' single-process gradients (the batches and the
initial weights come from the run's own dump, ``SPECSTORE_TRAIN_DUMP_FIRST_STEP``), and a run whose processes are all
killed (SIGKILL, from outside, as a preempted job's) once its resume file records an epoch ends, rerun, with the
weights of an uninterrupted run.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp
import torch.nn.functional as F
from factories import SPEC16, budget_mb_holding, make_checkpoint, make_separable_store, make_store
from torch import nn

from specstore.infer.batching.budget import Budget
from specstore.infer.errors import TrainError
from specstore.infer.models.contract import ModelSpec
from specstore.infer.train.debug import DUMP_FIRST_STEP
from specstore.infer.train.distributed import (
    TORCHRUN_VARS,
    Dist,
    average_running_stats,
    broadcast_object,
    broadcast_state,
    from_env,
    one_process_only,
    process_group,
    same_on_every_rank,
    shared_logits,
    smallest_budget,
    sum_over_ranks,
)
from specstore.infer.train.resume import resume_path_for
from specstore.store import IndexRow, create_store

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".venv"
WORLD = 2
EPOCHS = 3
VAL_LENGTHS = [30, 45, 60, 75, 90, 110, 130, 150, 40, 3000]
"""Validation clips (frames) of the shared-validation check; the last runs in windows (the budget holds 1000)."""
#: A tiny model on whole clips: no dropout (its draws are the only randomness a one-process replay would lack).
OPTIONS = ["--epochs", str(EPOCHS), "--width", "4", "--depth", "2", "--lr", "0.03", "--max-batch", "6",
           "--crop-seconds", "0", "--val-fraction", "0.25", "--device", "cpu", "--dropout", "0", "--no-progress"]


def _torchrun_argv(store: Path, model: Path) -> list[str]:
    """The command ``make train NPROC=2`` runs (``make -n``), as argv words."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MAKEFLAGS", "MFLAGS", "MAKELEVEL"))}
    proc = subprocess.run(["make", "-n", "--no-print-directory", "-C", str(ROOT), "train", f"STORE={store}",
                           f"MODEL={model}", f"NPROC={WORLD}", f"ARGS={shlex.join(OPTIONS)}", f"VENV={VENV}",
                           "TORCH_PIP=torch"], capture_output=True, text=True, timeout=60, env=env, check=False)
    assert proc.returncode == 0, proc.stderr
    line = next(x for x in proc.stdout.splitlines() if x.startswith(f"{VENV}/bin/torchrun "))
    argv = shlex.split(line)
    assert argv[1:6] == ["--standalone", f"--nproc_per_node={WORLD}", "-m", "specstore", "train"]
    return argv


def _env(**extra: str) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if k not in (*TORCHRUN_VARS, DUMP_FIRST_STEP)}, **extra}


def _run(argv: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False, env=_env(**env))


def _preempt_after_an_epoch(argv: list[str], resume: Path, log: Path) -> int:
    """Run ``argv``; once ``resume`` exists (an epoch is recorded), SIGKILL torchrun and every rank at once, as a
    preempted job is killed.  Returns the epoch the resume file then records."""
    import psutil

    with log.open("w") as out:
        proc = subprocess.Popen(argv, cwd=ROOT, env=_env(), stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 300
    try:
        while not resume.exists():
            assert proc.poll() is None, f"the run ended before it recorded an epoch: {log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, "no epoch recorded in 300 s"
            time.sleep(0.005)
        everyone = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
        for p in everyone:
            p.send_signal(signal.SIGKILL)
        psutil.wait_procs(everyone, timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(60)
    return int(_load(resume)["epoch"])


def _load(path: Path) -> dict[str, Any]:
    return dict(torch.load(path, weights_only=True))


def _one_process_gradient(spec: ModelSpec, dump: dict[str, Any]) -> torch.Tensor:
    """The gradient of one rank's first batch, in this process, from the run's initial weights."""
    model = spec.build()
    model.load_state_dict(dump["initial"])
    model.train()
    model.zero_grad()
    F.cross_entropy(model(dump["x"], dump["lengths"]), dump["labels"]).backward()
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.requires_grad and p.grad is not None])


def _assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        if a[name].dtype.is_floating_point:
            torch.testing.assert_close(a[name], b[name], rtol=1e-4, atol=1e-6, msg=name)
        else:
            assert torch.equal(a[name], b[name]), name


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("make") is None or not (VENV / "bin" / "torchrun").exists(),
                    reason="needs make and .venv/bin/torchrun")
def test_make_train_nproc_2_averages_gradients_and_resumes(tmp_path: Path) -> None:
    store = make_separable_store(tmp_path / "s.zarr", n=40)
    whole, dump = tmp_path / "whole.pt", tmp_path / "dump"
    proc = _run(_torchrun_argv(store, whole), **{DUMP_FIRST_STEP: str(dump)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"trained epochs 1-{EPOCHS} of {EPOCHS}" in proc.stdout

    # The first step: DDP's gradient is the mean of the ranks' batches' one-process gradients.
    state = _load(resume_path_for(whole))
    assert state["world_size"] == WORLD and state["epoch"] == EPOCHS
    spec = ModelSpec.from_dict(state["model_spec"])
    dumps = [_load(dump / f"first-step.rank{r}.pt") for r in range(WORLD)]
    per_rank = [_one_process_gradient(spec, d) for d in dumps]
    assert not torch.allclose(per_rank[0], per_rank[1], rtol=1e-2)  # different batches: the mean says something
    mean = torch.stack(per_rank).mean(dim=0)
    for d in dumps:
        torch.testing.assert_close(d["grad"], mean, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(dumps[0]["initial"], dumps[1]["initial"], rtol=0, atol=0)  # one initial model

    # Every process killed once an epoch is recorded, then rerun: the uninterrupted weights.
    killed = tmp_path / "killed.pt"
    argv = _torchrun_argv(store, killed)
    done = _preempt_after_an_epoch(argv, resume_path_for(killed), tmp_path / "killed.log")
    assert 1 <= done < EPOCHS, "the kill came after the run had finished"
    proc = _run(argv)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"trained epochs {done + 1}-{EPOCHS} of {EPOCHS}" in proc.stdout
    _assert_same_weights(_load(resume_path_for(killed))["model"], state["model"])


def test_torchrun_environment_is_read_whole_or_not_at_all(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in TORCHRUN_VARS:
        monkeypatch.delenv(k, raising=False)
    assert from_env("cpu") is None  # no torchrun: one process
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(TrainError, match="WORLD_SIZE, LOCAL_RANK, MASTER_ADDR missing"):
        from_env("cpu")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("MASTER_ADDR", "localhost")
    assert from_env("cpu") is None  # torchrun --nproc_per_node=1: today's single process
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    d = from_env("cpu")
    assert d is not None and (d.rank, d.world, d.local_rank, d.backend, d.is_main) == (1, 2, 1, "gloo", False)
    with pytest.raises(TrainError, match="a head on the musicnn-msd backbone runs in one process only; drop NPROC"):
        one_process_only("training a head on the musicnn-msd backbone")


def _shared_logits(store: str, model: str, d: Dist | None) -> torch.Tensor:
    """Validation's logits of every row of ``store`` (its rows, duplicates included, in reverse order): shared out
    among the ranks of ``d``, or in this one process."""
    from specstore.infer.engine.runtime import Engine, RunOptions
    from specstore.infer.models.checkpoint import load_checkpoint
    from specstore.store import open_store

    s, ckpt = open_store(store), load_checkpoint(model)
    engine = Engine(RunOptions(device="cpu", budget_mb=budget_mb_holding(model, 1000), progress=False, threads=1))
    net = engine.prepare(ckpt.build())
    rows = np.arange(len(s))[::-1].copy()
    budget = engine.budget(net, ckpt.n_bins)
    if d is None:
        res = engine.logits(net, s, rows, feature="mel", budget=budget)
        assert res.windowed == 1
        return torch.from_numpy(res.logits)
    return torch.from_numpy(shared_logits(engine, net, s, rows, feature="mel", budget=budget, width=3, d=d))


def _helpers_rank(rank: int, init: str, out: str, store: str, model: str) -> None:
    torch.distributed.init_process_group("gloo", init_method=init, rank=rank, world_size=WORLD)
    d = Dist(rank, WORLD, rank, WORLD, "gloo")
    with process_group(d):  # joins the group made above, and leaves it to its maker
        torch.set_num_threads(1)
        logits = _shared_logits(store, model, d)
        bn = nn.BatchNorm1d(3)
        assert bn.running_mean is not None and bn.running_var is not None
        bn.running_mean.fill_(float(rank))  # rank 0: 0, rank 1: 1
        bn.running_var.fill_(1.0 + 2 * rank)  # 1 and 3
        bn.weight.data.fill_(5.0 + rank)  # a parameter: not averaged
        n = average_running_stats(bn, d)
        budget = smallest_budget(Budget(1_000_000 * (1 + rank), 100.0 + rank, fixed_overhead=10 * (2 - rank)), d)
        head = nn.Linear(2, 2)
        with torch.no_grad():
            head.weight.fill_(float(rank))
        broadcast_state(head, d)
        fit = broadcast_object({"C": 3.0, "rank": rank}, d)
        total = sum_over_ranks([1.0, float(rank)], d)
        try:
            same_on_every_rank(rank, d, "the epoch")
            disagreement = ""
        except TrainError as e:
            disagreement = str(e)
        torch.save({"bn": bn.state_dict(), "n": n, "budget": [budget.budget_bytes, budget.cost_per_frame,
                                                               budget.fixed_overhead],
                    "head": head.weight.detach().clone(), "fit_rank": fit["rank"], "total": total,
                    "disagreement": disagreement, "logits": logits}, f"{out}.{rank}")
    assert torch.distributed.is_initialized()
    torch.distributed.destroy_process_group()


@pytest.mark.slow
def test_rank_helpers_average_take_the_smallest_broadcast_and_share_validation(tmp_path: Path) -> None:
    store = make_store(tmp_path / "v.zarr", lengths=VAL_LENGTHS)
    create_store(store, {"mel": SPEC16}).commit(rows=[IndexRow("copies/a.wav", "h1", "jazz"),
                                                      IndexRow("copies/b.wav", "h4", None)])
    model = make_checkpoint(tmp_path / "m.pt", time_kernel=1)
    out = str(tmp_path / "result")
    mp.start_processes(_helpers_rank, args=(f"file://{tmp_path / 'rendezvous'}", out, str(store), str(model)),
                       nprocs=WORLD, join=True, start_method="spawn")
    results = [torch.load(f"{out}.{r}", weights_only=True) for r in range(WORLD)]
    one = _shared_logits(str(store), str(model), None)
    assert one.shape == (len(VAL_LENGTHS) + 2, 3) and not torch.allclose(one[0], one[1])
    for r in results:  # validation shared out: every rank holds every row's logits, as one process computes them
        torch.testing.assert_close(r["logits"], one, rtol=1e-5, atol=1e-6)
    for rank, r in enumerate(results):
        assert r["n"] == 2  # running_mean and running_var (num_batches_tracked is an integer, left alone)
        torch.testing.assert_close(r["bn"]["running_mean"], torch.full((3,), 0.5))
        torch.testing.assert_close(r["bn"]["running_var"], torch.full((3,), 2.0))
        torch.testing.assert_close(r["bn"]["weight"], torch.full((3,), 5.0 + rank))
        assert r["budget"] == [1_000_000, 101.0, 20]  # fewest bytes, dearest frame, largest overhead
        torch.testing.assert_close(r["head"], torch.zeros(2, 2))  # rank 0's weights
        assert r["fit_rank"] == 0 and r["total"] == [2.0, 1.0]
        assert "the ranks disagree on the epoch (0 to 1)" in r["disagreement"]

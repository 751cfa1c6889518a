"""Rank functions of lesson 77: train with our DDP wrappers or torch DDP, and time each phase.

The notebook, the tests and the benchmark run these through `launch.spawn` (or torchrun) and
compare with `train_single_process`, the same training on one process and the full batch.
A `DDPRun` (frozen dataclass) says what to train; vary it with `dataclasses.replace`.

    python -m lesson_code.ddp_checks          # 4 ranks: our wrappers and torch DDP vs one process
"""

from __future__ import annotations

import statistics
import time
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from lesson_code.comm import Communicator
from lesson_code.ddp import BucketedDDP, NaiveDDP
from lesson_code.ledger import CommLedger
from lesson_code.models import GPTConfig, build_model

WRAPPERS = ("naive", "bucketed", "torch")


@dataclass(frozen=True)
class DDPRun:
    """One training run: model, wrapper, optimizer, data and communication settings."""

    model: str = "mlp"             # "mlp" or "gpt"
    wrapper: str = "bucketed"      # "naive", "bucketed" or "torch" (DistributedDataParallel)
    optimizer: str = "sgd"         # "sgd" or "adam"
    steps: int = 10
    batch_size: int = 16           # global batch, split evenly over the ranks
    accumulation: int = 1          # micro-batches per step; all but the last under no_sync()
    seed: int = 0
    comm: str = "ring"             # "ring" (lesson 76) or "builtin" (torch.distributed)
    bucket_cap_mb: float = 0.01    # small, so that even the MLP spans several buckets
    gpt: GPTConfig = field(default_factory=GPTConfig)

    def __post_init__(self):
        if self.wrapper not in WRAPPERS:
            raise ValueError(f"unknown wrapper {self.wrapper!r}: use one of {', '.join(WRAPPERS)}")
        if self.optimizer not in ("sgd", "adam"):
            raise ValueError(f"unknown optimizer {self.optimizer!r}: use 'sgd' or 'adam'")


def make_batch(run: DDPRun, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of `step`: MLP features and classes, or GPT token sequences and targets.

    GPT targets follow a fixed rule of the inputs (next token = 3 * token + 1 mod vocab), so the
    loss can fall; all ranks and the single process draw the same batch from (seed, step).
    """
    generator = torch.Generator().manual_seed(1_000_003 * run.seed + step)
    if run.model == "mlp":
        x = torch.randn(run.batch_size, 32, generator=generator)
        return x, (x[:, :10].argmax(dim=1) + step) % 10
    config = run.gpt
    idx = torch.randint(0, config.vocab_size, (run.batch_size, config.context), generator=generator)
    return idx, (3 * idx + 1) % config.vocab_size


def _optimizer(run: DDPRun, params) -> torch.optim.Optimizer:
    if run.optimizer == "sgd":
        return torch.optim.SGD(params, lr=0.1)
    return torch.optim.Adam(params, lr=1e-2)


def flat_parameters(module: nn.Module) -> torch.Tensor:
    """All parameters of `module` in one float64 vector (for comparisons)."""
    return torch.cat([p.detach().reshape(-1).to(torch.float64) for p in module.parameters()])


def train_single_process(run: DDPRun) -> dict:
    """The reference: one process, the full batch, plain torch.optim. No process group needed."""
    model = build_model(run.model, run.seed, run.gpt)
    optimizer = _optimizer(run, model.parameters())
    losses = []
    for step in range(run.steps):
        x, y = make_batch(run, step)
        optimizer.zero_grad()
        loss = model(x, y)[1]
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return {"params": flat_parameters(model), "losses": losses}


def wrap(run: DDPRun, model: nn.Module, ledger: CommLedger | None = None,
         record_events: bool = False) -> nn.Module:
    """Wrap `model` in the data-parallel wrapper `run.wrapper` names."""
    if run.wrapper == "torch":
        return DistributedDataParallel(model, bucket_cap_mb=run.bucket_cap_mb)
    comm = Communicator(run.comm, ledger, record_events=record_events)
    if run.wrapper == "naive":
        return NaiveDDP(model, comm=comm)
    return BucketedDDP(model, bucket_cap_mb=run.bucket_cap_mb, comm=comm)


def train_step(run: DDPRun, model: nn.Module, optimizer, step: int, rank: int,
               world_size: int) -> float:
    """One optimizer step on this rank's slice, over `run.accumulation` micro-batches.

    Returns this rank's loss on its slice (the mean over its micro-batches).
    """
    x, y = (torch.tensor_split(t, world_size)[rank] for t in make_batch(run, step))
    optimizer.zero_grad()
    total = 0.0
    micro = list(zip(torch.tensor_split(x, run.accumulation), torch.tensor_split(y, run.accumulation)))
    for index, (xm, ym) in enumerate(micro):
        last = index == len(micro) - 1
        with model.no_sync() if not last else nullcontext():
            loss = model(xm, ym)[1] / run.accumulation
            loss.backward()
        total += loss.item()
    optimizer.step()
    return total


def train_ranks(rank: int, world_size: int, run: DDPRun) -> dict:
    """Train with `run.wrapper` on this rank's slice; return final parameters and global losses.

    Collective: call on every rank. Each rank builds its model from seed + rank, so only the
    wrapper's initial broadcast can make them agree. Losses are averaged over ranks.
    """
    model = wrap(run, build_model(run.model, run.seed + rank, run.gpt))
    optimizer = _optimizer(run, model.parameters())
    losses = []
    for step in range(run.steps):
        local = torch.tensor([train_step(run, model, optimizer, step, rank, world_size)])
        dist.all_reduce(local)  # a measurement only: the mean loss over the global batch
        losses.append(local.item() / world_size)
    inner = model.module
    return {"params": flat_parameters(inner), "losses": losses}


def time_steps(rank: int, world_size: int, run: DDPRun, warmup: int = 2) -> dict:
    """Median seconds per phase over `run.steps` timed steps (after `warmup` steps).

    Collective: call on every rank. Phases: forward, backward (for torch DDP it includes the
    communication DDP waits for inside backward), wait (communication not hidden behind
    backward), optimizer, step; comm is the communication's own duration (ring only).
    """
    model = wrap(run, build_model(run.model, run.seed, run.gpt), record_events=True)
    optimizer = _optimizer(run, model.parameters())
    phases = {name: [] for name in ("forward", "backward", "wait", "optimizer", "step", "comm")}
    for step in range(warmup + run.steps):
        x, y = (torch.tensor_split(t, world_size)[rank] for t in make_batch(run, step))
        dist.barrier()
        t0 = time.perf_counter()
        optimizer.zero_grad()
        loss = model(x, y)[1]
        t1 = time.perf_counter()
        loss.backward()  # our wrappers wait for their reductions at the very end of backward
        t2 = time.perf_counter()
        optimizer.step()
        t3 = time.perf_counter()
        if step < warmup:
            continue
        stats = getattr(model, "stats", None)  # torch DDP keeps no such record: NaN below
        wait = stats["wait_s"] if stats else float("nan")
        phases["forward"].append(t1 - t0)
        phases["backward"].append(t2 - t1 - (wait if stats else 0.0))
        phases["wait"].append(wait)
        phases["optimizer"].append(t3 - t2)
        phases["step"].append(t3 - t0)
        phases["comm"].append(stats["comm_s"] if stats else float("nan"))
    return {name: statistics.median(values) for name, values in phases.items()}


def overlap_timeline(rank: int, world_size: int, run: DDPRun) -> dict:
    """Measured events of one bucketed step (after a warm-up), relative to the forward's start.

    Collective: call on every rank. Returns forward/backward spans and, per bucket, when its
    last gradient arrived and when its ring all-reduce ran.
    """
    run = DDPRun(**{**run.__dict__, "wrapper": "bucketed", "comm": "ring"})
    model = wrap(run, build_model(run.model, run.seed, run.gpt), record_events=True)
    optimizer = _optimizer(run, model.parameters())
    for step in range(2):
        x, y = (torch.tensor_split(t, world_size)[rank] for t in make_batch(run, step))
        dist.barrier()
        t0 = time.perf_counter()
        optimizer.zero_grad()
        loss = model(x, y)[1]
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        optimizer.step()
    buckets = [{key: (value - t0 if key in ("ready", "start", "end") else value)
                for key, value in row.items()} for row in model.timeline]
    return {"forward": (0.0, t1 - t0), "backward": (t1 - t0, t2 - t0 - model.stats["wait_s"]),
            "wait": (t2 - t0 - model.stats["wait_s"], t2 - t0), "buckets": buckets}

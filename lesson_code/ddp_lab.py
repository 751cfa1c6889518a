"""Rank functions of lesson 77: train with our DDP wrappers or torch DDP, and time each phase.

The notebook, the tests and the benchmark run these through `launch.spawn` (or torchrun) and
compare with `train_single_process`, the same training on one process and the full batch.
A `DDPRun` (frozen dataclass) says what to train; vary it with `dataclasses.replace`.

    python -m lesson_code.ddp_lab          # 4 ranks: our wrappers and torch DDP vs one process
"""

from __future__ import annotations

import statistics
from contextlib import nullcontext
from dataclasses import dataclass, field, replace

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from lesson_code import data
from lesson_code.collectives.comm import Communicator
from lesson_code.devices import clock, current_device
from lesson_code.ddp import BucketedDDP, NaiveDDP, broadcast_parameters
from lesson_code.collectives.ledger import CommLedger
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
    """The global batch of `step` for this run, on this process's device (see lesson_code.data)."""
    return data.make_batch(run.model, run.batch_size, step, run.seed, run.gpt, current_device())


def _optimizer(run: DDPRun, params) -> torch.optim.Optimizer:
    if run.optimizer == "sgd":
        return torch.optim.SGD(params, lr=0.1)
    return torch.optim.Adam(params, lr=1e-2)


def flat_parameters(module: nn.Module) -> torch.Tensor:
    """All parameters of `module` in one float64 vector (for comparisons)."""
    return torch.cat([p.detach().reshape(-1).to(torch.float64) for p in module.parameters()])


def train_single_process(run: DDPRun) -> dict:
    """The reference: one process, the full batch, plain torch.optim. No process group needed.

    Compute it with `reference.in_one_rank`, so that it runs with the ranks' thread count.
    """
    model = build_model(run.model, run.seed, run.gpt, current_device())
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
    x, y = data.local_slice(make_batch(run, step), rank, world_size)
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
    model = wrap(run, build_model(run.model, run.seed + rank, run.gpt, current_device()))
    optimizer = _optimizer(run, model.parameters())
    losses = []
    for step in range(run.steps):
        local = torch.tensor([train_step(run, model, optimizer, step, rank, world_size)],
                             device=current_device())
        dist.all_reduce(local)  # a measurement only: the mean loss over the global batch
        losses.append(local.item() / world_size)
    inner = model.module
    return {"params": flat_parameters(inner), "losses": losses}


def _timed_step(run: DDPRun, model, optimizer, step: int, rank: int,
                world_size: int) -> tuple[float, float, float, float]:
    """One step, all ranks starting together; perf_counter before forward, backward, optimizer
    and after it. Our wrappers wait for their reductions at the very end of backward."""
    x, y = data.local_slice(make_batch(run, step), rank, world_size)
    dist.barrier()
    t0 = clock()
    optimizer.zero_grad()
    loss = model(x, y)[1]
    t1 = clock()
    loss.backward()
    t2 = clock()
    optimizer.step()
    return t0, t1, t2, clock()


def time_steps(rank: int, world_size: int, run: DDPRun, warmup: int = 2) -> dict:
    """Median seconds per phase over `run.steps` timed steps (after `warmup` steps).

    Collective: call on every rank. Phases: forward, backward (for torch DDP it includes the
    communication DDP waits for inside backward), wait (communication not hidden behind
    backward), optimizer, step; comm is the communication's own duration (ring only).
    """
    model = wrap(run, build_model(run.model, run.seed, run.gpt, current_device()), record_events=True)
    optimizer = _optimizer(run, model.parameters())
    phases = {name: [] for name in ("forward", "backward", "wait", "optimizer", "step", "comm")}
    for step in range(warmup + run.steps):
        t0, t1, t2, t3 = _timed_step(run, model, optimizer, step, rank, world_size)
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
    model = wrap(run, build_model(run.model, run.seed, run.gpt, current_device()), record_events=True)
    optimizer = _optimizer(run, model.parameters())
    for step in range(2):
        t0, t1, t2, _ = _timed_step(run, model, optimizer, step, rank, world_size)
    buckets = [{key: (value - t0 if key in ("ready", "start", "end") else value)
                for key, value in row.items()} for row in model.timeline]
    return {"forward": (0.0, t1 - t0), "backward": (t1 - t0, t2 - t0 - model.stats["wait_s"]),
            "wait": (t2 - t0 - model.stats["wait_s"], t2 - t0), "buckets": buckets}


def attention_key_bias_mask(model: nn.Module) -> torch.Tensor:
    """True for the elements of the flat parameter vector that are MiniGPT attention key biases.

    Their true gradient is zero (the softmax ignores a shift shared by all scores of a query), so
    Adam walks them on rounding noise; comparisons across summation orders treat them apart.
    """
    mask = []
    for name, param in model.named_parameters():
        element = torch.zeros(param.numel(), dtype=torch.bool)
        if name.endswith("attn.qkv.bias"):
            third = param.numel() // 3
            element[third: 2 * third] = True
        mask.append(element)
    return torch.cat(mask)


def broadcast_demo(rank: int, world_size: int, seed: int = 0) -> dict:
    """Parameter norm of a MiniGPT built from seed + rank, before and after `broadcast_parameters`.

    Collective: call on every rank.
    """
    model = build_model("gpt", seed + rank, device=current_device())
    before = flat_parameters(model).norm().item()
    broadcast_parameters(model)
    return {"rank": rank, "norm before": before, "norm after": flat_parameters(model).norm().item()}


def no_sync_timing_demo(rank: int, world_size: int) -> dict[str, bool]:
    """Do gradients agree across ranks when no_sync() covers only the forward, or only backward?

    Collective: call on every rank. Every rank has different data; a synchronised backward makes
    their gradients identical.
    """
    device = current_device()
    model = BucketedDDP(build_model("mlp", 0, device=device), bucket_cap_mb=0.01)
    x = torch.randn(4, 32, generator=torch.Generator().manual_seed(rank)).to(device)
    target = torch.zeros(4, dtype=torch.long, device=device)
    outcomes = {}
    for case in ("forward inside no_sync", "backward inside no_sync"):
        model.zero_grad()
        if case == "forward inside no_sync":
            with model.no_sync():
                loss = model(x, target)[1]
            loss.backward()
        else:
            loss = model(x, target)[1]
            with model.no_sync():
                loss.backward()
        grad = model.module.layers[0].weight.grad.clone()
        gathered = [torch.empty_like(grad) for _ in range(world_size)]
        dist.all_gather(gathered, grad)
        outcomes[case] = all(torch.equal(g, gathered[0]) for g in gathered)
    return outcomes


def ledger_per_step(rank: int, world_size: int, run: DDPRun) -> dict[str, int]:
    """Calls, messages and bytes this rank sends for one training step (ring communicator).

    Collective: call on every rank. The initial broadcast is not counted.
    """
    ledger = CommLedger()
    model = wrap(replace(run, comm="ring"), build_model(run.model, run.seed, run.gpt, current_device()),
                 ledger)
    ledger.clear()
    train_step(run, model, _optimizer(run, model.parameters()), 0, rank, world_size)
    totals = ledger.totals()["all_reduce"]
    return {"all-reduce calls": totals["calls"], "messages sent": totals["messages_sent"],
            "bytes sent": totals["bytes_sent"]}


def key_bias_gradients(seed: int = 0) -> dict[str, float]:
    """Largest |gradient| of MiniGPT's attention query, key and value biases on one batch.

    One process, no group. The key biases' true gradient is zero: adding the same number to all
    scores of a query leaves its softmax unchanged.
    """
    model = build_model("gpt", seed)
    x, y = make_batch(DDPRun(model="gpt", seed=seed), 0)
    model(x, y)[1].backward()
    grads = torch.stack([block.attn.qkv.bias.grad for block in model.blocks])  # (layers, 3C)
    query, key, value = grads.chunk(3, dim=1)
    return {"query bias": query.abs().max().item(), "key bias": key.abs().max().item(),
            "value bias": value.abs().max().item()}


def compare_all_on_rank(rank: int, world_size: int, runs: list[DDPRun]) -> list[dict]:
    """For each run: do the ranks agree, and how far are they from one process on the full batch?

    Collective: call on every rank; each process also trains the single-process reference.
    """
    rows = []
    for run in runs:
        reference = train_single_process(replace(run, accumulation=1))
        result = train_ranks(rank, world_size, run)
        params = [torch.empty_like(result["params"]) for _ in range(world_size)]
        dist.all_gather(params, result["params"])
        rows.append({
            "model": run.model, "optimizer": run.optimizer, "wrapper": run.wrapper,
            "accumulation": run.accumulation,
            "ranks_identical": all(torch.equal(p, params[0]) for p in params),
            "max_param_diff": (result["params"] - reference["params"]).abs().max().item(),
            "max_loss_diff": max(abs(a - b) for a, b in zip(result["losses"], reference["losses"])),
            "first_loss": result["losses"][0], "last_loss": result["losses"][-1],
        })
    return rows


def main(argv: list[str] | None = None) -> int:
    """Train MLP and MiniGPT with each wrapper on N ranks and print the differences from one process."""
    import argparse

    from lesson_code import cli_args, launch

    parser = argparse.ArgumentParser(prog="python -m lesson_code.ddp_lab", description=main.__doc__)
    parser.add_argument("--world-size", type=cli_args.positive_int, default=4)
    parser.add_argument("--steps", type=cli_args.positive_int, default=10)
    args = parser.parse_args(argv)
    cli_args.check_world_size(parser, args.world_size, DDPRun().batch_size,
                              "each rank needs samples of the global batch")
    runs = [DDPRun(model=m, optimizer=o, wrapper=w, steps=args.steps)
            for m in ("mlp", "gpt") for o in ("sgd", "adam") for w in WRAPPERS]
    rows = launch.run(compare_all_on_rank, runs, world_size=args.world_size)[0]
    if launch.is_reporting_process():
        print(f"lesson 77: data-parallel training on {args.world_size} ranks vs one process, "
              f"{args.steps} steps")
        for row in rows:
            print(f"  {row['model']:3s} {row['optimizer']:4s} {row['wrapper']:8s} ranks identical: "
                  f"{row['ranks_identical']}  max |param diff| {row['max_param_diff']:.1e}  "
                  f"max |loss diff| {row['max_loss_diff']:.1e}  loss {row['first_loss']:.3f} -> "
                  f"{row['last_loss']:.3f}")
    return 0 if all(row["ranks_identical"] for row in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())

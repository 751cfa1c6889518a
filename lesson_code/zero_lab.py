"""Rank functions of lesson 78: train with ZeRO-1 and its rivals, measure memory and traffic.

The notebook, the tests and the benchmark run these through `launch.spawn` (or torchrun). A
`ZeroRun` (a frozen `experiment.RunConfig`) says what to train; `train_single_process` is the
reference. The loop and the timing are the shared harness's (`lesson_code.experiment`).

    python -m lesson_code.zero_lab     # an MLP, 20 steps on 4 ranks: losses, then memory
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace

import torch
from torch.nn.parallel import DistributedDataParallel

from lesson_code import launch
from lesson_code.harness import cli_args
from lesson_code.collectives.ledger import CommLedger
from lesson_code.ddp import BucketedDDP, broadcast_parameters
from lesson_code.ddp_lab import timed_step
from lesson_code.runtime.devices import current_device
from lesson_code.experiment import DTYPES, RunConfig, flat_parameters, train
from lesson_code.harness.timing import PhaseClock
from lesson_code.models import build_model
from lesson_code.harness.validate import require_choice, require_positive
from lesson_code.zero import (MasterAdam, NaiveZeroOptimizer, ZeroOptimizer, flatten_params,
                              storage_bytes)

OPTIMIZERS = ("zero", "naive_zero", "torch_zero", "ddp")
MODEL_DTYPES = ("float32", "bfloat16")  # of the model's parameters; the master copy is float32


@dataclass(frozen=True)
class ZeroRun(RunConfig):
    """A run of lesson 78: RunConfig's settings, plus optimizer variant, Adam's hyper-parameters,
    ZeRO stage and the model's precision. Raises ValueError for an unknown optimizer or dtype,
    or a learning rate of 0 or less."""

    batch_size: int = 24          # divisible by 1, 2, 3 and 4: equal slices on every rank
    optimizer: str = "zero"       # "zero", "naive_zero", "torch_zero" (ZeroRedundancyOptimizer)
    #                               or "ddp" (our bucketed DDP + unsharded MasterAdam)
    lr: float = 1e-2
    weight_decay: float = 0.0
    max_grad_norm: float | None = None
    stage: int = 1
    dtype: str = "float32"        # model parameters: "float32" or "bfloat16" (master is fp32)

    def __post_init__(self):
        super().__post_init__()
        require_choice("optimizer", self.optimizer, OPTIMIZERS)
        require_choice("dtype", self.dtype, MODEL_DTYPES)
        require_positive("lr", self.lr)


def run_model(run: ZeroRun, seed_offset: int = 0):
    """The model `run` trains ("mlp": 6922 parameters, not divisible by 3 or 4; or "gpt"),
    built from `run.seed + seed_offset`, in `run.dtype`, on this process's device. Ranks pass an
    offset (their rank) to start apart: only the optimizer's initial broadcast makes them equal."""
    return build_model(run.model, run.seed + seed_offset, run.gpt,
                       current_device()).to(DTYPES[run.dtype])


def run_loss(run: ZeroRun, model, step: int, rank: int = 0, world_size: int = 1):
    """`model`'s loss on this rank's slice of the global batch of `step` (the whole batch for one
    process); the MLP's features are cast to the model's dtype first."""
    x, y = run.local_batch(step, rank, world_size)
    if x.is_floating_point():
        x = x.to(DTYPES[run.dtype])  # the MLP's features, in the model's precision
    return model(x, y)[1]


def train_single_process(run: ZeroRun) -> dict:
    """The reference on one process and the full batch: torch.optim.Adam (float32 model, with
    clip_grad_norm_ before each step when asked) or MasterAdam, an fp32 master copy, for a
    bfloat16 model. Returns the final parameters (float64) and the loss of each step.

    Runs in a group of one: compute it with `reference.in_one_rank`, so that it also runs with
    the ranks' thread count.
    """
    model = run_model(run)
    if run.dtype == "float32":
        optimizer = torch.optim.Adam(model.parameters(), lr=run.lr, weight_decay=run.weight_decay)
        if run.max_grad_norm is not None:
            def clip(*_) -> None:  # before every step, after backward
                torch.nn.utils.clip_grad_norm_(model.parameters(), run.max_grad_norm)
            optimizer.register_step_pre_hook(clip)
    else:
        optimizer = MasterAdam(model, lr=run.lr, weight_decay=run.weight_decay,
                               max_grad_norm=run.max_grad_norm)
    losses = train(lambda step: run_loss(run, model, step), optimizer, range(run.steps))
    return {"params": flat_parameters(model), "losses": losses}


def build_optimizer(run: ZeroRun, model, rank: int, world_size: int, ledger=None, comm=None):
    """(model to call, optimizer) for `run.optimizer`; parameters equal rank 0's afterwards.
    `comm` (default: the run's communicator over `ledger`) carries our variants' traffic."""
    comm = comm if comm is not None else run.communicator(ledger)
    kwargs = {"lr": run.lr, "weight_decay": run.weight_decay}
    if run.optimizer == "torch_zero":
        # Imported here: torch.distributed.optim imports TorchScript, which warns on import.
        from torch.distributed.optim import ZeroRedundancyOptimizer

        wrapped = DistributedDataParallel(model)
        return wrapped, ZeroRedundancyOptimizer(wrapped.parameters(),
                                                optimizer_class=torch.optim.Adam, **kwargs)
    if run.optimizer == "ddp":
        wrapped = BucketedDDP(model, bucket_cap_mb=25.0, comm=comm)
        return wrapped, MasterAdam(model, max_grad_norm=run.max_grad_norm, **kwargs)
    broadcast_parameters(model, comm=comm)
    variant = NaiveZeroOptimizer if run.optimizer == "naive_zero" else ZeroOptimizer
    return model, variant(model, world_size, rank, max_grad_norm=run.max_grad_norm,
                          stage=run.stage, comm=comm, **kwargs)


def parameter_digest(model) -> str:
    """Short sha256 of the parameters' bytes: equal digests mean bitwise-equal parameters."""
    flat = flatten_params(model).to(torch.float32).cpu().contiguous()
    return hashlib.sha256(flat.numpy().tobytes()).hexdigest()[:16]


def train_on_rank(rank: int, world_size: int, run: ZeroRun) -> dict:
    """Train `run` on this rank's slice; return parameters, losses, memory and traffic.

    Collective: call on every rank. Models start from seed + rank: only the initial broadcast
    makes them equal. Returns the final parameters (float64), the global mean loss per step, a
    parameter digest per step, this rank's measured optimizer and gradient bytes after the last
    step, and its ledger totals of one step.
    """
    ledger = CommLedger()
    model, optimizer = build_optimizer(run, run_model(run, seed_offset=rank), rank, world_size, ledger)
    inner = getattr(model, "module", model)
    digests = []

    def step_loss(step: int) -> torch.Tensor:
        ledger.clear()  # so that it holds the traffic of the last step only
        return run_loss(run, model, step, rank, world_size)

    losses = train(step_loss, optimizer, range(run.steps),
                   after_step=lambda done: digests.append(parameter_digest(inner)))
    measured = getattr(optimizer, "optimizer_state_bytes", lambda: None)()
    gradient = getattr(optimizer, "gradient_bytes", lambda: None)()
    return {"params": flat_parameters(inner), "losses": losses,
            "digests": digests, "optimizer_bytes": measured, "gradient_bytes": gradient,
            "shard_numel": getattr(optimizer, "shard_numel", None),
            "padding": getattr(optimizer, "padding", None), "ledger": ledger.totals()}


def resume_matches(rank: int, world_size: int, run: ZeroRun, stop_at: int) -> dict:
    """Train `run.steps` steps straight, and again stopping at `stop_at` to rebuild the optimizer
    from its state_dict; report whether both runs end with bitwise-equal parameters and moments.

    Collective: call on every rank (ZeRO variants only).
    """
    def train_steps(model, optimizer, steps: range) -> None:
        train(lambda step: run_loss(run, model, step, rank, world_size), optimizer, steps)

    finals = []
    for interrupted in (False, True):
        model, optimizer = build_optimizer(run, run_model(run), rank, world_size)
        train_steps(model, optimizer, range(stop_at if interrupted else run.steps))
        if interrupted:  # a fresh model and optimizer from another start, then the saved state
            saved = optimizer.state_dict()
            model, optimizer = build_optimizer(run, run_model(run, seed_offset=1 + rank),
                                               rank, world_size)
            optimizer.load_state_dict(saved)
            train_steps(model, optimizer, range(stop_at, run.steps))
        finals.append((flatten_params(model), optimizer.state_dict()))
    (a, state_a), (b, state_b) = finals
    return {"params_equal": torch.equal(a, b),
            "state_equal": all(torch.equal(state_a[k], state_b[k])
                               for k in ("master", "exp_avg", "exp_avg_sq")),
            "steps": (state_a["step"], state_b["step"])}


def load_mismatched_shard(rank: int, world_size: int) -> str:
    """The error a rank gets when it loads another rank's shard. Collective: every rank."""
    run = ZeroRun()
    model, optimizer = build_optimizer(run, run_model(run), rank, world_size)
    state = optimizer.state_dict()
    state["shard"]["rank"] = (rank + 1) % world_size
    try:
        optimizer.load_state_dict(state)
    except ValueError as error:
        return str(error)
    return "no error"


def time_steps(rank: int, world_size: int, run: ZeroRun, warmup: int = 2) -> dict:
    """Median seconds of forward, backward, optimizer step and communication, and the bytes
    this rank sent per step. Collective: call on every rank.

    "comm" is the time the communicator's calls themselves took in a step. For "ddp" they run on
    a background thread during backward (overlapped, lesson 77); for the ZeRO variants the
    reduce-scatter and all-gather run inside the optimizer step, so its computation alone is
    optimizer - comm. NaN for "torch_zero", whose gloo calls no ledger sees.
    """
    ledger = CommLedger()
    comm = run.communicator(ledger, record_events=True)
    model, optimizer = build_optimizer(run, run_model(run), rank, world_size, comm=comm)
    clock = PhaseClock()
    for step in range(warmup + run.steps):
        if step == warmup:
            clock.discard()
        ledger.clear()
        comm.events.clear()  # (op, bytes, start, end) of this step's calls only
        timed_step(clock, optimizer, lambda: run_loss(run, model, step, rank, world_size))
        stats = getattr(model, "stats", None)  # our DDP reads (and clears) its buckets' events
        seconds = stats["comm_s"] if stats else sum(end - start for _, _, start, end in comm.events)
        clock.samples.setdefault("comm", []).append(
            float("nan") if run.optimizer == "torch_zero" else seconds)
    return {**clock.medians(), "bytes_sent": ledger.bytes_sent}


def memory_profile(rank: int, world_size: int, run: ZeroRun) -> dict[str, int]:
    """Bytes this rank holds after one step's backward: parameters, gradients, optimizer state.

    Collective: call on every rank. Each figure is read from tensor storage, never computed.
    """
    model, optimizer = build_optimizer(run, run_model(run), rank, world_size)
    inner = getattr(model, "module", model)
    run_loss(run, model, 0, rank, world_size).backward()
    grads = storage_bytes(*(p.grad for p in inner.parameters() if p.grad is not None))
    optimizer.step()
    if run.optimizer == "torch_zero":
        state = optimizer.optim.state.values()
        held = storage_bytes(*(t for s in state for t in s.values()
                               if torch.is_tensor(t) and t.dim() > 0))
    else:
        held = optimizer.optimizer_state_bytes()
    return {"rank": rank, "parameters": storage_bytes(*inner.parameters()), "gradients": grads,
            "optimizer": held}


def main(argv: list[str] | None = None) -> int:
    """The lesson's demo: an MLP trained 20 steps on N ranks with ZeRO-1; losses, then memory."""
    args = cli_args.lab_arguments(argv, "zero_lab", main.__doc__, steps=20, batch_size=ZeroRun().batch_size)
    run = ZeroRun(steps=args.steps)
    results = launch.run(train_on_rank, run, world_size=args.world_size)
    zero = launch.run(memory_profile, run, world_size=args.world_size)
    ddp = launch.run(memory_profile, replace(run, optimizer="ddp"), world_size=args.world_size)
    if not launch.is_reporting_process():
        return 0
    n, first = len(results), results[0]
    print(f"lesson 78: ZeRO-1 on {n} ranks, MLP with {first['params'].numel()} parameters "
          f"(padded by {first['padding']} to {first['shard_numel']} per rank), Adam lr {run.lr}")
    for step, loss in enumerate(first["losses"]):
        print(f"  step {step:2d}  loss {loss:.4f}")
    identical = all(r["digests"] == first["digests"] for r in results)
    print(f"parameters identical on all ranks after every step: {identical}")
    print("bytes per rank   parameters  gradients  optimizer (DDP)  optimizer (ZeRO-1)  12 x shard")
    for z, d in zip(zero, ddp):
        print(f"  rank {z['rank']}        {z['parameters']:10d} {z['gradients']:10d} "
              f"{d['optimizer']:16d} {z['optimizer']:19d} {12 * first['shard_numel']:11d}")
    return 0 if identical else 1


if __name__ == "__main__":
    raise SystemExit(main())

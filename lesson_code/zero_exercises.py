"""Lesson 78's exercises: what only the exercises and their worked solutions run.

The lesson's main line (training under ZeRO and its rivals, memory and traffic) is
`lesson_code.zero_lab`; this module holds exercise 3's count of a step's bytes under gradient
accumulation (`accumulation_traffic`), exercise 6's step that every rank skips alike when the
reduced gradient is not finite (`SkipNonFiniteStep`, which lesson 81's capstone reuses, and its
demonstration `overflow_skip`), and exercise 7's AdamW with parameter groups on flat shards
(`GroupedAdamWZero` against `torch.optim.AdamW` with `decay_groups`). Rank functions run
through `launch.spawn`, as the lesson's cells call them, e.g.

    launch.spawn(zero_exercises.overflow_skip, ZeroRun(), world_size=4)  # exercise 6
"""

from __future__ import annotations

import math

import torch

from lesson_code.collectives.ledger import CommLedger
from lesson_code.ddp import broadcast_parameters
from lesson_code.experiment import flat_parameters, train
from lesson_code.harness.validate import require_choice
from lesson_code.zero import ZeroOptimizer
from lesson_code.zero_lab import ZeroRun, build_optimizer, parameter_digest, run_loss, run_model


def accumulation_traffic(rank: int, world_size: int, run: ZeroRun,
                         micro_batches: tuple[int, ...] = (1, 2, 4)) -> dict[int, int]:
    """Bytes this rank sends in one optimizer step of G backward passes (gradient accumulation),
    for each G in `micro_batches`. Collective: call on every rank.

    ZeRO-1 ("zero") adds the micro-batches' full gradients up in `.grad` and reduce-scatters once,
    in step(); ZeRO-2 ("zero2") keeps no full gradient, so every backward pass reduce-scatters its
    buckets. Raises ValueError for another optimizer or a G below 1.
    """
    require_choice("optimizer", run.optimizer, ("zero", "zero2"))
    if not micro_batches or min(micro_batches) < 1:
        raise ValueError(f"micro_batches={micro_batches!r}: give backward passes per step, "
                         "each 1 or more, such as (1, 2, 4)")
    sent = {}
    for count in micro_batches:
        ledger = CommLedger()
        model, optimizer = build_optimizer(run, run_model(run), rank, world_size, ledger)
        ledger.clear()  # the initial broadcast is not the step's
        for micro in range(count):
            run_loss(run, model, micro, rank, world_size).backward()
        optimizer.step()
        sent[count] = ledger.bytes_sent
    return sent


class NonFiniteGradient(Exception):
    """The all-reduced gradient norm is inf or NaN: the step must not update anything."""


class SkipNonFiniteStep(ZeroOptimizer):
    """`ZeroOptimizer` that skips, on every rank alike, a step whose reduced gradient holds an
    inf or NaN (lesson 78, exercise 6): no Adam update, no all-gather, no step count.

    No rank holds the whole reduced gradient, only its shard, so the test reads the global norm,
    the square root of the all-reduced sum of the shards' squares (gradient clipping needs it
    anyway): one non-finite element on any shard makes it inf or NaN on every rank, and all ranks
    take the same decision. A rank that decided alone would leave the others waiting in the
    all-gather it skips. The norm also overflows for finite elements above about 1e19 in fp32,
    a step no run should take either. `skipped` counts the skipped steps."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **{**kwargs, "track_grad_norm": True})  # the norm is the test
        self.skipped = 0

    def _global_norm(self, grad: torch.Tensor) -> float:
        norm = super()._global_norm(grad)  # one all-reduce: the same number on every rank
        if not math.isfinite(norm):
            raise NonFiniteGradient(f"global gradient norm {norm}")
        return norm

    def step(self) -> None:
        try:
            super().step()  # raises before self.step_count += 1 when the norm is not finite
        except NonFiniteGradient:
            self.skipped += 1


def overflow_skip(rank: int, world_size: int, run: ZeroRun, overflow: str = "inf",
                  bad_rank: int = 1) -> dict:
    """Two steps of SkipNonFiniteStep, with an overflow in the first step's gradients.

    overflow="inf": rank `bad_rank` puts an infinity into its gradient's first element, which the
    reduce-scatter lands in rank 0's shard. overflow="sum": every rank puts 2e38 into that element,
    finite on each rank (float32 and bfloat16 reach 3.4e38), but the ring's sum of two is not.
    Returns whether each step was taken, whether this rank's own first gradient was finite, and
    the parameters' digest before the steps and after each. Collective: call on every rank.
    Raises ValueError for an unknown `overflow` or a `bad_rank` outside the group."""
    require_choice("overflow", overflow, ("inf", "sum"))
    if not 0 <= bad_rank < world_size:
        raise ValueError(f"bad_rank={bad_rank!r} is not a rank of {world_size}: give 0 to "
                         f"{world_size - 1}")
    model = run_model(run, seed_offset=rank)
    comm = run.communicator()
    broadcast_parameters(model, comm=comm)
    optimizer = SkipNonFiniteStep(model, world_size, rank, lr=run.lr, comm=comm)
    taken, digests, own_finite = [], [parameter_digest(model)], True
    for step in range(2):
        optimizer.zero_grad()
        run_loss(run, model, step, rank, world_size).backward()
        if step == 0 and (overflow == "sum" or rank == bad_rank):
            with torch.no_grad():
                optimizer.params[0].grad.view(-1)[0] = float("inf") if overflow == "inf" else 2e38
            own_finite = all(bool(p.grad.isfinite().all()) for p in optimizer.params)
        skipped = optimizer.skipped
        optimizer.step()
        taken.append(optimizer.skipped == skipped)
        digests.append(parameter_digest(model))
    return {"taken": taken, "digests": digests, "skipped": optimizer.skipped,
            "own_gradient_finite": own_finite}


class GroupedAdamWZero(ZeroOptimizer):
    """ZeRO-1 with AdamW's decoupled weight decay on two parameter groups, as LLM recipes set them
    (lesson 78, exercise 7): matrices decay, biases and norms (parameters of one dimension) do not.

    A flat shard cuts through parameters, so the group becomes a per-element mask: each rank
    cuts its shard of a flat boolean vector laid out as the parameters. Before each step the
    master shard's decayed elements are multiplied by 1 - lr * weight_decay, with the `lr` of
    that step, as torch.optim.AdamW multiplies each decayed parameter before its Adam update
    (which has no L2 term here); a schedule sets `lr` between steps. Raises ValueError for a
    negative weight_decay.
    """

    def __init__(self, model, world_size: int, rank: int, lr: float, weight_decay: float,
                 **kwargs):
        if weight_decay < 0:
            raise ValueError(f"weight_decay={weight_decay!r} is negative: give 0 or more, "
                             "such as 0.1")
        super().__init__(model, world_size, rank, lr, **kwargs)
        self.decoupled_decay = weight_decay
        decays = torch.cat([torch.full((p.numel(),), p.ndim >= 2, device=p.device)
                            for p in self.params])
        self.decays = self._padded(decays)[self.start: self.start + self.shard_numel]

    def step(self) -> None:
        with torch.no_grad():  # AdamW: decay the weights, at this step's lr, before the update
            self.master[self.decays] *= 1 - self.lr * self.decoupled_decay
        super().step()


def decay_groups(params, weight_decay: float) -> list[dict]:
    """torch.optim parameter groups: `weight_decay` on matrices, none on biases and norms."""
    params = [p for p in params if p.requires_grad]
    return [{"params": [p for p in params if p.ndim >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]


def train_grouped_adamw(rank: int, world_size: int, run: ZeroRun,
                        lrs: tuple[float, ...] | None = None) -> dict:
    """Train `run` with GroupedAdamWZero (decay `run.weight_decay` on matrices only); return the
    final parameters (float64) and the losses. `lrs` is a schedule, the learning rate of each
    step (default `run.lr` throughout), set on the optimizer's `lr` before its step: it has no
    param_groups for a torch scheduler. Collective: call on every rank."""
    lrs = _schedule(run, lrs)
    model = run_model(run, seed_offset=rank)
    comm = run.communicator()
    broadcast_parameters(model, comm=comm)
    optimizer = GroupedAdamWZero(model, world_size, rank, lr=lrs[0],
                                 weight_decay=run.weight_decay, comm=comm)

    def loss(step):
        optimizer.lr = lrs[step]
        return run_loss(run, model, step, rank, world_size)
    losses = train(loss, optimizer, range(run.steps))
    return {"params": flat_parameters(model), "losses": losses}


def adamw_single_process(run: ZeroRun, groups: bool = True,
                         lrs: tuple[float, ...] | None = None) -> dict:
    """The reference of GroupedAdamWZero on one process and the full batch: torch.optim.AdamW
    with `decay_groups` (or, with groups=False, one group that decays every parameter), its
    groups' `lr` set from the schedule `lrs` before each step, as a torch scheduler sets them.
    Compute it with `reference.in_one_rank`, as `train_single_process`."""
    lrs = _schedule(run, lrs)
    model = run_model(run)
    params = (decay_groups(model.parameters(), run.weight_decay) if groups
              else [p for p in model.parameters() if p.requires_grad])
    optimizer = torch.optim.AdamW(params, lr=lrs[0], weight_decay=run.weight_decay)

    def loss(step):
        for group in optimizer.param_groups:
            group["lr"] = lrs[step]
        return run_loss(run, model, step)
    losses = train(loss, optimizer, range(run.steps))
    return {"params": flat_parameters(model), "losses": losses}


def _schedule(run: ZeroRun, lrs: tuple[float, ...] | None) -> tuple[float, ...]:
    """`lrs`, checked to give one positive learning rate per step of `run`, or `run.lr` at every
    step when it is None."""
    if lrs is None:
        return (run.lr,) * run.steps
    if len(lrs) != run.steps or min(lrs) <= 0:
        raise ValueError(f"lrs={lrs!r} must give one positive learning rate for each of the "
                         f"run's {run.steps} steps")
    return tuple(lrs)

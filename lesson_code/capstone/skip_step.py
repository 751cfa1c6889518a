"""Lesson 81a: skip a step whose gradient is not finite although its loss is.

The divergence guard reads only the loss, so a gradient that overflows under a finite loss passes
it. Lesson 81 reuses lesson 78's exercise 6, `zero_exercises.SkipNonFiniteStep`: it catches such
a gradient inside `ZeroOptimizer.step`, where the global gradient norm is already all-reduced
after the reduce-scatter, so every rank tests the same number, all ranks skip alike, and the test
costs no communication of its own. It leaves `step` before `self.step_count += 1`, so Adam's
step count, and with it its bias correction, does not move for a step that was never taken.
Run the demonstration on 4 ranks with
`launch.spawn(skip_nonfinite_gradient, CapstoneConfig(steps=5), world_size=4)`.
"""

from __future__ import annotations

import math

import torch

from lesson_code.capstone.config import CapstoneConfig
from lesson_code.capstone.train import build, forward_backward
from lesson_code.experiment import flat_parameters, global_mean
from lesson_code.zero_exercises import SkipNonFiniteStep


def skip_nonfinite_gradient(rank: int, world_size: int, config: CapstoneConfig,
                            bad_step: int = 3, bad_rank: int = 0) -> dict:
    """Train `config.steps` steps with `SkipNonFiniteStep`; at step `bad_step` (from 1) rank
    `bad_rank` writes inf into one gradient element after backward, so the loss stays finite.

    Collective: every rank. Returns one record per step (loss, Adam's step count after it,
    whether the weights changed) and the final parameters. Raises ValueError for a step or a
    rank the run does not have.
    """
    if not 1 <= bad_step <= config.steps:
        raise ValueError(f"bad_step={bad_step} is not a step of this run (1 to {config.steps})")
    if not 0 <= bad_rank < world_size:
        raise ValueError(f"bad_rank={bad_rank} is not a rank of this run (0 to {world_size - 1})")
    model, comm, _ = build(config, rank, world_size)  # the broadcast; its ZeroOptimizer is replaced
    optimizer = SkipNonFiniteStep(model, world_size, rank, lr=config.lr, comm=comm)
    corpus, records = config.corpus(), []
    for step in range(config.steps):
        optimizer.zero_grad()
        loss = global_mean(forward_backward(config, model, corpus, step, rank, world_size))
        if step + 1 == bad_step and rank == bad_rank:  # the injected fault: one element, one rank
            next(p for p in model.parameters() if p.grad is not None).grad.view(-1)[0] = math.inf
        before = flat_parameters(model).clone()
        optimizer.step()
        records.append({"step": step + 1, "loss": loss, "optimizer_step": optimizer.step_count,
                        "weights_changed": not torch.equal(before, flat_parameters(model))})
    return {"rank": rank, "records": records, "skipped": optimizer.skipped,
            "params": flat_parameters(model)}

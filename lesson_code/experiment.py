"""The experiment harness the lessons' labs share: run settings, the training loop, comparisons.

Lessons 77-81 all train a model for some steps on N ranks and compare the result with one process
on the full batch. What they have in common is written here once:

- `RunConfig`: the settings every run has (model, steps, global batch, seed, communicator); each
  lesson's run (`DDPRun`, `ZeroRun`, `PipeRun`) extends it with its own.
- `train`: the loop zero_grad, loss, backward, optimizer step, with the loss averaged over ranks;
  the same loop serves the ranks and the single-process reference (a group of one rank).
- `flat_parameters`, `global_mean`: what the comparisons read.

Timing (phases of a step, medians of collectives) is in `lesson_code.harness.timing`.

    run = RunConfig(model="gpt", steps=5)
    losses = train(lambda step: model(*run.local_batch(step, rank, world_size))[1], optimizer,
                   range(run.steps))
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable

import torch
import torch.distributed as dist
from torch import nn

from lesson_code import data
from lesson_code.collectives.choose import CHOICES as ALL_REDUCE_CHOICES
from lesson_code.collectives.comm import KINDS as COMMUNICATORS
from lesson_code.collectives.comm import Communicator
from lesson_code.collectives.ledger import CommLedger
from lesson_code.runtime.devices import current_device
from lesson_code.models import GPTConfig
from lesson_code.harness.validate import require_choice, require_positive_int

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16,
          "int64": torch.int64}
MODELS = ("mlp", "gpt")


@dataclass(frozen=True)
class RunConfig:
    """What every run says: model, steps, global batch, data seed and communicator.

    `communicator(ledger)` builds the `Communicator` the run describes (every lesson's traffic
    goes through one, so its ledger counts it).

    Frozen: vary a run with `dataclasses.replace`. Raises ValueError for an unknown model or
    communicator and for a step count or batch size below 1.
    """

    model: str = "mlp"            # "mlp" or "gpt" (lesson_code.models)
    steps: int = 10
    batch_size: int = 16          # the global batch; each rank takes its slice
    seed: int = 0                 # model initialisation and data
    comm: str = "ring"            # "ring" (lesson 76) or "builtin" (torch.distributed)
    all_reduce: str = "ring"      # under "ring": lesson 76's algorithm ("auto" picks by size);
    #                               the labs measure the ring, whose bytes the lessons derive
    gpt: GPTConfig = field(default_factory=GPTConfig)

    def __post_init__(self):
        require_choice("model", self.model, MODELS)
        require_choice("communicator", self.comm, COMMUNICATORS)
        require_choice("all-reduce algorithm", self.all_reduce, ALL_REDUCE_CHOICES)
        require_positive_int("steps", self.steps)
        require_positive_int("batch_size", self.batch_size)

    def communicator(self, ledger: CommLedger | None = None, **options) -> Communicator:
        """The run's Communicator: `comm` kind, `all_reduce` algorithm, `ledger`, `options`."""
        return Communicator(self.comm, ledger, algorithm=self.all_reduce, **options)

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The global batch of `step` on this process's device (the same on every rank)."""
        return data.make_batch(self.model, self.batch_size, step, self.seed, self.gpt,
                               current_device())

    def local_batch(self, step: int, rank: int, world_size: int) -> tuple[torch.Tensor, ...]:
        """This rank's slice of the global batch of `step`: `tensor_split(batch, N)[rank]`."""
        return data.local_slice(self.batch(step), rank, world_size)


def flat_parameters(module: nn.Module) -> torch.Tensor:
    """All parameters of `module` in one detached float64 vector, in `parameters()` order.

    float64, so that differences between runs are not rounded away by the comparison itself.
    """
    return nn.utils.parameters_to_vector(module.parameters()).detach().to(torch.float64)


def global_mean(value: torch.Tensor | float, group=None) -> float:
    """The mean of `value` over the ranks of `group` (float64 sum, then divided).

    Collective: call on every rank. A measurement, not part of training: the loss on the global
    batch when every rank holds the loss on its equal slice.
    """
    total = torch.as_tensor(value, dtype=torch.float64).detach().reshape(1).to(current_device())
    dist.all_reduce(total, group=group)
    return total.item() / dist.get_world_size(group)


def train(step_loss: Callable[[int], torch.Tensor], optimizer, steps: Iterable[int], *,
          after_step: Callable[[int], None] | None = None,
          before_step: Callable[[], None] | None = None) -> list[float]:
    """Train: for each step, zero_grad, `loss = step_loss(step)`, backward, `optimizer.step()`.

    Collective: call on every rank (a one-rank group for a single-process reference). Returns the
    global mean loss of each step; calls `before_step()` between backward and the optimizer step
    (to clip the gradients, say) and `after_step(step + 1)` (the steps done) after each step.
    """
    losses = []
    for step in steps:
        optimizer.zero_grad()
        loss = step_loss(step)
        loss.backward()
        if before_step is not None:
            before_step()
        optimizer.step()
        losses.append(global_mean(loss))
        if after_step is not None:
            after_step(step + 1)
    return losses

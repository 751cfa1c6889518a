"""What the graders of lessons 77 and 78 share: the course's tolerances, counted collectives, runs.

Tolerances are those the course holds its own DDP and ZeRO to (tests/dist/test_ddp.py and
test_zero.py, measured on 4 ranks over 10 steps; the graders train fewer steps, so they sit
further inside them):
- a data-parallel run against one process on the full batch: losses within 1e-5, SGD parameters
  within 1e-6 (one float32 rounding per step: the average is summed in another order), Adam
  parameters within 1e-4 (Adam divides a gradient by its own size, so a rounding moves a step);
- ZeRO-1 against torch.optim.Adam on the MLP: within 1e-5 (another order of Adam's operations);
- a bfloat16 model, whose stored weights keep 8 significant bits: the run's relative distance
  ||params - reference|| / ||reference - start|| below 0.25 (correct runs measured 0.08; a
  gradient applied one element off measured 1.3 to 1.5).

`counted_collectives` sees the learner's communication whichever way it is written: each built-in
collective is counted as the bytes a ring implementation of it sends per rank, and point-to-point
sends as their own bytes (lesson 76's rings), so a reduce-scatter plus an all-gather can be told
from an all-reduce plus a slice.
"""

from __future__ import annotations

import inspect
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from lesson_code.practice.grading import Failure, fail_on_first, run_ranks
from lesson_code.practice.messages import Phrase, every_rank, phrase
from lesson_code.practice.rank_checks import FLATTENED, compare

LOSS_BOUND = 1e-5
SGD_BOUND = 1e-6
ADAM_BOUND = 1e-4
ZERO_BOUND = 1e-5
BFLOAT16_RELATIVE = 0.25


# name -> (the argument whose bytes count, how many times a ring sends them per rank in N ranks)
COUNTED: dict[str, tuple[str, Callable[[int], float]]] = {
    "all_reduce": ("tensor", lambda n: 2 * (n - 1) / n),
    "reduce_scatter": ("output", lambda n: n - 1),           # the output is this rank's chunk
    "reduce_scatter_tensor": ("output", lambda n: n - 1),
    "reduce_scatter_single": ("output", lambda n: n - 1),
    "all_gather": ("tensor", lambda n: n - 1),                # the input is this rank's shard
    "all_gather_into_tensor": ("input_tensor", lambda n: n - 1),
    "all_gather_single": ("input_tensor", lambda n: n - 1),
    "broadcast": ("tensor", lambda n: 1),
    "send": ("tensor", lambda n: 1),
    "isend": ("tensor", lambda n: 1),
}


def _ring_bytes(name: str, original: Callable, args: tuple, kwargs: dict) -> tuple[int, int, int]:
    """(payload bytes, element bytes, bytes a ring sends per rank) of one call of `name`."""
    arguments = inspect.signature(original).bind(*args, **kwargs).arguments
    counted, times = COUNTED[name]
    tensor = arguments[counted]
    payload = tensor.numel() * tensor.element_size()
    sent = int(times(dist.get_world_size(arguments.get("group"))) * payload)
    return payload, tensor.element_size(), sent


@dataclass(frozen=True)
class Call:
    """One collective call of this rank: its name, payload bytes, the bytes of one of its
    elements, the bytes a ring sends for it, and what `probe()` said when it was called."""

    name: str
    payload: int
    itemsize: int
    sent: int
    probe: object


@contextmanager
def counted_collectives(probe: Callable[[], object] = lambda: None) -> Iterator[list[Call]]:
    """Record every torch.distributed collective and send this rank makes while the block runs.

    Wraps the functions of `torch.distributed` (and of `distributed_c10d`, where the built-ins
    look each other up) and restores them after; only the outermost call is recorded, so a
    built-in that calls another counts once. `probe()` is evaluated at each call (the graders
    pass "how many parameters have a gradient yet"). The real functions still run.
    """
    calls: list[Call] = []
    depth = [0]
    originals = {name: getattr(c10d, name) for name in COUNTED}

    def counting(name, original):
        def call(*args, **kwargs):
            if depth[0] == 0:
                calls.append(Call(name, *_ring_bytes(name, original, args, kwargs), probe()))
            depth[0] += 1
            try:
                return original(*args, **kwargs)
            finally:
                depth[0] -= 1
        return call

    try:
        for name, original in originals.items():
            wrapper = counting(name, original)
            setattr(c10d, name, wrapper)
            setattr(dist, name, wrapper)
        yield calls
    finally:
        for name, original in originals.items():
            setattr(c10d, name, original)
            setattr(dist, name, original)


def relative_distance(params: torch.Tensor, reference: torch.Tensor, start: torch.Tensor) -> float:
    """||params - reference|| / ||reference - start|| for flat parameter vectors."""
    moved = (reference.double() - start.double()).norm()
    return ((params.double() - reference.double()).norm() / moved).item()


def within(got: torch.Tensor, expected: torch.Tensor, bound: float | None, *, case: str | Phrase,
           case_index: int, rank: int, reference: str | Phrase,
           element_of: Phrase | Callable[[int], Phrase] = FLATTENED,
           group_size: int = 1) -> Failure | None:
    """`rank_checks.compare` with one bound for every element (None: exactly equal)."""
    allowed = None if bound is None else torch.full(expected.shape, bound, dtype=torch.float64)
    return compare(got, expected, allowed, case=case, case_index=case_index, rank=rank,
                   reference=reference, element_of=element_of, group_size=group_size)


def value_failure(what: str | Phrase, got, expected, *, case: str | Phrase, case_index: int,
                  rank: int) -> Failure:
    """A Failure of kind "value": `what` was `got` where `expected` was due."""
    return Failure("value", {"case": case, "case_index": case_index, "rank": rank, "what": what,
                             "got": got, "expected": expected})


def parameter_at(module: torch.nn.Module, what: Phrase) -> Callable[[int], Phrase]:
    """For an index into `module`'s flat parameters (parameters_to_vector's order): `what`, at
    the parameter and element it is, "fc1.weight[2, 3]"."""
    def locate(index: int) -> Phrase:
        for name, param in module.named_parameters():
            if index < param.numel():
                place = ", ".join(str(int(i)) for i in  # 0-d tensors: "0", not "tensor(0)"
                                  torch.unravel_index(torch.tensor(index), param.shape))
                return phrase("{what}, at {name}", "{what}، در `{name}`", what=what,
                              name=f"{name}[{place}]" if param.dim() else name)
            index -= param.numel()
        return what  # past the parameters: the padding
    return locate


def prefix_group_phrase(size: int, world_size: int) -> Phrase:
    """The group of ranks 0..size-1 among `world_size` (`prefix_groups`), in words."""
    if size == world_size:
        return every_rank(world_size)
    if size == 1:
        return phrase("rank 0 alone, of {n}", "رتبهٔ {zero} به‌تنهایی، از {n} رتبه", zero=0,
                      n=world_size)
    return phrase("the group of ranks 0 to {last} of {n}", "گروه رتبه‌های {zero} تا {last} از {n} رتبه",
                  zero=0, last=size - 1, n=world_size)


def over_world_sizes(rank_fn, *args, world_sizes: tuple[int, ...], groups: bool = False):
    """A check's run: `rank_fn` on each of `world_sizes`, stopping at the first failure.

    `groups`: the rank function grades every smaller world size too (`prefix_groups`), which
    the case of a run that hangs names (a rank that raises names its own group, `during`)."""
    def run(path: str, timeout_s: float) -> None:
        for world_size in world_sizes:
            case = every_rank(world_size)
            if groups:
                case = phrase("one run of {n} ranks, in the groups of ranks 0 to k-1 for k = 1 "
                              "to {n}", "یک اجرا با {n} رتبه، در گروه‌های رتبه‌های {zero} تا k-1 "
                              "برای k از {one} تا {n}", n=world_size, zero=0, one=1)
            fail_on_first(run_ranks(rank_fn, path, *args, world_size=world_size,
                                    timeout_s=timeout_s, case=case))
    return run


def prefix_groups(world_size: int) -> dict[int, object]:
    """{k: the process group of ranks 0..k-1} for k = 1..world_size. Collective: every rank.

    One run of `world_size` ranks then grades every smaller world size too, each in a real gloo
    group of its own (a group's rank r is global rank r), instead of one run per world size."""
    return {k: dist.new_group(list(range(k))) for k in range(1, world_size + 1)}


def train_in_group(step_loss: Callable[[int], torch.Tensor], optimizer, steps: int,
                   group) -> list[float]:
    """zero_grad, loss, backward, step for `steps` steps; the loss of each step averaged over
    `group` (float64). Collective: every rank of `group`. `experiment.train` over a group."""
    losses = []
    for step in range(steps):
        optimizer.zero_grad()
        loss = step_loss(step)
        loss.backward()
        optimizer.step()
        total = loss.detach().to(torch.float64).reshape(1)
        dist.all_reduce(total, group=group)
        losses.append(total.item() / dist.get_world_size(group))
    return losses

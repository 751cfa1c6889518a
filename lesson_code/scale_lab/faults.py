"""A ZeRO-1 with a slip in its memory, for lesson 78b's exercise: the scale lab's check catches it.

`SlicedStateZero` is lesson 78's `ZeroOptimizer` whose fp32 master copy and Adam's moments are
slices of buffers as long as the whole (padded) model: the master's `.clone()` left out, and
the moments allocated whole and then sliced. It trains exactly as ZeRO-1 does, and counted by
elements (`numel()`) its state is the shard's, 12 bytes per element; but a slice is a view, and
a view keeps its whole buffer alive, so each rank holds DDP's 12 bytes per parameter. Read from storage, as the scale lab reads every rank, the sweep
shows it at once (`scale_lab.mismatches`).

    from lesson_code.scale_lab import faults
    with faults.in_place_of_zero1(faults.SlicedStateZero):
        table = scale_lab.sweep(world_sizes=(1, 4, 64), strategies=("ZeRO-1",))
    scale_lab.mismatches(table)      # N = 4 and 64: 12 x the whole padded model held
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator
from unittest import mock

import torch

from lesson_code import zero_lab
from lesson_code.zero import ZeroOptimizer, flatten_params


class SlicedStateZero(ZeroOptimizer):
    """ZeRO-1 whose master copy and moments are slices of whole-model buffers, not shard-sized
    tensors: `whole[start: start + shard_numel]` without `.clone()`, and `zeros_like(whole)`
    sliced (`zeros_like` of the master's slice alone would allocate only the shard). Same
    arguments, same steps and results as `ZeroOptimizer`; 12 bytes per parameter held instead of
    12 per shard element (built as the course's optimizer first, so its build allocates the state
    twice, then given the slices in its place)."""

    def __init__(self, model, world_size, rank, *args, **kwargs):
        super().__init__(model, world_size, rank, *args, **kwargs)
        whole = self._padded(flatten_params(model).to(torch.float32))  # (N x shard_numel,)
        shard = slice(self.start, self.start + self.shard_numel)
        self.master = whole[shard]  # a view: the whole buffer stays alive behind it
        self.exp_avg = torch.zeros_like(whole)[shard]
        self.exp_avg_sq = torch.zeros_like(whole)[shard]


@contextmanager
def in_place_of_zero1(optimizer_class: type[ZeroOptimizer]) -> Iterator[None]:
    """Meanwhile, lesson 78's runs (`zero_lab.build_optimizer`, and so the scale lab's "ZeRO-1")
    build `optimizer_class` instead of `ZeroOptimizer`; as before afterwards, also on an error.
    In this process only: ranks started by `launch.spawn` build the course's own."""
    if not (isinstance(optimizer_class, type) and issubclass(optimizer_class, ZeroOptimizer)):
        raise TypeError(f"{optimizer_class!r} is not a subclass of ZeroOptimizer: pass a class "
                        "built as ZeroOptimizer(model, world_size, rank, ...), such as "
                        "SlicedStateZero")
    with mock.patch.object(zero_lab, "ZeroOptimizer", optimizer_class):
        yield

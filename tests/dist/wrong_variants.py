"""Deliberately wrong variants of our DDP and ZeRO, to show that the tests' bounds catch them.

Each is what a plausible bug does: a gradient chunk applied one element off (an index error in
a reduce-scatter or in a bucket's copy back); under ZeRO-3, a gather that never happens (each
rank computes with its own shard and zeros elsewhere) or gradients never reduced (each rank
updates its shard with its own batch's gradient alone). Ranks still agree with each other, so
only the comparison with the reference can catch it. One more ZeRO-3 variant does not train at
all: it gathers into a new buffer instead of refilling the freed one, and backward fails.
"""

from contextlib import contextmanager

import torch

from lesson_code import ddp_lab, zero_lab
from lesson_code.capstone import train as capstone_train
from lesson_code.ddp import BucketedDDP
from lesson_code.zero import ZeroOptimizer
from lesson_code.zero3 import Zero3Optimizer


class OffByOneZero(ZeroOptimizer):
    """ZeRO-1 whose shard of the averaged gradient is shifted by one element."""

    def _reduce_gradient(self, flat_grad):
        return torch.roll(super()._reduce_gradient(flat_grad), 1)


class SummedZero(ZeroOptimizer):
    """ZeRO-1 that reduce-scatters the gradients with op="sum" where the mean is due: a gradient
    world_size times too large, which Adam almost cancels (it divides by the gradient's scale)."""

    def _reduce_gradient(self, flat_grad):
        return self.comm.reduce_scatter(flat_grad, op="sum")


class OffByOneBuckets(BucketedDDP):
    """Bucketed DDP that writes each reduced bucket back one element off."""

    def _synchronise(self):
        for bucket in self.buckets:
            if bucket.pending is not None:
                bucket.pending.wait(self.comm.timeout_s)
                bucket.flat.copy_(torch.roll(bucket.flat, 1))
        super()._synchronise()


class UngatheredZero3(Zero3Optimizer):
    """ZeRO-3 that forgets the all-gather: a unit's full buffer holds this rank's shard and
    zeros. Every collective of the step still runs (the reduce-scatters), so nothing hangs."""

    def _gather(self, group, when):
        if group.full.untyped_storage().nbytes():
            return
        group.full.untyped_storage().resize_(group.padded * group.full.element_size())
        group.full.zero_()
        self._own_chunk(group, group.full).copy_(group.shard)
        for param, piece in zip(group.params, group.pieces(group.full)):
            param.data = piece


class UnreducedZero3(Zero3Optimizer):
    """ZeRO-3 that forgets the reduce-scatter: each rank keeps its chunk of its own gradient."""

    def _reduce(self, group):
        if self.grad_shard is None:
            self.grad_shard = group.flat_grad.new_zeros(self.master.numel())
        own = self.grad_shard[group.offset: group.offset + group.shard_numel]
        own.add_(self._own_chunk(group, group.flat_grad))
        group.flat_grad = None
        self._free(group, "backward")


class ElsewhereZero3(Zero3Optimizer):
    """ZeRO-3 that gathers into a new buffer each time: the views autograd saved in forward
    still point at the old buffer, whose storage the free after forward resized to 0 bytes."""

    def _gather(self, group, when):
        if group.full.untyped_storage().nbytes():
            return
        group.full = self.comm.all_gather(group.shard, [group.shard_numel] * self.world_size)
        for param, piece in zip(group.params, group.pieces(group.full)):
            param.data = piece


@contextmanager
def replaced(module, name: str, variant):
    """`module.name` is `variant` inside the block (in this rank process only), then restored."""
    original = getattr(module, name)
    setattr(module, name, variant)
    try:
        yield
    finally:
        setattr(module, name, original)


def capstone_with_summed_gradients(rank, world_size, config):
    """The capstone's run_rank with SummedZero in place of ZeroOptimizer."""
    with replaced(capstone_train, "ZeroOptimizer", SummedZero):
        return capstone_train.run_rank(rank, world_size, config)


def train_wrong_zero(rank, world_size, run):
    """zero_lab.train_on_rank with OffByOneZero in place of ZeroOptimizer."""
    with replaced(zero_lab, "ZeroOptimizer", OffByOneZero):
        return zero_lab.train_on_rank(rank, world_size, run)


def train_wrong_ddp(rank, world_size, run):
    """ddp_lab.train_ranks with OffByOneBuckets in place of BucketedDDP."""
    with replaced(ddp_lab, "BucketedDDP", OffByOneBuckets):
        return ddp_lab.train_ranks(rank, world_size, run)


WRONG_ZERO3 = {"ungathered": UngatheredZero3, "unreduced": UnreducedZero3}
FAILING_ZERO3 = {"elsewhere": ElsewhereZero3}  # raises in backward: no result to compare


def train_wrong_zero3(rank, world_size, run, variant):
    """zero_lab.train_on_rank of a "zero3" run, the variant of that name in place of
    Zero3Optimizer (from WRONG_ZERO3 or FAILING_ZERO3)."""
    with replaced(zero_lab, "Zero3Optimizer", {**WRONG_ZERO3, **FAILING_ZERO3}[variant]):
        return zero_lab.train_on_rank(rank, world_size, run)

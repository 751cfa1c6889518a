"""Deliberately wrong variants of our DDP and ZeRO, to show that the tests' bounds catch them.

Each is what a plausible bug does: a gradient chunk applied one element off (an index error in
a reduce-scatter or in a bucket's copy back). Ranks still agree with each other, so only the
comparison with the reference can catch it.
"""

from contextlib import contextmanager

import torch

from lesson_code import ddp_lab, zero_lab
from lesson_code.ddp import BucketedDDP
from lesson_code.zero import ZeroOptimizer


class OffByOneZero(ZeroOptimizer):
    """ZeRO-1 whose shard of the averaged gradient is shifted by one element."""

    def _reduce_gradient(self, flat_grad):
        return torch.roll(super()._reduce_gradient(flat_grad), 1)


class OffByOneBuckets(BucketedDDP):
    """Bucketed DDP that writes each reduced bucket back one element off."""

    def _synchronise(self):
        for bucket in self.buckets:
            if bucket.pending is not None:
                bucket.pending.wait(self.comm.timeout_s)
                bucket.flat.copy_(torch.roll(bucket.flat, 1))
        super()._synchronise()


@contextmanager
def replaced(module, name: str, variant):
    """`module.name` is `variant` inside the block (in this rank process only), then restored."""
    original = getattr(module, name)
    setattr(module, name, variant)
    try:
        yield
    finally:
        setattr(module, name, original)


def train_wrong_zero(rank, world_size, run):
    """zero_lab.train_on_rank with OffByOneZero in place of ZeroOptimizer."""
    with replaced(zero_lab, "ZeroOptimizer", OffByOneZero):
        return zero_lab.train_on_rank(rank, world_size, run)


def train_wrong_ddp(rank, world_size, run):
    """ddp_lab.train_ranks with OffByOneBuckets in place of BucketedDDP."""
    with replaced(ddp_lab, "BucketedDDP", OffByOneBuckets):
        return ddp_lab.train_ranks(rank, world_size, run)

"""A learner's lesson 77 file, written as a learner would: broadcast, naive and bucketed DDP.

The practice tests grade it as it is (every check passes) and with one mistake each (the
variants of tests/practice/test_ddp.py), to show that each check catches its mistake.
"""

import torch
import torch.distributed as dist
from torch import nn


def when_backward_ends(callback):
    """Run `callback()` once autograd has finished the backward pass now running."""
    torch.autograd.Variable._execution_engine.queue_callback(callback)


def broadcast_parameters(module, src=0, group=None):
    for param in module.parameters():
        dist.broadcast(param.data, src, group=group)


class NaiveDDP(nn.Module):
    def __init__(self, module, group=None):
        super().__init__()
        self.module, self.group = module, group
        broadcast_parameters(module, group=group)
        for param in module.parameters():
            param.register_post_accumulate_grad_hook(self._average)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def _average(self, param):
        dist.all_reduce(param.grad, group=self.group)
        param.grad /= dist.get_world_size(self.group)


class BucketedDDP(nn.Module):
    def __init__(self, module, bucket_cap_mb=25.0, group=None):
        super().__init__()
        self.module, self.group = module, group
        broadcast_parameters(module, group=group)
        cap = int(bucket_cap_mb * 2 ** 20)
        self.buckets, current, size = [], [], 0
        for param in reversed(list(module.parameters())):
            nbytes = param.numel() * param.element_size()
            if current and size + nbytes > cap:
                self.buckets.append(current)
                current, size = [], 0
            current.append(param)
            size += nbytes
        self.buckets.append(current)
        self.bucket_of = {id(p): i for i, bucket in enumerate(self.buckets) for p in bucket}
        self.ready = [0] * len(self.buckets)
        self.pending = []
        for param in module.parameters():
            param.register_post_accumulate_grad_hook(self._on_gradient)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def _on_gradient(self, param):
        if sum(self.ready) == 0:  # the first gradient of this backward
            when_backward_ends(self._finish)
        index = self.bucket_of[id(param)]
        self.ready[index] += 1
        if self.ready[index] == len(self.buckets[index]):
            bucket = self.buckets[index]
            flat = torch.cat([p.grad.reshape(-1) for p in bucket])
            work = dist.all_reduce(flat, group=self.group, async_op=True)
            self.pending.append((bucket, flat, work))

    def _finish(self):
        for bucket, flat, work in self.pending:
            work.wait()
            flat /= dist.get_world_size(self.group)
            for param, piece in zip(bucket, torch.split(flat, [p.numel() for p in bucket])):
                param.grad.copy_(piece.view_as(param))
        self.pending = []
        self.ready = [0] * len(self.buckets)

"""A learner's lesson 78a file, written as a learner would: ZeRO-3's gather and free of one
layer, with torch.distributed's built-in all-gather and three hooks.

The practice tests grade it as it is (every check passes) and with one mistake each (the
variants of tests/practice/test_practice_zero3.py), to show that each check catches its mistake.
"""

import math

import torch
import torch.distributed as dist
from torch import nn


class ShardedUnit:
    def __init__(self, module: nn.Module, world_size: int, rank: int, group=None):
        self.module, self.world_size, self.rank, self.group = module, world_size, rank, group
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.shapes = [p.shape for p in self.params]  # free() leaves each parameter empty
        numel = sum(p.numel() for p in self.params)
        self.shard_numel = math.ceil(numel / world_size)
        flat = torch.cat([p.detach().reshape(-1) for p in self.params])
        padding = flat.new_zeros(self.shard_numel * world_size - numel)
        self.full = torch.cat([flat, padding])
        start = rank * self.shard_numel
        self.shard = self.full[start: start + self.shard_numel].clone()
        self.free()

    def gather(self) -> None:
        if self.full.untyped_storage().nbytes() > 0:
            return  # already whole
        self.full.untyped_storage().resize_(self.full.numel() * self.full.element_size())
        dist.all_gather_single(self.full, self.shard, group=self.group)
        offset = 0
        for param, shape in zip(self.params, self.shapes):
            numel = math.prod(shape)
            param.data = self.full[offset: offset + numel].view(shape)
            offset += numel

    def free(self) -> None:
        for param in self.params:
            param.data = self.full.new_empty(0)
        self.full.untyped_storage().resize_(0)

    def attach(self) -> None:
        def before_forward(module, inputs):
            self.gather()

        def after_forward(module, inputs, output):
            self.free()
            outputs = output if isinstance(output, (tuple, list)) else (output,)
            for tensor in outputs:
                if isinstance(tensor, torch.Tensor) and tensor.requires_grad:
                    tensor.register_hook(lambda grad: self.gather())

        self.module.register_forward_pre_hook(before_forward)
        self.module.register_forward_hook(after_forward)

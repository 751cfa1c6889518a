"""A learner's lesson 78 file, written as a learner would: ZeRO-1 with torch.distributed's built-ins.

The practice tests grade it as it is (every check passes) and with one mistake each (the
variants of tests/practice/test_zero.py), to show that each check catches its mistake.
"""

import math

import torch
import torch.distributed as dist


def flatten_params(module):
    return torch.cat([p.detach().reshape(-1) for p in module.parameters()])


def unflatten_into(module, flat):
    offset = 0
    with torch.no_grad():
        for param in module.parameters():
            param.copy_(flat[offset: offset + param.numel()].view_as(param))
            offset += param.numel()


class ZeroOptimizer:
    def __init__(self, model, world_size, rank, lr, betas=(0.9, 0.999), eps=1e-8, group=None):
        self.model, self.world_size, self.rank, self.group = model, world_size, rank, group
        self.lr, self.betas, self.eps = lr, betas, eps
        self.params = list(model.parameters())
        self.numel = sum(p.numel() for p in self.params)
        self.shard_numel = math.ceil(self.numel / world_size)
        self.padding = self.shard_numel * world_size - self.numel
        flat = torch.cat([flatten_params(model).float(), torch.zeros(self.padding)])
        start = rank * self.shard_numel
        self.master = flat[start: start + self.shard_numel].clone()
        self.exp_avg = torch.zeros_like(self.master)
        self.exp_avg_sq = torch.zeros_like(self.master)
        self.step_count = 0

    def step(self):
        grads = torch.cat([p.grad.reshape(-1) for p in self.params])
        grads = torch.cat([grads, grads.new_zeros(self.padding)])
        shard = grads.new_empty(self.shard_numel)
        dist.reduce_scatter_single(shard, grads, group=self.group)
        grad = shard.float() / self.world_size
        self.step_count += 1
        beta1, beta2 = self.betas
        self.exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
        self.exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        m_hat = self.exp_avg / (1 - beta1 ** self.step_count)
        v_hat = self.exp_avg_sq / (1 - beta2 ** self.step_count)
        self.master -= self.lr * m_hat / (v_hat.sqrt() + self.eps)
        dtype = self.params[0].dtype
        full = torch.empty(self.shard_numel * self.world_size, dtype=dtype)
        dist.all_gather_single(full, self.master.to(dtype), group=self.group)
        unflatten_into(self.model, full[: self.numel])

    def zero_grad(self):
        for param in self.params:
            param.grad = None

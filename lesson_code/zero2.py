"""ZeRO stage 2 (lesson 78): the gradients are sharded while backward runs, bucket by bucket.

Under stage 1 (`lesson_code.zero`) every rank holds the whole gradient from the end of backward
until its optimizer step has reduce-scattered it. Stage 2 never holds it whole. As backward
produces gradients, hooks copy them into buckets, in the order backward produces them (as
lesson 77's `BucketedDDP` fills its buckets), and free each parameter's `.grad` at once; as soon
as a bucket is full it is reduce-scattered, the rank keeps its chunk of the averaged gradient,
and the bucket is freed. So a rank holds its gradient shard, 1/N of all gradients, plus the
buckets not yet reduced: buckets are reduced strictly in order, so a bucket that fills before an
earlier one waits for it (one bucket at a time when gradients arrive in bucket order). The step
is stage 1's: Adam on this rank's fp32 master chunks, then an all-gather of the updated
parameters, bucket by bucket.

    optimizer = Zero2Optimizer(model, world_size, rank, lr=1e-3, bucket_cap_mb=1.0)  # in a rank
    loss.backward()                     # each full bucket is reduce-scattered during backward
    optimizer.step(); optimizer.zero_grad()

Layout: each bucket is a flat vector padded with zeros to a multiple of N, and rank r owns chunk
r of every bucket, so its master copy is its chunks of all buckets, one after another. (torch's
FSDP shards each parameter alike; DeepSpeed's stage 2 gives each rank one contiguous slice of
the whole flat vector instead.) In a step of one backward this moves what stage 1 moves, a
reduce-scatter and an all-gather of every bucket; backward passes before a step add up their
gradients into the shard, at the price of one reduce-scatter each.

`Zero3Optimizer` (`lesson_code.zero3`) builds stage 3 on this class. Run stage 2 on 4 ranks:
`python -m lesson_code.zero_lab --optimizer zero2`.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from lesson_code.collectives.comm import Communicator
from lesson_code.collectives.ledger import CommLedger
from lesson_code.ddp import bucket_groups
from lesson_code.harness.validate import require_positive
from lesson_code.zero import (adam_update, check_shard_arguments, storage_bytes,
                              trainable_parameters)


class ShardedGroup:
    """Parameters reduced and gathered together (a bucket of stage 2, a layer of stage 3), as one
    flat vector of `padded` elements, zeros after the `numel` real ones; rank r owns elements
    [r * shard_numel, (r + 1) * shard_numel), stored at `offset` in this rank's master copy."""

    def __init__(self, name: str, params: list[torch.Tensor], world_size: int, offset: int):
        self.name, self.params, self.offset = name, params, offset
        self.shapes = [p.shape for p in params]
        self.numels = [p.numel() for p in params]
        self.starts = [sum(self.numels[:i]) for i in range(len(params))]
        self.numel = sum(self.numels)
        self.shard_numel = math.ceil(self.numel / world_size)
        self.padded = self.shard_numel * world_size
        self.flat_grad: torch.Tensor | None = None  # filled during backward, freed when reduced
        self.missing: set[int] = set()
        # Stage 3 only: this rank's chunk of the parameters, and the buffer they are gathered into.
        self.shard: torch.Tensor | None = None
        self.full: torch.Tensor | None = None

    def flatten(self, tensors: list[torch.Tensor]) -> torch.Tensor:
        """`tensors` (one per parameter) as one new padded flat vector of `padded` elements."""
        flat = torch.cat([t.reshape(-1) for t in tensors])
        return torch.cat([flat, flat.new_zeros(self.padded - self.numel)])

    def pieces(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """Each parameter's slice of a padded flat vector, in its parameter's shape."""
        return [piece.view(shape) for piece, shape in
                zip(torch.split(flat[: self.numel], self.numels), self.shapes)]


class Zero2Optimizer:
    """Adam with optimizer state, fp32 master weights and gradients sharded over the ranks
    (ZeRO stage 2): each bucket of gradients is reduce-scattered as soon as backward fills it.

    Collective: construct, run backward and call `step()` on every rank, with the same model.
    Buckets take parameters in reverse registration order (about the order backward produces
    their gradients), up to `bucket_cap_mb` MiB (2**20 bytes, as torch's DDP counts) each (a
    larger parameter gets its own),
    and are reduced in that order on every rank. Parameters may be float32 or bfloat16 (the
    master chunks are float32). `comm`: "ring" (counted in `ledger`), "builtin", or a
    Communicator whose group has `world_size` ranks with this process as `rank`.
    Raises ValueError for a bad world size, rank, learning rate or bucket size. Backward raises
    RuntimeError when it leaves a parameter without a gradient (its bucket is never reduced);
    `step()` raises it when no backward ran since `zero_grad()`.
    """

    def __init__(self, model: nn.Module, world_size: int, rank: int, lr: float,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, *, bucket_cap_mb: float = 25.0,
                 comm: Communicator | str = "ring", ledger: CommLedger | None = None):
        require_positive("bucket_cap_mb", bucket_cap_mb, "1 for small models, 25 for large ones")
        self.comm = comm if isinstance(comm, Communicator) else Communicator(comm, ledger)
        check_shard_arguments(self.comm, world_size, rank, lr)
        self.model, self.world_size, self.rank = model, world_size, rank
        self.lr, self.betas, self.eps, self.weight_decay = lr, betas, eps, weight_decay
        self.params = trainable_parameters(model)
        self.groups = self._make_groups(int(bucket_cap_mb * 2 ** 20))
        self._slot_of = {id(p): (group, start, numel) for group in self.groups
                         for p, start, numel in zip(group.params, group.starts, group.numels)}
        # This rank's chunk of every group, one after another: fp32 master and Adam's moments.
        self.master = torch.cat([self._own_chunk(group, group.flatten(group.params))
                                 for group in self.groups]).detach().to(torch.float32)
        self.exp_avg = torch.zeros_like(self.master)
        self.exp_avg_sq = torch.zeros_like(self.master)
        self.grad_shard: torch.Tensor | None = None  # the averaged gradient of this rank's chunks
        self.step_count = 0
        self._next_to_reduce = 0  # groups are reduced in order, the same on every rank
        self._in_backward = False
        self._reset_groups()
        for param in self.params:
            param.register_post_accumulate_grad_hook(self._on_gradient)

    def step(self) -> None:
        """Adam on this rank's master chunks, then every rank's parameters made whole again.

        Collective: call on every rank after backward. Raises RuntimeError when no backward
        has run since the last `zero_grad()`.
        """
        if self.grad_shard is None:
            raise RuntimeError("no gradient to step with: call loss.backward() before step() "
                               "(zero_grad() forgets the gradient shard)")
        self.step_count += 1
        adam_update(self.master, self.grad_shard.to(torch.float32), self.exp_avg,
                    self.exp_avg_sq, self.step_count, self.lr, self.betas, self.eps,
                    self.weight_decay)
        self._publish_parameters()

    def zero_grad(self) -> None:
        """Forget the gradient shard (backward leaves no full gradient behind), and what a
        backward that raised half-way left in the buckets."""
        self.grad_shard = None
        self._reset_groups()
        for param in self.params:
            param.grad = None

    def optimizer_state_bytes(self) -> int:
        """Bytes of master chunks and moments on this rank, read from storage."""
        return storage_bytes(self.master, self.exp_avg, self.exp_avg_sq)

    def gradient_bytes(self) -> int:
        """Bytes of gradients this rank holds now: its shard, and any bucket not yet reduced."""
        held = [g.flat_grad for g in self.groups if g.flat_grad is not None]
        held += [p.grad for p in self.params if p.grad is not None]
        return storage_bytes(*held, *([self.grad_shard] if self.grad_shard is not None else []))

    def _make_groups(self, cap_bytes: int) -> list[ShardedGroup]:
        """Buckets of consecutive parameters in reverse registration order (lesson 77's rule)."""
        params = list(reversed(self.params))
        indices = bucket_groups([p.numel() * p.element_size() for p in params], cap_bytes)
        return self._groups_of([(f"bucket {i}", [params[j] for j in group])
                                for i, group in enumerate(indices)])

    def _groups_of(self, named: list[tuple[str, list[torch.Tensor]]]) -> list[ShardedGroup]:
        """ShardedGroups of (name, parameters), placed one after another in the master copy."""
        groups, offset = [], 0
        for name, params in named:
            groups.append(ShardedGroup(name, params, self.world_size, offset))
            offset += groups[-1].shard_numel
        return groups

    def _own_chunk(self, group: ShardedGroup, flat: torch.Tensor) -> torch.Tensor:
        """This rank's chunk of a group's padded flat vector (a view)."""
        start = self.rank * group.shard_numel
        return flat[start: start + group.shard_numel]

    def _on_gradient(self, param: torch.Tensor) -> None:
        """Backward hook: move `param.grad` into its bucket; reduce the buckets that are full."""
        group, start, numel = self._slot_of[id(param)]
        if not self._in_backward:
            # The first gradient of this backward: check at its end that every bucket reduced.
            self._in_backward = True
            torch.autograd.Variable._execution_engine.queue_callback(self._finish_backward)
        if group.flat_grad is None:
            group.flat_grad = param.grad.new_zeros(group.padded)  # the padding stays zero
        group.flat_grad[start: start + numel].copy_(param.grad.reshape(-1))
        param.grad = None  # this parameter's full gradient now lives only in the bucket
        group.missing.discard(id(param))
        while self._next_to_reduce < len(self.groups) and \
                not self.groups[self._next_to_reduce].missing:
            self._reduce(self.groups[self._next_to_reduce])
            self._next_to_reduce += 1

    def _reduce(self, group: ShardedGroup) -> None:
        """Reduce-scatter a full bucket: keep this rank's averaged chunk, free the bucket."""
        with torch.profiler.record_function(f"reduce-scatter {group.name}"):
            if self.grad_shard is None:
                self.grad_shard = group.flat_grad.new_zeros(self.master.numel())
            own = self.grad_shard[group.offset: group.offset + group.shard_numel]
            # Added, not copied: backward passes before a step sum their gradients, as in torch.
            own.add_(self.comm.reduce_scatter(group.flat_grad, op="avg"))  # (shard_numel,)
            group.flat_grad = None  # the bucket is freed: only this rank's chunk remains

    def _finish_backward(self) -> None:
        """Runs when autograd has finished backward: every bucket must have been reduced."""
        unreduced = self.groups[self._next_to_reduce:]
        self._reset_groups()
        if unreduced:
            names = [group.name for group in unreduced]
            raise RuntimeError(
                f"backward left {', '.join(names[:5])} without every gradient, so this rank did "
                "not reduce-scatter them (a rank whose backward reached them waits for it until "
                "its communicator times out). Every trainable parameter must take part in the "
                "loss on every rank (freeze unused ones with requires_grad_(False) before "
                "building the optimizer)")

    def _reset_groups(self) -> None:
        self._next_to_reduce, self._in_backward = 0, False
        for group in self.groups:
            group.flat_grad = None
            group.missing = {id(p) for p in group.params}

    def _publish_parameters(self) -> None:
        """All-gather every bucket's updated chunks, in the model's dtype, into the parameters."""
        dtype = self.params[0].dtype
        with torch.no_grad():
            for group in self.groups:
                chunk = self.master[group.offset: group.offset + group.shard_numel].to(dtype)
                full = self.comm.all_gather(chunk, [group.shard_numel] * self.world_size)
                for param, piece in zip(group.params, group.pieces(full)):
                    param.copy_(piece)

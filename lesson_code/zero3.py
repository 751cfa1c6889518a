"""ZeRO stage 3 (lesson 78): the parameters are sharded too, and gathered one layer at a time.

Stage 2 (`lesson_code.zero2`) still keeps every parameter whole on every rank. Stage 3 keeps only
this rank's 1/N of each layer's parameters. The layers are the model's units in order
(`models.as_layers`: MiniGPT's embedding, blocks and head; the MLP's Linear layers), and each is
one of stage 2's groups, padded to a multiple of N. Around every unit:

    forward    gather its parameters (all-gather), compute, free them
    backward   gather them again (a hook on the unit's output fires when that output's gradient
               is ready, just before the unit's own backward), compute, reduce-scatter the
               unit's gradients (stage 2's hooks), free the parameters

so a rank holds its shards plus the one or two units being used. The step is stage 1's Adam on
this rank's fp32 master chunks, copied into its parameter shards: no all-gather, since the next
forward gathers anyway. Per step each rank sends (N-1)/N of the parameters' bytes three times
(two all-gathers and a reduce-scatter) where DDP's all-reduce sends it twice: 1.5x the traffic.

Between its uses a parameter is an empty tensor, as in torch's first FSDP; its values live in
the shards, and `full_parameters()` gathers them all for a check or a checkpoint.

    optimizer = Zero3Optimizer(model, world_size, rank, lr=1e-3)   # in a rank: shards `model`
    loss = model(x, y)[1]                  # units gathered and freed one after another
    loss.backward(); optimizer.step(); optimizer.zero_grad()

torch's FSDP2 (`torch.distributed.fsdp.fully_shard` on each unit, then on the model) does the
same with each parameter a DTensor sharded along its first dimension, and overlaps the next
unit's gather with computation. Run stage 3 on 4 ranks: `python -m lesson_code.zero_lab
--optimizer zero3`.
"""

from __future__ import annotations

from functools import partial

import torch
from torch import nn

from lesson_code.collectives.comm import Communicator
from lesson_code.collectives.ledger import CommLedger
from lesson_code.models import as_layers
from lesson_code.zero import storage_bytes
from lesson_code.zero2 import ShardedGroup, Zero2Optimizer


class Zero3Optimizer(Zero2Optimizer):
    """Adam with optimizer state, master weights, gradients and parameters sharded over the ranks
    (ZeRO stage 3). Shards `model` in place: build it, broadcast it, then hand it over.

    Collective: construct, run forward and backward, and call `step()` on every rank.
    `units` are the modules gathered one at a time, in the order forward runs them (default:
    `models.as_layers(model)`, those with trainable parameters); every trainable parameter
    must belong to exactly one. Other arguments as for `Zero2Optimizer`.
    Raises ValueError for a bad world size, rank or learning rate, for units that are not the
    model's, share a parameter or leave one out, and for a model without a default unit list.
    """

    def __init__(self, model: nn.Module, world_size: int, rank: int, lr: float,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, *, units: list[nn.Module] | None = None,
                 comm: Communicator | str = "ring", ledger: CommLedger | None = None):
        self.units = _checked_units(model, units)
        super().__init__(model, world_size, rank, lr, betas, eps, weight_decay, comm=comm,
                         ledger=ledger)
        for group in self.groups:
            group.full = group.flatten(group.params).detach()  # (padded,): freed between uses
            group.shard = self._own_chunk(group, group.full).clone()  # kept: 1/N of the unit
            self._free(group, "init")
        for unit, group in zip(self.units, reversed(self.groups)):
            unit.register_forward_pre_hook(partial(self._before_forward, group))
            unit.register_forward_hook(partial(self._after_forward, group))

    def full_parameters(self) -> torch.Tensor:
        """Every trainable parameter gathered, as one flat vector in `model.parameters()` order
        (the model's dtype). Collective: call on every rank (it all-gathers every unit)."""
        pieces = {}
        for group in self.groups:
            full = self.comm.all_gather(group.shard, [group.shard_numel] * self.world_size)
            for param, piece in zip(group.params, group.pieces(full)):
                pieces[id(param)] = piece.reshape(-1)
        return torch.cat([pieces[id(param)] for param in self.params])

    def parameter_bytes(self) -> int:
        """Bytes of parameters this rank holds now: its shards, and any unit gathered."""
        return storage_bytes(*(g.shard for g in self.groups), *(g.full for g in self.groups))

    def _make_groups(self, cap_bytes: int) -> list[ShardedGroup]:
        """One group per unit, in the order backward reaches them: a unit is stage 2's bucket
        (`bucket_cap_mb` plays no part)."""
        names = {id(module): name for name, module in self.model.named_modules()}
        return self._groups_of([(names[id(unit)], _trainable_of(unit))
                                for unit in reversed(self.units)])

    def _before_forward(self, group: ShardedGroup, module: nn.Module, args) -> None:
        self._gather(group, "forward")

    def _after_forward(self, group: ShardedGroup, module: nn.Module, args, output) -> None:
        self._free(group, "forward")
        for tensor in output if isinstance(output, (tuple, list)) else (output,):
            if isinstance(tensor, torch.Tensor) and tensor.requires_grad:
                # Fires when backward has this output's gradient: the unit's backward is next.
                tensor.register_hook(lambda grad: self._gather(group, "backward"))

    def _gather(self, group: ShardedGroup, when: str) -> None:
        """All-gather the unit's shards into its full buffer; point its parameters into it."""
        if group.full.untyped_storage().nbytes():
            return  # gathered already (a unit whose outputs reach backward more than once)
        with torch.profiler.record_function(f"gather {when} {group.name}"):
            # Refill the same storage: autograd saved views of it during forward.
            group.full.untyped_storage().resize_(group.padded * group.full.element_size())
            sizes = [group.shard_numel] * self.world_size
            group.full.copy_(self.comm.all_gather(group.shard, sizes))
            for param, piece in zip(group.params, group.pieces(group.full)):
                param.data = piece

    def _free(self, group: ShardedGroup, when: str) -> None:
        """Drop the unit's full parameters: each becomes an empty tensor, the buffer 0 bytes."""
        with torch.profiler.record_function(f"free {when} {group.name}"):
            empty = group.full.new_empty(0)
            for param in group.params:
                param.data = empty
            group.full.untyped_storage().resize_(0)

    def _reduce(self, group: ShardedGroup) -> None:
        """Stage 2's reduce-scatter of the unit's gradients; then its parameters are freed."""
        super()._reduce(group)
        self._free(group, "backward")

    def _finish_backward(self) -> None:
        for group in self.groups:  # a unit gathered for a backward that never reached it
            if group.full.untyped_storage().nbytes():
                self._free(group, "backward")
        super()._finish_backward()

    def _publish_parameters(self) -> None:
        """Write the updated master chunks into this rank's parameter shards (model dtype)."""
        with torch.no_grad():
            for group in self.groups:
                group.shard.copy_(self.master[group.offset: group.offset + group.shard_numel])


def _trainable_of(unit: nn.Module) -> list[torch.Tensor]:
    return [p for p in unit.parameters() if p.requires_grad]


def default_units(model: nn.Module) -> list[nn.Module]:
    """The modules stage 3 gathers one at a time unless told otherwise: the model's layers in
    order (`models.as_layers`) that hold trainable parameters. ValueError for another model."""
    try:
        layers = as_layers(model)
    except ValueError:
        raise ValueError(f"no default units for {type(model).__name__}: pass units=[...], the "
                         "submodules to gather one at a time, in the order forward runs them "
                         "(e.g. its embedding, transformer blocks and head)") from None
    return [layer for layer in layers if _trainable_of(layer)]


def _checked_units(model: nn.Module, units: list[nn.Module] | None) -> list[nn.Module]:
    """`units` (default: `default_units`), checked to be modules of `model` that hold every
    trainable parameter exactly once; ValueError naming what is wrong."""
    units = default_units(model) if units is None else list(units)
    names = {id(module): name for name, module in model.named_modules()}
    strangers = [type(unit).__name__ for unit in units if id(unit) not in names]
    if strangers:
        raise ValueError(f"units {strangers} are not submodules of {type(model).__name__}: pass "
                         "modules of the model being sharded")
    owner: dict[int, str] = {}
    for unit in units:
        for param in _trainable_of(unit):
            if id(param) in owner:
                raise ValueError(f"a parameter of {names[id(unit)]} also belongs to unit "
                                 f"{owner[id(param)]}: units must not nest or share parameters")
            owner[id(param)] = names[id(unit)]
    left_out = [name for name, p in model.named_parameters() if p.requires_grad
                and id(p) not in owner]
    if left_out:
        raise ValueError(f"parameters {left_out[:5]} belong to no unit: add the modules that hold "
                         "them to units, or freeze them (requires_grad_(False))")
    return units

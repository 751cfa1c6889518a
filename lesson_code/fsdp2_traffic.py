"""What FSDP2's collectives carry under a mixed-precision policy (lesson 78a, exercise 5).

`fully_shard` calls torch.distributed directly, so the course's communicator ledger never sees
its traffic. `mixed_precision_traffic` trains one step of a model under `fully_shard` with
`MixedPrecisionPolicy(param_dtype, reduce_dtype)` and records, from the dispatcher, the dtype and
the bytes of every all-gather and reduce-scatter FSDP2 issues: the numbers lesson 78c's cluster
model assumed (2 bytes per element gathered twice, 4 reduced). Runs on gloo (CPU) and NCCL:

    launch.spawn(ddp_lab.each_run, fsdp2_traffic.mixed_precision_traffic, [run], world_size=4)
"""

from __future__ import annotations

from collections import defaultdict

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from lesson_code.ddp import broadcast_parameters
from lesson_code.runtime.devices import current_device
from lesson_code.zero3 import default_units
from lesson_code.zero_lab import ZeroRun, run_loss, run_model

# torch.distributed's all-gather and reduce-scatter as the dispatcher sees them (c10d's ops):
# FSDP2 issues the first two of each; the coalesced forms carry lists of tensors.
GATHERS = ("_allgather_base_", "allgather_into_tensor_coalesced_")
SCATTERS = ("_reduce_scatter_base_", "reduce_scatter_tensor_coalesced_")


class CollectiveBytes(TorchDispatchMode):
    """Counts, per collective and dtype, the calls and the bytes of the whole (unsharded) tensor:
    an all-gather's output, a reduce-scatter's input."""

    def __init__(self):
        super().__init__()
        self.seen = defaultdict(lambda: {"calls": 0, "bytes": 0})

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._overloadpacket.__name__
        whole = args[0] if name in GATHERS else args[1] if name in SCATTERS else None
        if whole is not None:
            tensors = whole if isinstance(whole, (list, tuple)) else [whole]
            kind = "all_gather" if name in GATHERS else "reduce_scatter"
            entry = self.seen[kind, str(tensors[0].dtype).removeprefix("torch.")]
            entry["calls"] += 1
            entry["bytes"] += sum(t.numel() * t.element_size() for t in tensors)
        return func(*args, **(kwargs or {}))


def mixed_precision_traffic(rank: int, world_size: int, run: ZeroRun,
                            param_dtype: torch.dtype = torch.bfloat16,
                            reduce_dtype: torch.dtype = torch.float32) -> dict:
    """One training step of `run`'s model under `fully_shard` (each of Zero3Optimizer's units, then
    the root) with `MixedPrecisionPolicy(param_dtype, reduce_dtype)` and torch.optim.Adam.

    Returns {"collectives": {(collective, dtype): {"calls", "bytes"}}, "parameters": the model's
    parameter count, "shard_dtype": the dtype of the sharded parameters Adam steps,
    "grad_dtype": that of their gradients}. Collective: call on every rank.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    model = run_model(run)
    broadcast_parameters(model)
    count = sum(p.numel() for p in model.parameters())
    mesh = init_device_mesh(current_device().type, (world_size,))
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    for unit in default_units(model):
        fully_shard(unit, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    optimizer = torch.optim.Adam(model.parameters(), lr=run.lr)
    with CollectiveBytes() as counter:
        run_loss(run, model, 0, rank, world_size).backward()
        optimizer.step()
    shard = next(model.parameters())
    return {"collectives": dict(counter.seen), "parameters": count,
            "shard_dtype": str(shard.dtype).removeprefix("torch."),
            "grad_dtype": str(shard.grad.dtype).removeprefix("torch.")}

"""A flat-sharded optimizer's state in sharded checkpoints (lessons 80-81): save, load, merge.

ZeRO keeps its optimizer state as slices of flat vectors: each rank its slice of the fp32 master
weights and of both Adam moments. The optimizer hands that state over as a plain dict, the way
torch optimizers do with `state_dict()` (`zero.ZeroOptimizer.state_dict`: the flat slices named
in FLAT_KEYS, where the slice sits in "shard", the "step" and the "hyperparameters"); this
module stores it and gives it back, and knows nothing of the optimizer that made it. Like
DeepSpeed, a checkpoint holds one optimizer file per rank (its slices, and its RNG state) and one
replicated file of model weights written by rank 0. The manifest's layout says which elements
of the flat vector each shard holds and how many of them are padding (the last shard's); `extra` keeps
the step, the data position, the parameter table and the hyper-parameters, all a bit-for-bit
resume or a consolidation needs.

    save_flat_state(root, model, optimizer.state_dict(), step=10, rank=r, world_size=n)
    parts = flat_snapshot(model, optimizer.state_dict(), rank=r, to_cpu=True)  # to save later
    state, weights, extra = load_flat_state(folder, rank=r, world_size=n)
    optimizer.load_state_dict(state); check_weights(model, weights, folder)
    model_state, adam_state = consolidate(folder)        # one process: torch.optim.Adam loads it
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from lesson_code.checkpoint.files import DISK, Disk, read_manifest, read_verified
from lesson_code.checkpoint.lock import LOCK_TIMEOUT_S
from lesson_code.checkpoint.shards import (flat_layout, join_flat, load_sharded, save_sharded,
                                           shard_name)
from lesson_code.checkpoint.staging import REPLICATED
from lesson_code.runtime.devices import current_device

FLAT_KEYS = ["master", "exp_avg", "exp_avg_sq"]


def save_flat_state(root: Path | str, model: nn.Module, state: dict, *, step: int, rank: int,
                    world_size: int, extra: dict | None = None, group=None,
                    disk: Disk = DISK, lock_timeout_s: float = LOCK_TIMEOUT_S) -> Path:
    """Save this rank's slices of a flat-sharded optimizer `state` (and, on rank 0, the model's
    weights) as checkpoint `step` of `world_size` ranks.

    Collective: call on every rank of `group` (default: the default group), each with its own
    `state`. `disk` does the file operations (`files.Disk`); `lock_timeout_s` bounds rank 0's
    wait for the folder's lock. Returns the published folder; raises what `shards.save_sharded`
    raises.
    """
    return save_sharded(root, **flat_snapshot(model, state, rank=rank, extra=extra), step=step,
                        rank=rank, world_size=world_size, group=group, disk=disk,
                        lock_timeout_s=lock_timeout_s)


def flat_snapshot(model: nn.Module, state: dict, *, rank: int, extra: dict | None = None,
                  to_cpu: bool = False) -> dict:
    """What `save_flat_state` writes for this rank, as keyword arguments of `save_sharded`:
    `shard` (the flat slices and this rank's RNG state, taken now), its `layout`, `replicated`
    (rank 0: the model's weights) and `extra` (with the step count, the parameter table and the
    hyper-parameters). With `to_cpu`, every tensor is a copy on the CPU, which the training loop
    cannot change: what a save that writes in the background needs.
    """
    shard = {key: state[key] for key in FLAT_KEYS}
    shard["rng_state"] = torch.get_rng_state()
    if current_device().type == "cuda":  # a GPU's own generator (dropout there draws from it)
        shard["cuda_rng_state"] = torch.cuda.get_rng_state(current_device())
    layout = {**flat_layout(state["shard"]["numel"], state["shard"]["start"],
                            state["shard"]["shard_numel"]), "flat": FLAT_KEYS}
    table = [[name, list(p.shape), str(p.dtype).removeprefix("torch.")]
             for name, p in model.named_parameters() if p.requires_grad]
    everything = {**(extra or {}), "optimizer_step": state["step"], "parameters": table,
                  "hyperparameters": state["hyperparameters"]}
    replicated = dict(model.state_dict()) if rank == 0 else None
    if to_cpu:
        shard = {key: value.detach().to("cpu", copy=True) for key, value in shard.items()}
        if replicated is not None:
            replicated = {key: value.detach().to("cpu", copy=True)
                          for key, value in replicated.items()}
    return {"shard": shard, "layout": layout, "replicated": replicated, "extra": everything}


def load_flat_state(folder: Path | str, *, rank: int, world_size: int,
                    group=None) -> tuple[dict, dict, dict]:
    """(the optimizer state of this rank, the model's weights, the extra dict) saved by
    `save_flat_state`; restores this rank's RNG state, or, from a checkpoint resharded to another
    world size (`tools.reshard`), seeds this rank's generators from its own `rng_seed`.

    Collective: call on every rank of `group`; each loads the shard of `rank` and needs a
    checkpoint of `world_size` ranks. The ranks agree on the files first: a missing or damaged
    one raises the same CheckpointError, naming it, on every rank. The state has the form of
    `save_flat_state`'s, for the optimizer's `load_state_dict`.
    """
    shard, replicated, manifest = load_sharded(folder, rank=rank, world_size=world_size,
                                               group=group)
    layout = next(e for e in manifest["files"] if e["name"] == shard_name(rank, world_size))["layout"]
    extra = manifest["extra"]
    state = {"step": extra["optimizer_step"], **{key: shard[key] for key in FLAT_KEYS},
             "shard": {"rank": rank, "world_size": world_size, "numel": layout["numel"],
                       "shard_numel": layout["length"]}}
    if "rng_state" not in shard:  # resharded: a stream of its own, on the CPU and every GPU
        torch.manual_seed(int(shard["rng_seed"]))
    else:
        torch.set_rng_state(shard["rng_state"])
        if "cuda_rng_state" in shard and current_device().type == "cuda":
            torch.cuda.set_rng_state(shard["cuda_rng_state"], current_device())
    return state, replicated, extra


def check_weights(model: nn.Module, weights: dict, folder: Path | str) -> None:
    """Load the saved `weights` into `model`, which must already hold them: the optimizer's
    master copy, cast to the model's dtype, written there by its `load_state_dict`. A checkpoint
    whose two halves disagree raises ValueError naming the weight."""
    from_master = {name: p.detach().clone() for name, p in model.named_parameters()}
    model.load_state_dict(weights)
    for name, value in from_master.items():
        if not torch.equal(value, dict(model.named_parameters())[name]):
            raise ValueError(f"{Path(folder) / REPLICATED}: weight {name!r} differs from the fp32 "
                             "master shards cast to the model's dtype; the checkpoint is inconsistent")


def consolidate(folder: Path | str) -> tuple[dict[str, torch.Tensor], dict]:
    """Merge a flat-sharded checkpoint into one model state dict and one torch.optim.Adam
    state dict.

    One process, no group. The Adam state dict has torch's format (state per parameter index:
    step, exp_avg, exp_avg_sq; one param group with the saved hyper-parameters), so
    `torch.optim.Adam(model.parameters(), ...).load_state_dict(adam_state)` accepts it. The model
    state dict holds the fp32 master weights cast to each parameter's saved dtype.

    Memory: the shards are read, about one copy of the optimizer state, and each slice is freed
    as it is copied into its whole vector (`join_flat`); the returned tensors are views of those
    vectors (a cast to another dtype excepted), so the peak stays about one copy of the state.
    Save the two dicts whole (torch.save writes a shared vector once), or clone a tensor that is
    to be saved alone: a view would take its whole vector along.
    """
    folder = Path(folder)
    manifest = read_manifest(folder)
    entries = {entry["name"]: entry for entry in manifest["files"]}
    world_size, extra = manifest["world_size"], manifest["extra"]
    shards = [read_verified(folder, entries[shard_name(r, world_size)]) for r in range(world_size)]
    numel = entries[shard_name(0, world_size)]["layout"]["numel"]
    flat = {key: join_flat(shards, key, numel) for key in FLAT_KEYS}
    model_state, adam_state, offset = {}, {}, 0
    for index, (name, shape, dtype) in enumerate(extra["parameters"]):
        count = int(torch.Size(shape).numel())
        piece = {key: value[offset: offset + count].view(shape) for key, value in flat.items()}
        model_state[name] = piece["master"].to(getattr(torch, dtype))
        adam_state[index] = {"step": torch.tensor(float(extra["optimizer_step"])),
                             "exp_avg": piece["exp_avg"], "exp_avg_sq": piece["exp_avg_sq"]}
        offset += count
    hyper = extra["hyperparameters"]
    group = {"lr": hyper["lr"], "betas": tuple(hyper["betas"]), "eps": hyper["eps"],
             "weight_decay": hyper["weight_decay"], "amsgrad": False, "maximize": False,
             "foreach": None, "capturable": False, "differentiable": False, "fused": None,
             "decoupled_weight_decay": False, "params": list(range(len(extra["parameters"])))}
    return model_state, {"state": adam_state, "param_groups": [group]}

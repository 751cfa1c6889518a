"""Where a capstone run starts (lesson 81): at step 0, or where the run it continues stopped.

    python -m lesson_code.capstone --out-dir run    # starts fresh, or continues the run in run/
    torchrun --standalone --nproc-per-node=4 --max-restarts=2 -m lesson_code.capstone --out-dir run

A run that dies (a rank killed, a node lost) keeps its sharded checkpoints. Started again with
the same --out-dir, by hand or by torchrun's agent restarting the group, the command continues
from the newest checkpoint that verifies (`latest_checkpoint`, which skips a damaged or
unpublished one): weights, optimizer shard and RNG state from the files, and from the
checkpoint's run state the data position, the divergence guard, the learning-rate spike and
every step before it (`train.restore_run_state`). Only a checkpoint of this very run is
continued: before any rank starts, `check_folder` reads what each manifest there says of its run
and stops on the first difference from this one, naming the setting (`CapstoneConfig.trajectory`:
seed, model shape, batch, learning rate, ...) or both world sizes. `--fresh` deletes the folder's
checkpoints instead, and only on the group's first attempt, so a restart never deletes one.

By default each run is checked against another run: a fresh one against a replay from one of
its own checkpoints (`train.run_and_resume`: the steps after that checkpoint once more), a continued one against an
uninterrupted run from step 0 in a scratch folder (`continue_and_check`, a whole run more);
`train.compare_resumed` compares the two. `check=False` (the command's --no-check) trains the run
alone: what a cluster needs, where every restart would otherwise train the job again from step 0.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path

import torch
import torch.distributed as dist

from lesson_code import launch
from lesson_code.capstone.config import CapstoneConfig
from lesson_code.capstone.train import SCRATCH, clear_folder, run_and_resume, run_rank
from lesson_code.checkpoint import CheckpointError, load_sharded, read_manifest
from lesson_code.checkpoint.staging import step_folder
from lesson_code.checkpoint.tools import hidden_copies, latest_checkpoint, list_checkpoints
from lesson_code.runtime.devices import current_device

FLAGS = {"seed": "--seed", "accumulation": "--accumulation", "lr_spike_step": "--lr-spike-step"}


def restart_count() -> int:
    """How often torchrun's agent has restarted this process's workers (TORCHELASTIC_RESTART_COUNT;
    0 outside torchrun). Each agent counts its own: after another node's failure, a node's count
    may still read 0, so a run takes the highest over its ranks (`start_or_continue`)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def world_size_name() -> str:
    """How the run's world size was set, for a message: --world-size, or torchrun's flags."""
    if launch.under_torchrun():
        return "torchrun's WORLD_SIZE, set by torchrun's --nnodes x --nproc-per-node"
    return "--world-size"


def check_folder(config: CapstoneConfig) -> None:
    """Raise ValueError unless every checkpoint under out_dir/checkpoints is one this run may
    continue (`check_checkpoint`). One process, no group: the command calls it before any rank
    starts. A checkpoint whose manifest cannot be read is left to `latest_checkpoint`, which
    skips it."""
    root = Path(config.out_dir) / "checkpoints"
    for _, folder in list_checkpoints(root) + hidden_copies(root):
        try:
            manifest = read_manifest(folder)
        except CheckpointError:
            continue
        check_checkpoint(manifest, folder, config)


def check_checkpoint(manifest: dict, folder: Path | str, config: CapstoneConfig) -> None:
    """Raise ValueError unless the checkpoint `manifest` (of `folder`) was saved by a capstone run
    with this run's world size and `trajectory()`; the message names the first setting that
    differs, both values, and what to do."""
    state = manifest["extra"].get("run")
    elsewhere = (f"pass another --out-dir for a new run, or --fresh to delete the checkpoints in "
                 f"{Path(folder).parent}")
    if state is None:
        raise ValueError(f"{folder} was not saved by lesson_code.capstone (its manifest holds no "
                         f"capstone run state), so no run continues from it: {elsewhere}")
    if manifest["world_size"] != config.world_size:
        raise ValueError(
            f"{folder} was saved by {manifest['world_size']} ranks, but this run has "
            f"{config.world_size} ({world_size_name()}): continue it on {manifest['world_size']} "
            f"ranks (a step's batch is world size x {config.batch_per_rank} sequences, so another "
            f"world size would train on other batches), or {elsewhere}")
    ours = json.loads(json.dumps(config.trajectory()))  # as the manifest's JSON holds it
    for key, value in ours.items():
        if state["config"].get(key) != value:
            flag = f" ({FLAGS[key]})" if key in FLAGS else ""
            raise ValueError(f"{folder} belongs to another run: its {key} is "
                             f"{state['config'].get(key)!r}, this run's is {value!r}{flag}; "
                             f"continue it with the same settings, or {elsewhere}")


def start_or_continue(rank: int, world_size: int, config: CapstoneConfig, fresh: bool = False,
                      check: bool = True) -> dict:
    """The capstone command on one rank: start at step 0 or continue, then check. Collective.

    Rank 0 deletes the checkpoints first if `fresh` and no rank has been restarted, then picks
    the newest checkpoint that verifies and tells the others. None: a fresh run with its replay
    check (`train.run_and_resume`), with `config`'s crash armed on the first attempt only. One:
    this run continues from it (`continue_and_check`). Returns that function's result with
    "started": where the run started ("from_step", None for step 0), the "folder", the newer
    checkpoints "skipped" and why, and torchrun's "restarts" (the highest over the ranks).
    Raises ValueError on every rank for a checkpoint of another run, RuntimeError when the
    checkpoint folder cannot be read.

    With `check` False nothing is compared and nothing else is trained: the result is
    {"run": this run's `run_rank` result, "started": ...}.
    """
    restarts = torch.tensor([restart_count()], device=current_device())
    dist.all_reduce(restarts, op=dist.ReduceOp.MAX)
    restarts = int(restarts.item())
    root = Path(config.out_dir) / "checkpoints"
    choice: list = [None]
    if rank == 0:
        if fresh and restarts == 0:  # a restart continues: it never deletes a checkpoint
            shutil.rmtree(root, ignore_errors=True)
        try:
            folder, skipped = latest_checkpoint(root)
            choice = [(None if folder is None else str(folder), skipped, None)]
        except (CheckpointError, OSError) as error:
            choice = [(None, [], f"{root}: {error}")]
    dist.broadcast_object_list(choice, src=0)
    folder, skipped, failure = choice[0]
    if failure is not None:
        raise RuntimeError(f"cannot look for a checkpoint to continue from: {failure}")
    started = {"from_step": None, "folder": folder, "skipped": skipped, "restarts": restarts}
    if folder is None:
        config = config if restarts == 0 else config.disarmed()
        if not check:
            return {"run": run_rank(rank, world_size, config), "started": started}
        return {**run_and_resume(rank, world_size, config), "started": started}
    manifest = read_manifest(folder)
    check_checkpoint(manifest, folder, config)  # a hidden copy just published was not checked yet
    started["from_step"] = manifest["step"]
    if not check:
        return {"run": run_rank(rank, world_size, config.disarmed(), folder), "started": started}
    return {**continue_and_check(rank, world_size, config.disarmed(), folder), "started": started}


def continue_and_check(rank: int, world_size: int, config: CapstoneConfig, folder: str) -> dict:
    """Train an uninterrupted run from step 0 in out_dir/verify to check against, then continue
    the run from the checkpoint `folder`. Collective: call on every rank.

    The uninterrupted run saves after the checkpoint's step too, and keeps every checkpoint (a
    rollback picks the newest either way), so that one is compared with `folder` first, while
    the run's own pruning has not yet deleted `folder`. Returns {"straight":
    the uninterrupted run, "resumed": this run (`run_rank` results), "same_start": whether
    `folder` holds, tensor for tensor, what the uninterrupted run saved after the same step, on
    every rank}. The scratch folder is deleted before the run continues.
    """
    step = read_manifest(folder)["step"]
    scratch = Path(config.out_dir) / SCRATCH
    clear_folder(scratch, rank)
    reference = dataclasses.replace(config, out_dir=str(scratch), save_also=(*config.save_also, step))
    reference = dataclasses.replace(reference, keep_last=len(reference.save_steps()))  # keeps `step`
    straight = run_rank(rank, world_size, reference)
    same = same_checkpoint(folder, step_folder(scratch / "checkpoints", step), rank, world_size)
    clear_folder(scratch, rank)  # every rank has read it; nothing of the check stays behind
    return {"straight": straight, "resumed": run_rank(rank, world_size, config, folder),
            "same_start": same}


def same_checkpoint(a: Path | str, b: Path | str, rank: int, world_size: int) -> bool:
    """Do two checkpoints hold equal tensors: every rank's shard and the replicated weights?

    Collective: call on every rank; each compares its own shard, and all agree (True only if
    every rank's were equal). Raises what `load_sharded` raises for a missing or damaged file.
    """
    verdict = torch.tensor([1.0 if same_shard(a, b, rank, world_size) else 0.0],
                           device=current_device())
    dist.all_reduce(verdict, op=dist.ReduceOp.MIN)
    return bool(verdict.item())


def same_shard(a: Path | str, b: Path | str, rank: int, world_size: int) -> bool:
    """Do two checkpoints of `world_size` ranks hold equal tensors in `rank`'s shard and in the
    replicated weights? Reads (and verifies) only those files; with no process group initialised
    one process may ask it for every rank."""
    first, second = (load_sharded(folder, rank=rank, world_size=world_size)[:2] for folder in (a, b))
    return all(part_a.keys() == part_b.keys()
               and all(torch.equal(part_a[key], part_b[key]) for key in part_a)
               for part_a, part_b in zip(first, second))

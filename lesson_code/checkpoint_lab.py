"""Rank functions of lesson 80: save and resume ZeRO training (also with dropout, and what a
training script's start-up, `tools.resume`, decides), time a save, crash one, compare
with DCP (its layout, its resharding at load time, a flipped byte, an FSDP2 model and its Adam
saved on 4 ranks and loaded on 2); and `shard_layout`, each
shard's place and padding as a manifest records them, and `dcp_chunks`, what DCP's .metadata
records of a saved tensor; and `save_costs`, a model of a save's and a load's seconds at scale.

`save_zero` and `load_zero` join lesson 78's ZeroOptimizer to lesson 80's checkpoints: the
optimizer hands its shard over as a plain dict (`state_dict`) and takes it back
(`load_state_dict`); `checkpoint.flat_state` stores that dict and knows nothing of ZeRO.

The notebook and tests run these through `launch.spawn`. Training is lesson 78's ZeRO-1 (a
`zero_lab.ZeroRun`); checkpoints go under a root folder the caller gives (a temporary one in
the notebook: files a lesson writes never land in the repository). Lesson 80a's training script
and lesson 80b's background saver are in `lesson_code.checkpoint_exercises`.

    launch.spawn(train_with_checkpoints, ZeroRun(steps=20), "/tmp/ckpt", [10], world_size=4)
"""

from __future__ import annotations

import hashlib
import os
import signal
from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd
import torch
import torch.distributed as dist
import torch.nn.functional as F

from lesson_code import language
from lesson_code.checkpoint.faults import CrashingDisk, flip_one_byte
from lesson_code.checkpoint.files import DISK, CheckpointError, Disk
from lesson_code.checkpoint.flat_state import (FLAT_KEYS, check_weights,
                                               load_flat_state, save_flat_state)
from lesson_code.checkpoint.shards import load_sharded
from lesson_code.checkpoint.tools import CheckpointPolicy, resume
from lesson_code.harness.validate import require_positive, require_positive_int
from lesson_code.runtime.devices import clock, current_device
from lesson_code.experiment import flat_parameters, train
from lesson_code.zero_lab import (ZeroRun, build_optimizer, gathered_parameters, parameter_digest,
                                  run_loss, run_model)


def save_zero(root: Path | str, model, optimizer, *, step: int, extra: dict | None = None,
              disk: Disk = DISK) -> Path:
    """Save a `zero.ZeroOptimizer`'s shard on every rank (and the model's weights on rank 0) as
    checkpoint `step`; return the published folder.

    Collective: call on every rank of the optimizer's group. The shard is saved as rank
    `optimizer.rank` of `optimizer.world_size`; raises what `shards.save_sharded` raises.
    """
    return save_flat_state(root, model, optimizer.state_dict(), step=step, rank=optimizer.rank,
                           world_size=optimizer.world_size, extra=extra,
                           group=optimizer.comm.group, disk=disk)


def load_zero(folder: Path | str, model, optimizer) -> dict:
    """Restore model, optimizer shard and RNG state saved by `save_zero`; return the extra dict.

    Collective: call on every rank of the optimizer's group (the optimizer all-gathers the
    master shards into the model); each loads the shard of `optimizer.rank` and needs a
    checkpoint of `optimizer.world_size` ranks. A missing or damaged file raises the same
    CheckpointError on every rank; weights that disagree with the master shards, ValueError.
    """
    state, weights, extra = load_flat_state(folder, rank=optimizer.rank,
                                            world_size=optimizer.world_size,
                                            group=optimizer.comm.group)
    optimizer.load_state_dict(state)
    check_weights(model, weights, folder)
    return extra


def train_steps(run: ZeroRun, model, optimizer, steps: range, after_step=None) -> list[float]:
    """Train `steps` (step s uses batch s) with `experiment.train`; the global mean losses.

    Collective: call on every rank; the optimizer knows this rank and the world size.
    """
    rank, world_size = optimizer.rank, optimizer.world_size
    return train(lambda step: run_loss(run, model, step, rank, world_size), optimizer, steps,
                 after_step=after_step)


def train_with_checkpoints(rank: int, world_size: int, run: ZeroRun, root: str,
                           save_after: list[int], saver: type | None = None) -> dict:
    """Train `run.steps` steps, saving a checkpoint after each step in `save_after`.

    Collective: call on every rank. Returns losses, the final parameters and the digest, how
    long each save held the training loop up ("blocked_s", seconds by step), how much of that a
    `saver` spent waiting for the save before ("waited_s"; empty without one), the time of the
    whole loop, saves and the last wait included ("run_s"), and this rank's random-number state
    at the end ("rng_state"). Each rank's random stream starts from
    run.seed + rank: its state is saved in the rank's shard, so that the same run writes the
    same bytes (torch.save into a buffer gives equal states equal bytes). A `saver` class (lesson
    80b's `checkpoint_exercises.BackgroundSaver`) is built as `saver(root, model, optimizer)`; saves
    then go through its `save(step, extra=...)`, and its `wait()` ends the run.
    """
    torch.manual_seed(run.seed + rank)
    model, optimizer = build_optimizer(run, run_model(run, seed_offset=rank), rank, world_size)
    built = saver(root, model, optimizer) if saver is not None else None
    blocked, waited = {}, {}

    def maybe_save(done: int) -> None:
        if done in save_after:
            start = clock()
            if built is None:
                save_zero(root, model, optimizer, step=done, extra={"next_step": done})
            else:
                built.save(done, extra={"next_step": done})
                waited[done] = built.waited_s
            blocked[done] = clock() - start
    start = clock()
    losses = train_steps(run, model, optimizer, range(run.steps), maybe_save)
    if built is not None:
        built.wait()
    return {"losses": losses, "params": flat_parameters(model), "digest": parameter_digest(model),
            "blocked_s": blocked, "waited_s": waited, "run_s": clock() - start,
            "rng_state": torch.get_rng_state()}


def resume_training(rank: int, world_size: int, run: ZeroRun, folder: str,
                    forget_step: bool = False) -> dict:
    """Load `folder` into a freshly built model and optimizer and train up to `run.steps`.

    Collective: call on every rank. The fresh model starts from another seed, so only the
    checkpoint can make the result match the run that never stopped. `forget_step` sets Adam's
    step count back to 0 after the load, as a checkpoint without it would: lesson 80 shows that
    the run then drifts. Returns the losses, the final parameters and digest, the step it resumed
    at, and this rank's random-number state at the end (`rng_state`), the moment at which
    `train_with_checkpoints` takes it, so that the two runs compare at the same step.
    """
    model, optimizer = build_optimizer(run, run_model(run, seed_offset=100 + rank), rank, world_size)
    extra = load_zero(folder, model, optimizer)
    if forget_step:
        optimizer.step_count = 0
    losses = train_steps(run, model, optimizer, range(extra["next_step"], run.steps))
    return {"losses": losses, "params": flat_parameters(model), "digest": parameter_digest(model),
            "resumed_at": extra["next_step"], "rng_state": torch.get_rng_state()}


def start_up_outcomes(rank: int, world_size: int, run: ZeroRun, roots: list[str],
                      lang: str = "en") -> list[dict]:
    """What a training script's start-up (`start_up`) decides for each of `roots`, in turn:
    the folder loaded ("loads", None for a fresh start), the 0-based index of the step training
    goes on from, the folders whose load failed, and the refusal that every rank raised where
    none loads, explained in `lang` (None, or None in the other fields).

    Collective: call on every rank.
    """
    outcomes = []
    for root in roots:
        try:
            _, _, folder, start, failed = start_up(run, root, rank, world_size)
            outcomes.append({"loads": folder and folder.name, "next step": start,
                             "load failed": [path.name for path in failed], "refused": None})
        except CheckpointError as error:
            outcomes.append({"loads": None, "next step": None, "load failed": None,
                             "refused": error.explain(lang)})
    return outcomes


def start_up(run: ZeroRun, root: str, rank: int, world_size: int) -> tuple:
    """A training script's start-up: build `run` as a fresh start does, then `resume` from
    `root`: (model, optimizer, the folder loaded or None, the 0-based index of the next step, the
    folders whose load failed). Collective: call on every rank; raises, on every rank, what
    `resume` raises."""
    torch.manual_seed(run.seed + rank)
    model, optimizer = build_optimizer(run, run_model(run, seed_offset=rank), rank, world_size)
    folder, extra, failed = resume(root, lambda found: load_zero(found, model, optimizer),
                                   group=optimizer.comm.group)
    return model, optimizer, folder, 0 if folder is None else extra["next_step"], failed


def resume_with_dropout(rank: int, world_size: int, run: ZeroRun, root: str,
                        p: float = 0.1) -> dict[str, list[float]]:
    """What a lost random-number state costs: train `run` (an MLP) with dropout, saving after
    step 10, then resume from that checkpoint twice on freshly built ranks: as `load_zero` does,
    and with the generator seeded again after the load, as a fresh start seeds it, which is what
    a checkpoint without the RNG state leaves. Returns the three runs' losses from step 11 on.

    Dropout of probability `p` follows the MLP's first ReLU and draws from torch's generator,
    each rank its own stream (seeded run.seed + rank). Collective: call on every rank.
    """
    if run.model != "mlp":
        raise ValueError(f"resume_with_dropout needs run.model='mlp', got {run.model!r}")
    saved_at = 10

    def built(seed_offset: int):
        model, optimizer = build_optimizer(run, run_model(run, seed_offset=seed_offset), rank,
                                           world_size)
        model.layers[1].register_forward_hook(
            lambda module, inputs, output: F.dropout(output, p, training=True))
        return model, optimizer

    torch.manual_seed(run.seed + rank)
    model, optimizer = built(rank)
    losses = train_steps(run, model, optimizer, range(run.steps), lambda done: save_zero(
        root, model, optimizer, step=done, extra={"next_step": done}) if done == saved_at else None)
    runs = {"never stopped": losses[saved_at:]}
    for name, keep_state in (("resumed", True), ("resumed, RNG state lost", False)):
        model, optimizer = built(100 + rank)
        load_zero(Path(root) / f"step-{saved_at:08d}", model, optimizer)
        if not keep_state:
            torch.manual_seed(run.seed + rank)
        runs[name] = train_steps(run, model, optimizer, range(saved_at, run.steps))
    return runs


def save_on_signal(rank: int, world_size: int, signalled: int = 2, during: int = 3,
                   steps: int = 5, late: bool = False) -> dict:
    """A preemption warning that reaches one rank: a policy that saves every 100 steps or on
    request, its `request_save` the handler of SIGUSR1 on every rank, and SIGUSR1 sent to rank
    `signalled` alone during step `during`: before that step's `should_save`, or with `late`
    just after it (after the all-reduce of the flags, so it counts at the next step). Each rank
    stops after the first requested save and returns whether its handler ran and after which
    step it saved (None: never).

    Collective: call on every rank (from its main thread, where Python runs signal handlers).
    """
    policy = CheckpointPolicy(every_steps=100, on_request=True)
    received = []

    def handler(signum, frame):  # the policy's, noting for the report that it ran
        received.append(signum)
        policy.request_save(signum, frame)

    previous = signal.signal(signal.SIGUSR1, handler)
    saved = None
    try:
        for step in range(1, steps + 1):
            signal_now = rank == signalled and step == during
            if signal_now and not late:
                os.kill(os.getpid(), signal.SIGUSR1)
            due = policy.should_save(step)
            if signal_now and late:
                os.kill(os.getpid(), signal.SIGUSR1)
            if due and saved is None:
                saved = step  # a script would save here
            if policy.requested:
                break  # then stop: the job is being preempted
    finally:
        signal.signal(signal.SIGUSR1, previous)
    return {"handler ran": bool(received), "saves after step": saved}


def round_trip(rank: int, world_size: int, run: ZeroRun, root: str) -> dict[str, bool]:
    """Train a few steps, save, load into fresh objects; is every tensor bitwise equal?

    Collective: call on every rank.
    """
    model, optimizer = build_optimizer(run, run_model(run), rank, world_size)
    train_steps(run, model, optimizer, range(run.steps))
    before = {**{k: v.clone() for k, v in optimizer.state_dict().items() if k in FLAT_KEYS},
              "rng_state": torch.get_rng_state(), "params": flat_parameters(model)}
    folder = save_zero(root, model, optimizer, step=run.steps, extra={"next_step": run.steps})
    torch.manual_seed(12345)  # disturb the RNG: the load must restore it
    fresh_model, fresh = build_optimizer(run, run_model(run, seed_offset=7), rank, world_size)
    load_zero(folder, fresh_model, fresh)
    after = {**{k: v for k, v in fresh.state_dict().items() if k in FLAT_KEYS},
             "rng_state": torch.get_rng_state(), "params": flat_parameters(fresh_model)}
    return {key: torch.equal(before[key], after[key]) for key in before} | \
           {"step": fresh.step_count == optimizer.step_count}


def crash_during_save(rank: int, world_size: int, run: ZeroRun, root: str,
                      crash_rank: int) -> None:
    """Save after step 2, train to step 4 and save again, but kill `crash_rank` half-way through
    writing its shard of the second checkpoint (a real SIGKILL of a real process).

    Collective: call on every rank; the call never returns normally (the launcher reports the
    killed rank and stops the others). Fault injection for the lesson: the crashing rank saves
    through a `checkpoint.faults.CrashingDisk`, whose write puts half the bytes on disk and
    kills its own process.
    """
    model, optimizer = build_optimizer(run, run_model(run), rank, world_size)
    train_steps(run, model, optimizer, range(0, 2))
    save_zero(root, model, optimizer, step=2, extra={"next_step": 2})
    train_steps(run, model, optimizer, range(2, 4))
    save_zero(root, model, optimizer, step=4, extra={"next_step": 4},
              disk=CrashingDisk() if rank == crash_rank else DISK)


def save_ours_and_dcp(rank: int, world_size: int, run: ZeroRun, root: str,
                      lowest_rank: bool = False) -> dict:
    """Save the same ZeRO state with our format and with torch.distributed.checkpoint (DCP).

    Collective: call on every rank. Returns both folders. DCP gets each rank's shard under
    rank-specific keys, so it writes them as distinct items, and the model's state dict, which
    every rank holds and DCP's planner writes once, each tensor by one rank: the least loaded
    holder by default, the lowest holder with `lowest_rank` (`dedup_save_to_lowest_rank=True`).
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import DefaultSavePlanner

    model, optimizer = build_optimizer(run, run_model(run), rank, world_size)
    train_steps(run, model, optimizer, range(1))
    state = optimizer.state_dict()
    ours = save_zero(Path(root) / "ours", model, optimizer, step=1, extra={"next_step": 1})
    dcp_state = {f"rank{rank}.{key}": state[key] for key in FLAT_KEYS}
    dcp_state["model"] = model.state_dict()
    dcp.save(dcp_state, checkpoint_id=str(Path(root) / "dcp"),
             planner=DefaultSavePlanner(dedup_save_to_lowest_rank=lowest_rank))
    return {"ours": str(ours), "dcp": str(Path(root) / "dcp")}


def dcp_after_a_flipped_byte(rank: int, world_size: int, root: str) -> dict:
    """Save a shard per rank with DCP, flip one byte in rank 1's data file, load it back.

    Collective: call on every rank. Returns whether DCP raised, and how far the loaded tensor is
    from the saved one: DCP (torch 2.13, FileSystemReader) does not hash what it reads.
    """
    import torch.distributed.checkpoint as dcp

    saved = torch.randn(4096, generator=torch.Generator().manual_seed(rank))
    folder = str(Path(root) / "dcp-flip")
    dcp.save({f"rank{rank}.master": saved}, checkpoint_id=folder)
    dist.barrier()
    if rank == 0:
        flip_one_byte(Path(folder) / "__1_0.distcp")
    dist.barrier()
    loaded = {f"rank{rank}.master": torch.zeros(4096)}
    try:
        dcp.load(loaded, checkpoint_id=folder)
    except Exception as error:  # noqa: BLE001 - reported, not hidden
        return {"rank": rank, "raised": type(error).__name__, "max_abs_change": None}
    change = (loaded[f"rank{rank}.master"] - saved).abs().max().item()
    return {"rank": rank, "raised": None, "max_abs_change": change}


def dcp_save_as_dtensors(rank: int, world_size: int, folder: str, destination: str) -> None:
    """Save the flat vectors of our checkpoint `folder` with DCP, as DTensors, asynchronously.

    Collective: call on every rank of the group that saved `folder`. Each rank reads its verified
    shard and gives DCP its real elements (padding stripped) as the local part of a DTensor of
    the whole flat vector, placed `Shard(0)` on a one-dimensional mesh of the ranks: DCP's
    .metadata then records each rank's slice as a chunk (offset, size) of that vector. The save
    goes through `dcp.async_save`, over a gloo group as async saves need; right after the call
    each rank overwrites its tensors with NaN, as the next optimizer step would overwrite them,
    and only then waits for the save: what lands on disk is the state at the call.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    shard, _, manifest = load_sharded(folder, rank=rank, world_size=world_size, replicated=False)
    layout = next(row for row in shard_layout(manifest) if row["rank"] == rank)
    numel = manifest["files"][0]["layout"]["numel"]
    device = current_device()
    mesh = init_device_mesh(device.type, (world_size,))
    real = layout["length"] - layout["padding"]
    locals_ = {key: shard[key][:real].to(device, copy=True) for key in FLAT_KEYS}  # own storage
    state = {key: DTensor.from_local(value, mesh, [Shard(0)], shape=(numel,), stride=(1,))
             for key, value in locals_.items()}
    future = dcp.async_save(state, checkpoint_id=destination,
                            process_group=dist.new_group(backend="gloo"))
    for value in locals_.values():
        value.fill_(float("nan"))  # the training loop goes on changing the state in place
    future.result()


def dcp_load_as_dtensors(rank: int, world_size: int, destination: str, numel: int) -> dict:
    """Load the flat vectors that `dcp_save_as_dtensors` saved, on this group's world size.

    Collective: call on every rank. Each rank asks DCP for DTensors of `numel` elements placed
    `Shard(0)` on a mesh of `world_size` ranks, however many ranks saved them: DCP reads the
    saved chunks that overlap this rank's slice. Returns this rank's slices (CPU tensors).
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, zeros

    mesh = init_device_mesh(current_device().type, (world_size,))
    state = {key: zeros(numel, device_mesh=mesh, placements=[Shard(0)]) for key in FLAT_KEYS}
    dcp.load(state, checkpoint_id=destination)
    return {key: value.to_local().cpu().clone() for key, value in state.items()}


def dcp_chunks(destination: str, key: str) -> list[dict]:
    """What DCP's .metadata in `destination` says of the one-dimensional item `key`: for each
    saved chunk its start and size in the whole tensor, and the file, the byte it starts at and
    its byte count. One process; reads the metadata only."""
    from torch.distributed.checkpoint import FileSystemReader

    metadata = FileSystemReader(destination).read_metadata()
    where = {index.offset: info for index, info in metadata.storage_data.items() if index.fqn == key}
    return [{"start": chunk.offsets[0], "elements": chunk.sizes[0],
             "file": where[chunk.offsets].relative_path, "from byte": where[chunk.offsets].offset,
             "bytes": where[chunk.offsets].length}
            for chunk in metadata.state_dict_metadata[key].chunks]


def fsdp2_save(rank: int, world_size: int, run: ZeroRun, destination: str) -> dict:
    """Train `run` with torch's FSDP2 and Adam (lesson 78's "fsdp2") and save both with DCP, as
    torchtitan does: `get_state_dict` gives the model's and the optimizer's state dicts, keyed by
    parameter names, with a DTensor for every parameter and every moment, and `dcp.save` has each
    rank write its own chunks of them. Collective: call on every rank. Returns, gathered whole,
    what a load must give back (`fsdp2_whole`)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    run = replace(run, optimizer="fsdp2")
    model, optimizer = build_optimizer(run, run_model(run, seed_offset=rank), rank, world_size)
    train(lambda step: run_loss(run, model, step, rank, world_size), optimizer, range(run.steps))
    model_state, optimizer_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=destination)
    return fsdp2_whole(model, optimizer)


def fsdp2_load(rank: int, world_size: int, run: ZeroRun, destination: str) -> dict:
    """Load what `fsdp2_save` saved into a fresh FSDP2 model and Adam on this group's number of
    ranks, however many saved it: the fresh pair's own `get_state_dict` is the template, whose
    DTensors say which slice this rank holds; `dcp.load` reads into each the saved chunks that
    overlap it; `set_state_dict` puts the result in place. Collective: call on every rank.
    Returns what `fsdp2_save` returns."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    run = replace(run, optimizer="fsdp2")
    model, optimizer = build_optimizer(run, run_model(run, seed_offset=100 + rank), rank, world_size)
    model_state, optimizer_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optimizer": optimizer_state}
    dcp.load(state, checkpoint_id=destination)
    set_state_dict(model, optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optimizer"])
    return fsdp2_whole(model, optimizer)


def fsdp2_whole(model, optimizer) -> dict:
    """An FSDP2 model's parameters and its Adam's moments and step count, gathered whole
    (`full_tensor`, a collective: call on every rank)."""
    state = [optimizer.state[p] for p in model.parameters()]
    return {"params": gathered_parameters(model, optimizer),
            "exp_avg": torch.cat([s["exp_avg"].full_tensor().reshape(-1) for s in state]),
            "exp_avg_sq": torch.cat([s["exp_avg_sq"].full_tensor().reshape(-1) for s in state]),
            "step": float(state[0]["step"]), "local_numel": sum(p.to_local().numel()
                                                                 for p in model.parameters())}


def dcp_files(destination: str) -> list[dict]:
    """Which items of the DCP checkpoint in `destination` each data file holds (from its
    .metadata): per file, how many tensors of the model's state dict ("model.*", which every
    rank held) and how many of the ranks' own flat vectors ("rank<r>.*"). One process; reads the
    metadata only."""
    from torch.distributed.checkpoint import FileSystemReader

    metadata = FileSystemReader(destination).read_metadata()
    files: dict[str, dict] = {}
    for index, info in metadata.storage_data.items():
        row = files.setdefault(info.relative_path, {"file": info.relative_path,
                                                    "model tensors": 0, "own vectors": 0})
        row["model tensors" if index.fqn.startswith("model.") else "own vectors"] += 1
    return sorted(files.values(), key=lambda row: row["file"])


class TimedDisk(Disk):
    """The real disk, noting when each file write, fsync and rename of a save began and ended.

    `events` holds (kind, name, start, end) with kind "write" (a whole `write_atomically`:
    temporary file, fsync, rename, fsync of the folder), "fsync", "rename", or "publish" (the
    rename of the staging folder to its final `step-XXXXXXXX` name, the moment a checkpoint
    exists), times from `devices.clock`, the name the file or folder ends up with.
    """

    def __init__(self):
        self.events: list[tuple[str, str, float, float]] = []

    def write_atomically(self, path: Path, payload: bytes) -> None:
        start = clock()
        super().write_atomically(path, payload)
        self.events.append(("write", Path(path).name, start, clock()))

    def fsync(self, handle: int) -> None:
        start = clock()
        super().fsync(handle)
        self.events.append(("fsync", "", start, clock()))

    def replace(self, source: Path, destination: Path) -> None:
        start = clock()
        super().replace(source, destination)
        publish = Path(destination).is_dir() and Path(destination).name.startswith("step-")
        self.events.append(("publish" if publish else "rename", Path(destination).name, start, clock()))


def timed_save(rank: int, world_size: int, run: ZeroRun, root: str) -> dict:
    """Train two steps, timing the second, then save through a `TimedDisk`: every rank's file
    operations in time.

    Collective: call on every rank. The ranks start the timed step and the save together (a
    barrier each); returns this rank's events with times in seconds from the save's start, how
    long the step took ("step_s") and the whole save call ("save_s"), and the published folder.
    """
    model, optimizer = build_optimizer(run, run_model(run), rank, world_size)
    train_steps(run, model, optimizer, range(1))  # the first step also allocates Adam's state
    dist.barrier()
    started = clock()
    train_steps(run, model, optimizer, range(1, 2))
    step_s = clock() - started
    disk = TimedDisk()
    dist.barrier()
    origin = clock()
    folder = save_zero(root, model, optimizer, step=2, extra={"next_step": 2}, disk=disk)
    save_s = clock() - origin
    events = [(kind, name, start - origin, end - origin) for kind, name, start, end in disk.events]
    return {"rank": rank, "events": events, "folder": str(folder), "step_s": step_s,
            "save_s": save_s}


SAVE_IN_STEPS = {
    "en": "one save took as long as {steps:.1f} training steps (rank 0: save {save_ms:.1f} ms, "
          "step {step_ms:.1f} ms)",
    "fa": "یک ذخیره به اندازهٔ {steps:.1f} گام آموزش طول کشید (رتبهٔ ۰: ذخیره {save_ms:.1f} "
          "میلی‌ثانیه، گام {step_ms:.1f} میلی‌ثانیه)",
}


def save_in_steps(result: dict, lang: str = "en") -> str:
    """A line of `lang` saying how many training steps one save took, from a rank's
    `timed_save` result: C counted in steps (times a step's duration, the seconds Young's interval
    takes). At the lesson's sizes (about 100 KB per rank) a save measures fixed latency (fsyncs,
    collectives, the lock), not bytes, so the number illustrates the method; it is no C for a
    cluster. The ratio is that of the two times as shown (to 0.1 ms), so a reader who divides
    them gets the printed number of steps."""
    save_ms, step_ms = round(1e3 * result["save_s"], 1), round(1e3 * result["step_s"], 1)
    return language.fill(SAVE_IN_STEPS[language.check_language(lang)], lang,
                         steps=save_ms / step_ms, save_ms=save_ms, step_ms=step_ms)


SHA256_RATE = {
    "en": "sha256 on one core of this machine, under the load above: {rate:.2f} GB/s "
          "(the best of {rounds} passes over {mib} MiB)",
    "fa": "نرخ چکیده‌گیری `sha256` روی یک هستهٔ این دستگاه، زیر همان باری که بالاتر چاپ شد: "
          "{rate:.2f} گیگابایت بر ثانیه (بهترینِ {rounds} بار اندازه‌گیری روی {mib} مبی‌بایت)",
}


def sha256_rate(lang: str = "en", mib: int = 64, rounds: int = 3) -> str:
    """A line of `lang` giving how fast `hashlib.sha256` hashes on one core here, the best of
    `rounds` passes over `mib` MiB of random bytes: the rate a save or a verifying load pays per
    byte. Measured live, so it carries the machine's load; the cost model assumes its own."""
    payload = os.urandom(mib << 20)
    best = float("inf")
    for _ in range(rounds):
        start = clock()
        hashlib.sha256(payload).digest()
        best = min(best, clock() - start)
    return language.fill(SHA256_RATE[language.check_language(lang)], lang,
                         rate=len(payload) / best / 1e9, rounds=rounds, mib=mib)


@dataclass(frozen=True)
class SaveCosts:
    """`save_costs`'s answer: the table (GB, what bounds each part, seconds; NaN where a total
    has no bytes of its own) and the figures the pages reuse."""
    table: pd.DataFrame
    blocking_s: float  # a blocking save: the four save parts, one after another
    shard_gb: float  # one rank's shard
    replicated_gb: float  # replicated.pt, written by rank 0 alone

    def shown(self) -> pd.DataFrame:
        """The table as the pages show it: to 0.01, "—" where a cell is empty."""
        return self.table.astype({"GB": float, "s": float}).round(2).astype(object).fillna("—")


def save_costs(parameters: float = 7.5e9, ranks: int = 64, per_node: int = 8,
               hash_gb_s: float = 1.4, client_gb_s: float = 3.0, loads: bool = True) -> SaveCosts:
    """A model, not a measurement, of what saving and loading our sharded checkpoint costs at
    scale (lesson 80's example: 7.5e9 parameters trained with mixed-precision Adam on `ranks`
    ranks, `per_node` to a node).

    Assumptions: the shards hold 12 bytes per parameter (float32 master weights and Adam's two
    moments), split evenly over the ranks; `replicated.pt` holds the model's 2-byte weights and
    rank 0 alone writes and hashes it; sha256 runs on one core at `hash_gb_s` GB/s; a node's
    ranks share one filesystem client (its mount) that reads and writes at `client_gb_s` GB/s,
    and the filesystem behind the clients is never the limit. Parts follow one another (a
    blocking save: write the node's shards, hash one, write then hash `replicated.pt`); nothing
    overlaps and no page cache serves a read. With `loads`, four rows more, two for each kind of
    load: first one that reads only the shards (`load_sharded(..., replicated=False)`), then
    `load_zero`'s, which reads and hashes `replicated.pt` on every rank too. Each has the node's
    read through its client, then the load in all: that read, then each rank hashing what it read.
    """
    require_positive("parameters", parameters, "the model's parameter count, such as 7.5e9")
    require_positive_int("ranks", ranks, "the number of ranks, such as 64")
    require_positive_int("per_node", per_node, "the ranks on one node, such as 8")
    if per_node > ranks:
        raise ValueError(f"per_node must be at most ranks, got per_node={per_node} and "
                         f"ranks={ranks}: a node cannot hold more ranks than the run has")
    require_positive("hash_gb_s", hash_gb_s, "one core's sha256 rate in GB/s, such as 1.4")
    require_positive("client_gb_s", client_gb_s, "one node's filesystem client rate in GB/s, such as 3.0")
    shard_gb, replicated_gb = 12 * parameters / ranks / 1e9, 2 * parameters / 1e9
    rate = {"client": client_gb_s, "core": hash_gb_s}
    node = f"(a node's {per_node} ranks)"  # plots.checkpoint.TABLE_WORDS: "(a node's {} ranks)"
    rows = [(f"write the shards {node}", per_node * shard_gb, "client"),
            ("hash a shard (each rank)", shard_gb, "core"),
            ("write replicated.pt (rank 0)", replicated_gb, "client"),
            ("hash replicated.pt (rank 0)", replicated_gb, "core")]
    table = pd.DataFrame(rows, columns=["part", "GB", "bound by"]).set_index("part")
    table["s"] = table["GB"] / table["bound by"].map(rate)
    blocking_s = float(table["s"].sum())
    table.loc["blocking save, in all"] = [None, None, blocking_s]
    if loads:
        read_s = per_node * shard_gb / client_gb_s
        table.loc[f"read the shards {node}"] = [per_node * shard_gb, "client", read_s]
        table.loc["load without replicated.pt: read and hash, in all"] = [
            None, None, read_s + shard_gb / hash_gb_s]
        read_gb = per_node * (shard_gb + replicated_gb)  # every rank reads replicated.pt too
        table.loc[f"read the shards and replicated.pt {node}"] = [
            read_gb, "client", read_gb / client_gb_s]
        table.loc["load with replicated.pt (load_zero): read and hash, in all"] = [
            None, None, read_gb / client_gb_s + (shard_gb + replicated_gb) / hash_gb_s]
    return SaveCosts(table, blocking_s, shard_gb, replicated_gb)


def shard_layout(manifest: dict) -> list[dict]:
    """Each shard's rank, start, length and padding (its own: the run's padding sits at the end
    of the last shard), from a checkpoint's manifest, in rank order."""
    return [{key: entry["rank"] if key == "rank" else entry["layout"][key]
             for key in ("rank", "start", "length", "padding")}
            for entry in manifest["files"] if entry["rank"] is not None]


def folder_changes(states: list[list[str]]) -> list[str]:
    """What changed from each state of a folder to the next (`faults.SnapshotDisk.states`): a
    line per state, "+ path" for what appeared and "− path" for what went, "—" for the first.

    A rename of a folder moves every path inside it: such a change is named by its folders
    (".step-00000002.tmp" to "step-00000002"), not by each file.
    """
    lines = ["—"]
    for before, after in zip(states, states[1:]):
        added, removed = set(after) - set(before), set(before) - set(after)
        renamed = len(added) > 1 or len(removed) > 1
        name = (lambda path: path.rstrip("/").split("/")[0]) if renamed else \
            (lambda path: path.rstrip("/"))
        lines.append("; ".join([f"+ {path}" for path in sorted({name(p) for p in added})]
                               + [f"− {path}" for path in sorted({name(p) for p in removed})]))
    return lines


def save_flat_as_dtensors(rank: int, world_size: int, folder: str, destination: str) -> None:
    """Save checkpoint `folder`'s flat vectors again with DCP into `destination`, as DTensors
    placed `Shard(0)`. Collective."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    shard, _, manifest = load_sharded(folder, rank=rank, world_size=world_size, replicated=False)
    layout = next(entry["layout"] for entry in manifest["files"] if entry["rank"] == rank)
    real = layout["length"] - layout["padding"]
    device = current_device()  # the group's device: a mesh of another type has no collectives
    mesh = init_device_mesh(device.type, (world_size,))
    state = {name: DTensor.from_local(shard[name][:real].to(device), mesh, [Shard(0)],
                                      run_check=False, shape=torch.Size([layout["numel"]]),
                                      stride=(1,))
             for name in layout["flat"]}
    dcp.save(state, checkpoint_id=destination)


def load_dtensors_resharded(rank: int, world_size: int, source: str, resharded: str,
                            lang: str = "en") -> dict:
    """Load the DTensors that `save_flat_as_dtensors` wrote to `source` on this job's
    `world_size` ranks, into DTensors of the same global shape sharded on dimension 0 (DCP
    reshards at load time), and compare this rank's piece with the shard of the same vectors in
    `resharded` (our `reshard` of the same checkpoint for `world_size` ranks). Returns the DCP
    files this rank read (each holds the chunk one saving rank wrote), listed as `lang` lists
    (`language.listed`), and whether the pieces are equal bit for bit. Collective: call on every
    rank.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import DefaultLoadPlanner
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, zeros

    class RecordingPlanner(DefaultLoadPlanner):
        def create_local_plan(self):
            plan = super().create_local_plan()
            self.files = sorted({self.metadata.storage_data[item.storage_index].relative_path
                                 for item in plan.items})
            return plan

    mesh = init_device_mesh(current_device().type, (world_size,))  # the group's device
    metadata = dcp.FileSystemReader(source).read_metadata()
    state = {name: zeros(meta.size, device_mesh=mesh, placements=[Shard(0)])
             for name, meta in metadata.state_dict_metadata.items()}
    planner = RecordingPlanner()
    dcp.load(state, checkpoint_id=source, planner=planner)
    ours, _, manifest = load_sharded(resharded, rank=rank, world_size=world_size, replicated=False)
    layout = next(entry["layout"] for entry in manifest["files"] if entry["rank"] == rank)
    real = layout["length"] - layout["padding"]
    return {"files read": language.listed(planner.files, lang),
            "equal to reshard's, bit for bit": all(
                torch.equal(state[name].to_local().cpu(), ours[name][:real].cpu())
                for name in layout["flat"])}

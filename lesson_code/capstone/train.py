"""The capstone's rank function: lessons 77, 78 and 80 composed in one fixed order.

    1. Broadcast (lesson 77): broadcast rank 0's initial parameters, so every rank starts equal.
    2. ZeRO-1 (lesson 78): every step, reduce-scatter the gradients, Adam on this rank's shard
       of the fp32 master weights, all-gather the updated parameters.
    3. Sharded checkpoint (lesson 80): after each step of `config.save_steps()`, each rank writes
       its shard and rank 0 the weights, under a verified manifest.
    4. The divergence guard: a step whose loss is not finite or spikes is rolled back or skipped.
    5. The loop: forward, backward, the guard, the optimizer, the checkpointer.

The loop itself knows nothing of reduce-scatter or files: it calls `optimizer.step()` and
`checkpointer.maybe_save(step)`. Run it with `python -m lesson_code.capstone`, or spawn
`run_rank` on N ranks (`launch.spawn(run_rank, CapstoneConfig(), world_size=4)`).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import shutil
import signal
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist

from lesson_code.capstone.checkpointer import Checkpointer, state_copy
from lesson_code.capstone.config import CapstoneConfig
from lesson_code.capstone.guard import DivergenceGuard
from lesson_code.capstone.report import MetricsLog
from lesson_code.checkpoint.faults import CrashingDisk
from lesson_code.checkpoint.files import DISK
from lesson_code.checkpoint_lab import load_zero
from lesson_code.collectives.ledger import CommLedger
from lesson_code.data import batch_for_step
from lesson_code.ddp import broadcast_parameters
from lesson_code.runtime.devices import clock, current_device
from lesson_code.experiment import flat_parameters, global_mean
from lesson_code.models import MiniGPT
from lesson_code.zero import ZeroOptimizer


def build(config: CapstoneConfig, rank: int, world_size: int, seed_offset: int = 0):
    """Model, communicator and optimizer for one rank, in the order of the module docstring."""
    torch.manual_seed(config.seed + seed_offset + rank)  # each rank's own RNG stream
    model = MiniGPT(config.gpt).to(current_device())  # built on the CPU: a seed, the same weights on any device
    comm = config.communicator(CommLedger())
    if not config.optimizer_before_broadcast:
        broadcast_parameters(model, comm=comm)                         # 1. broadcast
    optimizer = ZeroOptimizer(model, world_size, rank, lr=config.lr, comm=comm,
                              max_grad_norm=config.max_grad_norm, track_grad_norm=True)  # 2. ZeRO-1
    if config.optimizer_before_broadcast:  # the wrong order: the master shards are not rank 0's
        broadcast_parameters(model, comm=comm)
    return model, comm, optimizer


def local_batch(config: CapstoneConfig, corpus, step: int, rank: int, world_size: int):
    """This rank's (inputs, targets) of `step` (from 0), on this process's device."""
    x, y = batch_for_step(corpus, step, rank, world_size, config.batch_per_rank, config.gpt.context)
    if step + 1 == config.bad_batch_step:  # the injected bad batch: every target mislabelled
        y = (y + 1) % config.gpt.vocab_size
    return x.to(current_device()), y.to(current_device())


def forward_backward(config: CapstoneConfig, model, corpus, step: int, rank: int,
                     world_size: int) -> torch.Tensor:
    """This rank's loss for `step`, its gradients accumulated over `config.accumulation` parts."""
    x, y = local_batch(config, corpus, step, rank, world_size)
    total = torch.zeros((), device=current_device())
    for xm, ym in zip(x.chunk(config.accumulation), y.chunk(config.accumulation)):
        loss = model(xm, ym)[1] / config.accumulation
        loss.backward()
        total += loss.detach()
    return total


def loss_after_update(config: CapstoneConfig, model, corpus, step: int, rank: int,
                      world_size: int) -> float:
    """The global loss of `step`'s batch (from 0) on the current weights, without gradients.

    Collective. Called after step `step`'s update, it shows what that update did to the batch
    it was computed on. MiniGPT has no dropout, so this forward draws no random numbers.
    """
    x, y = local_batch(config, corpus, step, rank, world_size)
    with torch.no_grad():
        return global_mean(model(x, y)[1])


def run_rank(rank: int, world_size: int, config: CapstoneConfig, start_from: str | None = None) -> dict:
    """Train `config.steps` steps on this rank; return its records. Collective: every rank.

    With `start_from` (a checkpoint folder) it resumes there (`load_zero`, `restore_run_state`).
    """
    model, comm, optimizer = build(config, rank, world_size, seed_offset=0 if start_from is None else 100)
    checkpointer = Checkpointer(Path(config.out_dir) / "checkpoints", model, optimizer,
                                save_after=config.save_steps(), keep_last=config.keep_last,
                                verify=lambda folder, snapshot: verify_resume(
                                    config, folder, snapshot, rank, world_size))  # 3. checkpoints
    guard = DivergenceGuard(config.spike_factor, max_retries=config.guard_retries,
                            skip_after_rollback=config.skip_after_rollback)  # 4. the guard
    faults = InjectedFaults(config, rank)  # the lesson's faults, each off unless config asks
    corpus = config.corpus()
    position, records, events, history = 0, [], [], {"records": [], "events": []}  # the next batch, from 0
    if start_from is not None:
        position, faults.spiked, history = restore_run_state(load_zero(start_from, model, optimizer), guard)
    log = MetricsLog(Path(config.out_dir) / "metrics.jsonl" if rank == 0 else None, history)
    gradient_bytes = 0

    def state() -> dict:  # what a checkpoint saved now holds besides tensors
        return run_state(config, world_size, guard, faults.spiked, history, records, events)

    unjudged = None  # the step whose update the weights hold and no check_update has judged

    def update_rejected(trained: int) -> str | None:  # why step `trained`'s update fails, if held
        if trained != unjudged:  # the weights are a checkpoint's (judged before its save), or judged
            return None
        after = loss_after_update(config, model, corpus, trained - 1, rank, world_size)
        return guard.check_update(after, records[-1]["loss"])

    reject = functools.partial(reject_step, guard=guard, checkpointer=checkpointer, log=log,
                               events=events, state=state, update_rejected=update_rejected)

    while position < config.steps:                                           # 5. the loop
        started, step = clock(), position + 1  # the step trained now, from 1, on batch `position`
        optimizer.zero_grad()
        loss = global_mean(forward_backward(config, model, corpus, position, rank, world_size))
        reason = guard.check(loss)  # the same loss on every rank, so every rank decides alike
        if reason is not None:  # judged before the update: no weight has changed
            position, unjudged = reject(step, loss, reason, updated=False), None
            continue
        gradient_bytes = sum(p.grad.untyped_storage().nbytes() for p in model.parameters())
        lr = optimizer.lr
        optimizer.lr = faults.learning_rate(step, lr)
        optimizer.step()  # reduce-scatter, Adam on this rank's shard, all-gather
        optimizer.lr, position, unjudged = lr, step, step
        records.append(log.write({"step": step, "loss": loss, "grad_norm": optimizer.last_grad_norm,
                                  "step_time_s": clock() - started, "lr": lr,
                                  "param_norm": flat_parameters(model).norm().item()}))
        if step in checkpointer.save_after:  # a checkpoint may keep only an update judged good
            after = loss_after_update(config, model, corpus, step - 1, rank, world_size)
            reason = guard.check_update(after, loss)
            if reason is not None:  # the update is in the weights: roll it back before any save
                position, unjudged = reject(step, after, reason, updated=True), None
                continue
            unjudged = None
        checkpointer.maybe_save(step, loss, state(), disk=faults.disk(step))
        faults.after_save(step)
    return {"rank": rank, "records": records, "events": events,  # this call's steps only
            "history": history,  # with start_from, the resumed run's steps before this call
            "memory": {"parameters": sum(p.untyped_storage().nbytes() for p in model.parameters()),
                       "gradients": gradient_bytes,
                       "optimizer": optimizer.optimizer_state_bytes()},
            "shard_numel": optimizer.shard_numel, "padding": optimizer.padding,
            "numel": optimizer.numel, "params": flat_parameters(model),
            "final_state": {**state_copy(model, optimizer), "optimizer_step": optimizer.step_count},
            "checkpoints": {s: str(f) for s, f in checkpointer.folders.items()},
            "resume_verified": dict(checkpointer.verified),
            "traffic": comm.ledger.totals()}  # the communicator's only: not the loss's all-reduce
                                              # (global_mean) nor the checkpointer's collectives


def timed_run_rank(rank: int, world_size: int, config: CapstoneConfig,
                   start_from: str | None = None) -> dict:
    """`run_rank`'s records, with "run_s": the seconds the call took on this rank. It leaves out
    the process's start-up, which on a loaded machine varies by more than a run's saves take."""
    started = clock()
    result = run_rank(rank, world_size, config, start_from)
    return {**result, "run_s": clock() - started}


def reject_step(step: int, loss: float, reason: str, updated: bool, *, guard: DivergenceGuard,
                checkpointer: Checkpointer, log: MetricsLog, events: list[dict],
                state: Callable[[], dict], update_rejected: Callable[[int], str | None]) -> int:
    """Carry out the guard's verdict on `step` for `run_rank`: roll back to the newest
    checkpoint, or skip the step's batch; return the data position to train from. Collective:
    every rank. `updated`: the step's update is already in the weights (it was judged after it).
    Rank 0's `log` and every rank's `events` get the event; `state` is what a save made now keeps
    besides tensors; `update_rejected(n)` re-judges step n's update if the weights hold it
    unjudged (None: no such update, or a good one)."""
    if guard.action(step) == "skip":  # action counts this rejection against the step's retries
        if updated:  # skipping the batch would keep its update: stop instead
            raise RuntimeError(f"step {step}'s update was rejected again after "
                               f"{guard.max_retries} rollbacks ({reason}): lower the learning rate")
        verdict = update_rejected(step - 1)  # a spike seen before an update comes from the last
        if verdict is not None:  # the weights are at fault, not the batch: skipping would keep them
            raise RuntimeError(f"step {step}'s batch cannot be skipped ({reason}): the weights hold "
                               f"step {step - 1}'s update, which fails too ({verdict}); lower the "
                               "learning rate, or allow more rollbacks (guard_retries)")
        events.append(log.write({"event": "skip", "loss": loss, "reason": reason, "step": step,
                                 "message": f"step {step}'s batch skipped: still rejected "
                                            f"after {guard.max_retries} rollbacks ({reason})"}))
        checkpointer.maybe_save(step, guard.previous, state())
        return step
    restored, guard.previous = checkpointer.rollback()
    trained = step if updated else step - 1  # steps since the checkpoint: their updates are gone
    event = {"event": "rollback", "loss": loss, "reason": reason, "to_step": restored,
             "at_step": step, "undone": list(range(restored + 1, trained + 1))}
    resume = guard.resume_at(restored, step)  # the checkpoint's, or past the rejected step
    if resume > restored:  # skip_after_rollback: these steps' batches are never read again
        event["skipped"] = list(range(restored + 1, resume + 1))
    events.append(log.write(event))
    return resume


@dataclasses.dataclass
class InjectedFaults:
    """The faults this lesson injects into a run, each off unless `config` asks for it.

    `learning_rate` multiplies the rate of step `config.lr_spike_step` once; `spiked` records
    that it fired, so a replay of that step trains normally and a checkpoint keeps the fact.
    `disk` gives the save after `config.kill_at_step` a disk that dies half-way through
    (`kill_during_save`); `after_save` kills the victim rank there with a real SIGKILL. The bad
    batch is `local_batch`'s. Kept here so that `run_rank`'s loop reads as a trainer's would.
    """

    config: CapstoneConfig
    rank: int
    spiked: bool = False

    def learning_rate(self, number: int, lr: float) -> float:
        """The rate for step `number` (from 1): `lr`, or, once, the spiked rate."""
        if number == self.config.lr_spike_step and not self.spiked:
            self.spiked = True
            return lr * self.config.lr_spike_factor
        return lr

    def _dies_after(self, step: int) -> bool:
        return self.config.victim() == self.rank and step == self.config.kill_at_step

    def disk(self, step: int):
        """The disk the save after `step` writes to: one that crashes half-way, or the real one."""
        return CrashingDisk() if self.config.kill_during_save and self._dies_after(step) else DISK

    def after_save(self, step: int) -> None:
        """The injected crash: the victim rank kills its own process after `config.kill_at_step`."""
        if self._dies_after(step):
            os.kill(os.getpid(), signal.SIGKILL)


def run_state(config: CapstoneConfig, world_size: int, guard: DivergenceGuard, spiked: bool,
              history: dict, records: list[dict], events: list[dict]) -> dict:
    """What a checkpoint must hold, besides tensors and the data position, for a bitwise resume:
    the settings that decide the numbers (`config.trajectory()`) and the world size, to refuse
    another run's folder; the guard's state; whether the spike fired; every step and event so far."""
    return {"config": config.trajectory(), "world_size": world_size,
            "guard": {"previous": guard.previous,
                      "retries": {str(step): count for step, count in guard.retries.items()}},
            "lr_spiked": spiked,
            "records": history["records"] + records, "events": history["events"] + events}


def restore_run_state(extra: dict, guard: DivergenceGuard) -> tuple[int, bool, dict]:
    """From a checkpoint's extra dict: (the next step, whether the spike fired, the history), and
    the guard's state put back into `guard`. Raises ValueError for a checkpoint without run state."""
    state = extra.get("run")
    if state is None:
        raise ValueError("this checkpoint holds no capstone run state (extra['run']): it was not "
                         "saved by lesson_code.capstone, so a run cannot continue from it")
    guard.previous = state["guard"]["previous"]
    guard.retries = {int(step): count for step, count in state["guard"]["retries"].items()}
    return extra["next_step"], state["lr_spiked"], {"records": state["records"],
                                                    "events": state["events"]}


def verify_resume(config: CapstoneConfig, folder: Path | str, snapshot: dict, rank: int,
                  world_size: int) -> bool:
    """Reload `folder` into a fresh model and optimizer; is every byte what was saved?

    Collective: call on every rank. Compares the master shard, both moments, the RNG state and
    the parameters with `snapshot`, the in-memory copy taken when the checkpoint was written.
    The fresh build re-seeds every generator, so the run's CPU generator and its GPU's (under
    NCCL) are kept aside and restored: the check must not change what training draws next.
    """
    device = current_device()
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        model, _, optimizer = build(config, rank, world_size, seed_offset=1000)
        load_zero(folder, model, optimizer)
        loaded = state_copy(model, optimizer)
    same = all(torch.equal(loaded[key], snapshot[key]) for key in snapshot)
    verdicts = torch.tensor([1.0 if same else 0.0], device=current_device())
    dist.all_reduce(verdicts, op=dist.ReduceOp.MIN)
    return bool(verdicts.item())


COMPARED = ("params", "master", "exp_avg", "exp_avg_sq", "optimizer_step", "rng_state")


def compare_resumed(straight: list[dict], resumed: list[dict]) -> dict[str, bool]:
    """Did the resumed run end bit for bit where the uninterrupted run ended, on every rank?

    `straight` and `resumed` are every rank's `run_rank` results: the run that never stopped,
    and the run that resumed from one of its checkpoints and trained to the same last step.
    Returns one verdict per compared item: every step and its loss (the resumed run's history
    from the checkpoint, then what it trained: the data position and the whole loss curve; of a
    result without "history", the steps it trained against the end of the other's curve), then
    each tensor of the final state in `COMPARED` (parameters, the fp32 master shard, both Adam
    moments, Adam's step count, the RNG state). Bitwise equality is the right test here because
    both runs take one code path with the same world size and thread settings; across world
    sizes or thread counts it is not expected (lesson 80).
    """
    if len(straight) != len(resumed):
        raise ValueError(f"{len(straight)} ranks ran straight but {len(resumed)} resumed: "
                         "compare runs of the same world size")
    reference, done = ([(row["step"], row["loss"]) for row in all_records(run[0])]
                       for run in (straight, resumed))
    if "history" not in resumed[0]:  # a result of what it trained alone: the curve's end
        reference = reference[len(reference) - len(done):]
    verdicts = {"steps and losses": bool(done) and done == reference}
    for key in COMPARED:
        verdicts[key] = all(_equal(a["final_state"][key], b["final_state"][key])
                            for a, b in zip(straight, resumed))
    return verdicts


def all_records(result: dict) -> list[dict]:
    """Every step of a `run_rank` result's run: the history it resumed with, then its own."""
    return result.get("history", {}).get("records", []) + result["records"]


def all_events(result: dict) -> list[dict]:
    """Every guard event of a `run_rank` result's run: the history's, then its own."""
    return result.get("history", {}).get("events", []) + result["events"]


def _equal(a, b) -> bool:
    """Bitwise equality of two tensors, or plain equality of two numbers."""
    return torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b


SCRATCH = "verify"  # out_dir/verify: a checking run's own folder, deleted when it is done


def run_and_resume(rank: int, world_size: int, config: CapstoneConfig) -> dict:
    """`run_rank` twice: the whole run, then a resume from its checkpoint to the same last step.

    Collective: call on every rank. The resumed run starts from `replay_start`'s checkpoint
    (`config.checkpoint_step`'s, unless pruned), copied into out_dir/verify, where it saves and
    rolls back without touching the run's own checkpoints; it builds its model from another seed
    and loads weights, optimizer shard, RNG state, data position and run state, so only the files
    can make it end where the first run ended. Compare the two with `compare_resumed`. Returns
    {"straight": ..., "resumed": ...}, this rank's results; the scratch folder is deleted.
    """
    straight = run_rank(rank, world_size, config)
    start = replay_start(config, straight["checkpoints"])
    scratch = Path(config.out_dir) / SCRATCH
    clear_folder(scratch, rank)  # every rank has finished the first run before any resumes
    copy = scratch / "checkpoints" / Path(straight["checkpoints"][start]).name
    if rank == 0:
        shutil.copytree(straight["checkpoints"][start], copy)
    dist.barrier()
    replay = dataclasses.replace(config.disarmed(), out_dir=str(scratch))
    resumed = run_rank(rank, world_size, replay, str(copy))
    clear_folder(scratch, rank)
    return {"straight": straight, "resumed": resumed}


def replay_start(config: CapstoneConfig, kept: dict[int, str]) -> int:
    """The step whose checkpoint a fresh run's check resumes from: `config.checkpoint_step` if it
    is still kept, else the newest kept before the last step, else the last step's. Raises
    ValueError when the run kept no checkpoint at all."""
    if not kept:
        raise ValueError(f"the run kept no checkpoint under {config.out_dir} to resume from: "
                         "keep_last must be at least 1")
    before_end = [step for step in kept if step < config.steps]
    if config.checkpoint_step in before_end:
        return config.checkpoint_step
    return max(before_end) if before_end else max(kept)


def clear_folder(folder: Path, rank: int) -> None:
    """Rank 0 deletes `folder` (a checking run's scratch space); every rank waits for it."""
    if rank == 0:
        shutil.rmtree(folder, ignore_errors=True)
    dist.barrier()

"""Lesson 80a's training script and lesson 80b's saver, run through `launch.spawn`:
`restart_training`, a training script that starts up on a crashed run's root and trains on, and
`BackgroundSaver`, a ZeRO save that holds the training loop up only for a copy of the state and
writes it from a thread.

The lesson's own rank functions are `lesson_code.checkpoint_lab`; its `train_with_checkpoints`
saves through a `BackgroundSaver` when given the class, which is how lesson 80b's cell runs it:

    launch.spawn(checkpoint_lab.train_with_checkpoints, ZeroRun(steps=20), "/tmp/ckpt", [10, 15],
                 BackgroundSaver, world_size=4)  # the same checkpoints, saved in the background
"""

from __future__ import annotations

import datetime
import threading
import time
from pathlib import Path

import torch.distributed as dist

from lesson_code.checkpoint.flat_state import flat_snapshot
from lesson_code.checkpoint.shards import save_sharded
from lesson_code.checkpoint_lab import start_up, train_steps
from lesson_code.zero_lab import ZeroRun


def restart_training(rank: int, world_size: int, run: ZeroRun, root: str) -> dict:
    """Lesson 80a's training script: its start-up (`checkpoint_lab.start_up`: build the
    run as a fresh start does, let `tools.resume` load the newest checkpoint under `root` that
    loads, or none), then its training from there up to `run.steps`.

    Collective: call on every rank. Returns the losses, the folder it resumed from (None for a
    fresh start) and the step it resumed at; raises, on every rank, what `resume` raises.
    """
    model, optimizer, folder, start, _ = start_up(run, root, rank, world_size)
    losses = train_steps(run, model, optimizer, range(start, run.steps))
    return {"losses": losses, "resumed_from": folder and folder.name, "resumed_at": start}


class BackgroundSaver:
    """A ZeRO save that holds the training loop up only for a copy of the state (lesson 80b).

    `save` waits for the save in flight, copies this rank's state to the CPU and writes the copy
    with `save_sharded` from a thread, over a gloo group of its own; `wait` raises on every rank
    the error a save raised. Construct on every process of the job (`new_group` needs them all).
    """

    def __init__(self, root: Path | str, model, optimizer, timeout_s: float = 120.0):
        self.root, self.model, self.optimizer = Path(root), model, optimizer
        ranks = dist.get_process_group_ranks(optimizer.comm.group or dist.group.WORLD)
        self.group = dist.new_group(ranks, backend="gloo",
                                    timeout=datetime.timedelta(seconds=timeout_s))
        self.thread: threading.Thread | None = None
        self.failure: BaseException | None = None
        self.waited_s = 0.0  # how long the last `save` waited for the save before it

    def save(self, step: int, extra: dict | None = None) -> None:
        """Wait for the previous save, copy the state now, and write it in the background."""
        start = time.perf_counter()
        self.wait()
        self.waited_s = time.perf_counter() - start
        parts = flat_snapshot(self.model, self.optimizer.state_dict(), rank=self.optimizer.rank,
                              extra=extra, to_cpu=True)
        self.thread = threading.Thread(target=self._write, args=(step, parts), daemon=True)
        self.thread.start()

    def _write(self, step: int, parts: dict) -> None:
        try:
            save_sharded(self.root, **parts, step=step, rank=self.optimizer.rank,
                         world_size=self.optimizer.world_size, group=self.group)
        except BaseException as error:  # noqa: BLE001 - handed to the loop by wait()
            self.failure = error

    def wait(self) -> None:
        """Wait for the save in flight, if any; raise the error it raised."""
        if self.thread is not None:
            self.thread.join()
            self.thread = None
        failure, self.failure = self.failure, None
        if failure is not None:
            raise failure

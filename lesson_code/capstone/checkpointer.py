"""Checkpoints as the capstone's loop sees them (lesson 81): `maybe_save(step)`, `rollback()`.

Wraps lesson 80's ZeRO checkpoint functions with a policy (which steps to save, how many to
keep) and remembers an in-memory copy of what each save wrote; given a `verify` function
(`train.verify_resume`), it reloads each checkpoint right after saving it, before pruning can
delete it, and keeps the verdict. The rank and world size are the optimizer's
(`optimizer.rank`, `optimizer.world_size`). Used by `capstone.train.run_rank`, which
`python -m lesson_code.capstone` runs.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist

from lesson_code.checkpoint import CheckpointError
from lesson_code.checkpoint.files import DISK, Disk
from lesson_code.checkpoint.tools import latest_checkpoint, prune_checkpoints
from lesson_code.checkpoint.flat_state import FLAT_KEYS
from lesson_code.checkpoint_lab import load_zero, save_zero
from lesson_code.experiment import flat_parameters


def state_copy(model, optimizer) -> dict[str, torch.Tensor]:
    """Copies of what a ZeRO checkpoint holds for this rank: master shard, both moments, the RNG
    state and every parameter (float64, exact), to compare with what a load restores."""
    state = optimizer.state_dict()
    return {**{key: state[key].clone() for key in FLAT_KEYS}, "rng_state": torch.get_rng_state(),
            "params": flat_parameters(model)}


class Checkpointer:
    """Saves after the steps in `save_after`, keeps the newest `keep_last`, rolls back on demand.

    Collective: `maybe_save` and `rollback` are called on every rank of the optimizer's group
    (its communicator's, which may be a sub-group of the run). `optimizer` is a
    `zero.ZeroOptimizer`: its rank and world size are the checkpoint's. `verify(folder,
    snapshot)`, if given, is collective too; its verdicts are kept in `verified` by step, the
    snapshot (`state_copy`, taken right after the save) is not: a run keeps no copy per save.
    """

    def __init__(self, root: Path | str, model, optimizer, *, save_after: set[int],
                 keep_last: int = 2, verify: Callable[[Path, dict], bool] | None = None):
        self.root, self.model, self.optimizer = Path(root), model, optimizer
        self.rank = optimizer.rank
        self.save_after, self.keep_last, self.verify = save_after, keep_last, verify
        self.folders: dict[int, Path] = {}  # the checkpoints saved and not pruned, by step
        self.verified: dict[int, bool] = {}
        self.skipped: list[str] = []
        self.prune_failures: list[str] = []  # rank 0's, when deleting old checkpoints failed

    def maybe_save(self, step: int, last_loss: float | None, run_state: dict | None = None,
                   disk: Disk = DISK) -> Path | None:
        """Save if `step` (steps done) is due; returns the folder written, else None.

        The checkpoint's extra holds the data position ("next_step"), the loss before it
        ("last_loss") and `run_state` (JSON: what else a resume needs, under "run"). `disk`
        does the file operations (a fault-injecting `files.Disk` in a crash test).
        """
        if step not in self.save_after:
            return None
        extra = {"next_step": step, "last_loss": last_loss}
        if run_state is not None:
            extra["run"] = run_state
        folder = save_zero(self.root, self.model, self.optimizer, step=step, extra=extra, disk=disk)
        self.folders[step] = folder
        if self.verify is not None:  # now, before pruning may delete an older one; the copy to
            # compare with (a float64 one of every parameter among it) is dropped once compared
            self.verified[step] = self.verify(folder, state_copy(self.model, self.optimizer))
        deleted: list = [[]]
        if self.rank == 0:  # housekeeping: a failure is logged, the run goes on on every rank
            try:
                deleted = [[str(path) for path in prune_checkpoints(self.root, self.keep_last)]]
            except (CheckpointError, OSError) as error:
                self.prune_failures.append(f"{self.root}: {error}")
                logging.getLogger(__name__).warning("pruning failed, every checkpoint kept: %s",
                                                    error)
        dist.broadcast_object_list(deleted, group=self.optimizer.comm.group, group_src=0)
        for gone in [s for s, kept in self.folders.items() if str(kept) in deleted[0]]:
            del self.folders[gone]  # every rank forgets what rank 0 deleted: `folders` is on disk
        return folder

    def rollback(self) -> tuple[int, float | None]:
        """Load the newest checkpoint that verifies; return (its next step, the loss before it).

        Rank 0 picks it (skipping, and logging, newer ones that fail to verify) and tells the other
        ranks. Raises RuntimeError when there is none yet: a run that diverges before its first
        checkpoint cannot be rolled back, only restarted.
        """
        choice: list = [None]
        if self.rank == 0:
            try:
                folder, skipped = latest_checkpoint(self.root)
                choice = [(None if folder is None else str(folder), skipped, None)]
            except (CheckpointError, OSError) as error:
                choice = [(None, [], f"{self.root}: {error}")]
        dist.broadcast_object_list(choice, group=self.optimizer.comm.group, group_src=0)
        folder, self.skipped, failure = choice[0]
        for reason in self.skipped if self.rank == 0 else []:
            logging.getLogger(__name__).warning("rollback skipped %s", reason)
        if failure is not None or folder is None:
            raise RuntimeError(failure or f"the run diverged before any checkpoint under {self.root} "
                               "verified: save earlier (a smaller checkpoint step) or lower the "
                               "learning rate")
        extra = load_zero(folder, self.model, self.optimizer)
        return extra["next_step"], extra.get("last_loss")

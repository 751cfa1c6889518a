"""The capstone's divergence guard (lesson 81): check each step's loss before the optimizer steps.

A NaN or infinite loss, or a loss more than `spike_factor` times the previous step's, means the
run has left the rails (a bad batch, a learning rate too high for one step, a hardware fault).
Stepping would write the damage into the weights and the optimizer's moments; rolling back to
the last checkpoint and replaying from there loses a few steps instead of the run. A damaging
update shows only in the next step's loss, so before a checkpoint keeps an update,
`check_update` judges it by the loss of the batch it was computed on.

A replay cures a fault that came from the run itself (a spike of the learning rate, a flipped
bit), but not a bad batch: the replay reads the same batch and spikes again, for ever. So each
step may cause at most `max_retries` rollbacks; after that its batch is skipped. With
`skip_after_rollback` the guard does not wait for the spike to recur: the first rollback already
skips every batch from the checkpoint to the rejected step, as PaLM's training did.

    guard = DivergenceGuard(spike_factor=2.0)
    verdict = guard.check(loss)       # None: step; else guard.action(number) says what to do
    verdict = guard.check_update(after, loss)    # before a checkpoint keeps the update
    step = guard.resume_at(restored, number)     # after a rollback: where to read data next
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class DivergenceGuard:
    """Remembers the last accepted loss; `check(loss)` returns a reason to reject it, or None.

    `action(step)` says what to do about a rejected step ("rollback", then "skip"), and
    `resume_at` which data position to read after a rollback.
    """

    spike_factor: float = 2.0
    previous: float | None = None
    max_retries: int = 1
    retries: dict[int, int] = field(default_factory=dict)  # rollbacks caused so far, by step
    skip_after_rollback: bool = False

    def check(self, loss: float) -> str | None:
        """None if `loss` may be stepped on (and remember it); otherwise why not.

        The loss must be the same on every rank (a global mean), so that all ranks decide alike.
        """
        if not math.isfinite(loss):
            return f"loss is {loss}: not finite"
        if self.previous is not None and loss > self.spike_factor * self.previous:
            return (f"loss {loss:.4g} is more than {self.spike_factor:g} times the previous "
                    f"step's {self.previous:.4g}")
        self.previous = loss
        return None

    def check_update(self, after: float, before: float) -> str | None:
        """None if an update may be kept; otherwise why not. `before` is the accepted loss of a
        step's batch, `after` the loss of the same batch on the weights its update wrote.

        `check` judges an update only at the next step, by the next batch's loss; a checkpoint
        written in between would keep a broken update, and a rollback would load it. Judged on
        the batch the guard has already accepted, a bad next batch cannot condemn good weights.
        """
        if not math.isfinite(after):
            return f"loss after the update is {after}: not finite"
        if after > self.spike_factor * before:
            return (f"the update raised its own batch's loss from {before:.4g} to {after:.4g}, "
                    f"more than {self.spike_factor:g} times")
        return None

    def action(self, step: int) -> str:
        """"rollback" the first `max_retries` times `step` (from 1) is rejected, then "skip".

        Bounded, so a run whose bad batch spikes on every replay ends instead of looping.
        """
        done = self.retries.get(step, 0)
        if done < self.max_retries:
            self.retries[step] = done + 1
            return "rollback"
        return "skip"

    def resume_at(self, restored: int, rejected: int) -> int:
        """The data position to train from after rolling back to step `restored` because of step
        `rejected`: `restored` (a replay, which repeats a bad batch), or with `skip_after_rollback`
        `rejected` (the batches of steps `restored + 1` to `rejected` are never read again).
        Raises ValueError unless 0 <= restored < rejected.
        """
        if not 0 <= restored < rejected:
            raise ValueError(f"restored={restored}, rejected={rejected}: a rollback returns to a "
                             "checkpoint before the rejected step")
        return rejected if self.skip_after_rollback else restored

"""The divergence guard: check every step's loss before the optimizer may use its gradients.

A NaN or infinite loss, or a loss more than `spike_factor` times the previous step's, means the
run has left the rails (a bad batch, a learning rate too high for one step, a hardware fault).
Stepping would write the damage into the weights and the optimizer's moments; rolling back to
the last checkpoint and replaying from there loses a few steps instead of the run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class DivergenceGuard:
    """Remembers the last accepted loss; `check(loss)` returns a reason to roll back, or None."""

    spike_factor: float = 2.0
    previous: float | None = None

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

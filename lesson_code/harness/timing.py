"""Timing on every rank at once: phases of a step, and the median of repeated collectives.

A collective ends when its slowest rank does, and ranks that start apart measure each other's
lateness: so every timer here starts the ranks together (a barrier) and reports the slowest.
Used by the lessons' labs and by `collectives.choose` (the all-reduce calibration).

    seconds = collective_seconds(lambda: dist.all_reduce(x), trials=5)   # every rank
"""

from __future__ import annotations

import os
import platform
import statistics
from typing import Callable

import torch
import torch.distributed as dist

from lesson_code.runtime.devices import clock, current_device
from lesson_code.runtime.validate import require_positive, require_positive_int


class PhaseClock:
    """Seconds of the phases of a step (forward, backward, ...), every rank starting together.

    `start()` waits at a barrier and reads the clock; each `lap(name)` closes the phase `name`.
    `medians()` gives each phase's median over the recorded steps, and "step" for the whole.

        clock = PhaseClock()
        clock.start(); forward(); clock.lap("forward"); backward(); clock.lap("backward")
    """

    def __init__(self):
        self.samples: dict[str, list[float]] = {}
        self._started = self._last = 0.0

    def start(self) -> None:
        """Begin a step. Collective: every rank waits for the others first."""
        dist.barrier()
        self._started = self._last = clock()

    def lap(self, name: str) -> float:
        """Close phase `name` now; return its seconds."""
        now = clock()
        seconds, self._last = now - self._last, now
        self.samples.setdefault(name, []).append(seconds)
        return seconds

    def stop(self) -> float:
        """End the step; record and return its total seconds under "step"."""
        seconds = clock() - self._started
        self.samples.setdefault("step", []).append(seconds)
        return seconds

    def discard(self) -> None:
        """Forget every sample so far (the warm-up steps)."""
        self.samples.clear()

    def medians(self) -> dict[str, float]:
        """Median seconds of each phase over the recorded steps."""
        return {name: statistics.median(values) for name, values in self.samples.items()}


def median_seconds(fn: Callable[[], object], *, trials: int, repeats: int = 1) -> float:
    """Median over `trials` of the mean seconds of one call of `fn` (timed `repeats` times).

    Collective when `fn` is: every rank starts each trial together (a barrier), runs the same
    number of calls, and times them with `torch.utils.benchmark.Timer`, which warms up first and
    waits for the GPU when there is one.
    """
    from torch.utils.benchmark import Timer

    require_positive_int("trials", trials)
    require_positive_int("repeats", repeats)
    timer = Timer(stmt="fn()", globals={"fn": fn}, num_threads=torch.get_num_threads())
    samples = []
    for _ in range(trials):
        dist.barrier()
        samples.append(timer.timeit(repeats).mean)
    return statistics.median(samples)


def slowest_rank(seconds: float, group=None) -> float:
    """The largest of every rank's `seconds`. Collective: call on every rank."""
    slowest = torch.tensor([seconds], dtype=torch.float64, device=current_device())
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=group)
    return slowest.item()


def collective_seconds(call: Callable[[], object], *, trials: int,
                       min_trial_s: float = 0.05) -> tuple[float, int]:
    """(the slowest rank's median seconds of one `call`, the calls per trial) over `trials`.

    Collective: call on every rank. A trial repeats `call` so that it lasts about `min_trial_s`;
    the count comes from the slowest rank's first timed call, so every rank makes the same calls
    (a rank making one call more would wait forever for its peers).
    """
    require_positive("min_trial_s", min_trial_s, "the seconds one trial should last, such as 0.05")
    once = slowest_rank(median_seconds(call, trials=1))  # after the Timer's warm-up
    repeats = max(1, min(100, round(min_trial_s / max(once, 1e-9))))
    return slowest_rank(median_seconds(call, trials=trials, repeats=repeats)), repeats


def alternating_seconds(calls: list[Callable[[], object]], *, trials: int,
                        rounds: int = 2, min_trial_s: float = 0.05) -> list[float]:
    """The slowest rank's seconds of one call of each of `calls`, timed in alternation.

    Collective: call on every rank. Each round times every call in turn (`collective_seconds`,
    trials of about `min_trial_s`); each call's figure is its best round. Timing one call after
    the other once would give the second the warm caches and allocator of the first: identical
    code then reads as 1.4x apart.
    """
    require_positive_int("rounds", rounds)
    best = [float("inf")] * len(calls)
    for _ in range(rounds):
        for index, call in enumerate(calls):
            seconds = collective_seconds(call, trials=trials, min_trial_s=min_trial_s)[0]
            best[index] = min(best[index], seconds)
    return best


def machine_line() -> str:
    """This machine in one line, as benchmark files record it: "x86_64, 2 cores, Linux, Python
    3.11.7, torch 2.13.0+cpu". Times measured under another line are another machine's."""
    return (f"{' '.join(filter(None, (platform.machine(), platform.processor())))}, "
            f"{os.cpu_count()} cores, {platform.system()}, Python {platform.python_version()}, "
            f"torch {torch.__version__}")

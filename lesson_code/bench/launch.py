"""Benchmark of the launcher: how fast ranks start, and how fast a failure or a hang ends a run.

    python -m lesson_code.bench launch [--world-size 4] [--out-dir bench-results]

The tests check what ends a run (the failing rank's own error, or the launcher's timeout naming
the ranks still running); this prints how long each took on this machine, median of 5:
- start: `launch.spawn` of a function that returns at once (fork server warm);
- failure: a rank raises while the others wait in a collective: call to RankFailedError;
- timeout: a rank hangs with `timeout_s=2`: call to RankTimeoutError, less the 2 s.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import pandas as pd
import torch.distributed as dist

from lesson_code import launch

TRIALS = 5
TIMEOUT_S = 2.0


def returns_at_once(rank: int, world_size: int) -> int:
    """A rank function that does nothing: what a run costs beyond the work itself."""
    return rank


def last_rank_raises(rank: int, world_size: int) -> None:
    """The last rank raises; the others wait for it in a barrier that never completes."""
    if rank == world_size - 1:
        raise RuntimeError("this rank fails on purpose")
    dist.barrier()


def last_rank_hangs(rank: int, world_size: int) -> None:
    """The last rank sleeps far beyond the launcher's timeout."""
    if rank == world_size - 1:
        time.sleep(600)


def _seconds(fn, world_size: int, expected: type[Exception] | None) -> float:
    """Seconds from calling launch.spawn to its return, or to the `expected` error.

    Only the timeout case runs with the short `TIMEOUT_S`; the others get a minute, so a slow
    start never turns them into a timeout.
    """
    timeout_s = TIMEOUT_S if expected is launch.RankTimeoutError else 60.0
    start = time.perf_counter()
    try:
        launch.spawn(fn, world_size=world_size, timeout_s=timeout_s)
    except launch.SpawnError as error:
        if expected is None or not isinstance(error, expected):
            raise
    return time.perf_counter() - start


def run(world_size: int, out_dir: Path, quick: bool = False) -> pd.DataFrame:
    """Time each case on `world_size` ranks, print the table and write launch.csv."""
    launch.spawn(returns_at_once, world_size=world_size)  # start the fork server once
    trials = 2 if quick else TRIALS
    cases = {"start": (returns_at_once, None, 0.0),
             "failure to error": (last_rank_raises, launch.RankFailedError, 0.0),
             "timeout overshoot": (last_rank_hangs, launch.RankTimeoutError, TIMEOUT_S)}
    rows = [{"case": name, "median_s": statistics.median(
                _seconds(fn, world_size, expected) - offset for _ in range(trials))}
            for name, (fn, expected, offset) in cases.items()]
    table = pd.DataFrame(rows).set_index("case")
    path = Path(out_dir) / "launch.csv"
    table.to_csv(path)
    print(f"launcher benchmark: {world_size} ranks, median of {trials}")
    print(table.to_string(float_format=lambda v: f"{v:.3f}"))
    print(f"table written to {path}")
    return table

"""Benchmark of lesson 76: our collectives beside gloo's built-ins, 1 KiB to 64 MiB on 4 ranks.

    python -m lesson_code.bench collectives [--world-size 4] [--out-dir bench-results]

Two runs of ranks. The first times every algorithm of the all-reduce, reduce-scatter and
all-gather, and the broadcast; their times are stored one file per collective
(`measured_all_reduce.csv`, `measured_reduce_scatter.csv`, `measured_all_gather.csv`, with this
machine and the date) in bench-results/, where `algorithm="auto"` finds them on this machine
(`choose.stored_costs`), or with `--into-package` in `lesson_code/collectives/`, the tables the
book's lesson 76 shows and "auto" uses on machines without their own. The second times
"auto" and gloo's built-in of each collective side by side, timed in turn (twice, each keeping
its better round), so the comparison that matters is measured in one run; its "auto" decides
from the tables the first run just stored, wherever they went (`choose.decide_from`), and the
run prints what it chose. Their rows are stored too (as "auto" and "gloo"), for lesson 76.
Prints time, algbw and busbw (nccl-tests definitions) of each primitive next to the gloo
built-in doing the same job, with the ratio ours / built-in, and writes the table as CSV. A
`--quick` run stores nothing (its "auto" decides as any run on this machine does).
"""

from __future__ import annotations

import datetime
from pathlib import Path

import pandas as pd

from lesson_code import collectives_lab, launch
from lesson_code.bench import stored
from lesson_code.collectives import choose, cost_model

SIZES = [2 ** k for k in range(10, 27, 2)]  # 1 KiB, 4 KiB, ..., 64 MiB
QUICK_SIZES = [2 ** 10, 2 ** 16, 2 ** 20]
TRIALS, QUICK_TRIALS = 7, 3  # timed trials per size, each lasting at least:
MIN_TRIAL_S, QUICK_MIN_TRIAL_S = 0.2, 0.05
PAIRS = [  # (our primitive, the built-in doing the same job, the nccl-tests algorithm name)
    ("ring all_reduce", "gloo all_reduce", "all_reduce"),
    ("naive all_reduce", "gloo all_reduce", "all_reduce"),
    ("recursive_doubling all_reduce", "gloo all_reduce", "all_reduce"),
    ("halving_doubling all_reduce", "gloo all_reduce", "all_reduce"),
    ("direct all_reduce", "gloo all_reduce", "all_reduce"),
    ("shared_memory all_reduce", "gloo all_reduce", "all_reduce"),
    ("auto all_reduce", "gloo all_reduce", "all_reduce"),
    ("ring reduce_scatter", "gloo reduce_scatter", "reduce_scatter"),
    ("direct reduce_scatter", "gloo reduce_scatter", "reduce_scatter"),
    ("naive reduce_scatter", "gloo reduce_scatter", "reduce_scatter"),
    ("auto reduce_scatter", "gloo reduce_scatter", "reduce_scatter"),
    ("ring all_gather", "gloo all_gather", "all_gather"),
    ("direct all_gather", "gloo all_gather", "all_gather"),
    ("naive all_gather", "gloo all_gather", "all_gather"),
    ("auto all_gather", "gloo all_gather", "all_gather"),
    ("tree broadcast", "gloo broadcast", "broadcast"),
]


def comparison_table(rows: list[dict], world_size: int) -> pd.DataFrame:
    """One row per (primitive, size): our time, the built-in's, the ratio and both busbw figures."""
    seconds = {(row["op"], row["nbytes"]): row["seconds"] for row in rows}
    table = []
    for ours, builtin, algorithm in PAIRS:
        for nbytes in sorted({row["nbytes"] for row in rows}):
            if (ours, nbytes) not in seconds or (builtin, nbytes) not in seconds:
                continue
            t_ours, t_builtin = seconds[ours, nbytes], seconds[builtin, nbytes]
            table.append({
                "primitive": ours, "bytes": nbytes, "ours_ms": 1e3 * t_ours,
                "builtin_ms": 1e3 * t_builtin, "ratio": t_ours / t_builtin,
                "ours_busbw_GBps": cost_model.bandwidths(algorithm, nbytes, t_ours, world_size)[1] / 1e9,
                "builtin_busbw_GBps":
                    cost_model.bandwidths(algorithm, nbytes, t_builtin, world_size)[1] / 1e9,
            })
    return pd.DataFrame(table)


# The side-by-side run: "auto" and gloo's built-in of each collective that chooses.
SIDE_BY_SIDE = [f"{who} {collective}" for collective in choose.ALGORITHMS
                for who in ("auto", "gloo")]
FIRST_RUN = [op for op in collectives_lab.TIMED_OPS if op not in SIDE_BY_SIDE]


def time_side_by_side(rank: int, world_size: int, sizes: list[int], trials: int,
                      min_trial_s: float, tables: str | None) -> tuple[list[dict], dict]:
    """Rank function: the side-by-side run's rows (`collectives_lab.time_primitives`), and the
    decisions its "auto" followed ({collective: choose.Decisions}, rank 0's source).

    "auto" decides from rank 0's tables in the folder `tables` (`choose.decide_from`): those
    the first run has just stored, wherever they went. With None, as any run on this machine
    does (`choose.group_decisions`). Collective: call on every rank.
    """
    if tables is None:
        decisions = {name: choose.group_decisions(name) for name in choose.ALGORITHMS}
    else:
        decisions = choose.decide_from(tables)
    rows = collectives_lab.time_primitives(rank, world_size, sizes, trials, min_trial_s,
                                           SIDE_BY_SIDE, True)
    return rows, decisions


def algorithm_rows(rows: list[dict], world_size: int, collective: str = "all_reduce") -> list[dict]:
    """The times of `collective` as `choose.store_times` wants them: every algorithm measured,
    "auto" and "gloo".

    Rows are named "<algorithm> <collective>"; nbytes is always the full tensor's size.
    """
    return [{"algorithm": row["op"].split(" ")[0], "world_size": world_size,
             "nbytes": row["nbytes"], "seconds": row["seconds"]}
            for row in rows if row["op"].endswith(f" {collective}")]


def store_all(rows: list[dict], world_size: int, trials: int, folder: Path,
              machine_at_start: str) -> None:
    """Store each collective's times in `folder`, under its name in `choose.STORED_FILES`."""
    for collective, packaged in choose.STORED_FILES.items():
        path = choose.store_times(algorithm_rows(rows, world_size, collective),
                                  machine_note(world_size, trials, collective, machine_at_start),
                                  Path(folder) / packaged.name)
        print(f"{collective} algorithm times stored in {path}")


def machine_note(world_size: int, trials: int, collective: str = "all_reduce",
                 machine_at_start: str | None = None) -> str:
    """Where and when: for the comment lines of the stored times. The machine line carries the
    load average read before the benchmark began (`stored.machine()`, read now by default): on
    shared cores the times are mostly waits for a core, so a reader needs the load to compare."""
    return (stored.description("collectives", collective=collective.replace("_", "-"),
                               ranks=world_size, trials=trials,
                               date=datetime.date.today().isoformat())
            + f"\nmachine: {machine_at_start or stored.machine()}")


def run(world_size: int, out_dir: Path, quick: bool = False,
        into_package: bool = False) -> pd.DataFrame:
    """Measure on `world_size` ranks, store the algorithms' times, print and write collectives.csv.

    The times go to `out_dir` (or, `into_package`, to the package's files), and the
    side-by-side run's "auto" decides from them there (the folder is handed to its ranks)."""
    folder = choose.STORED.parent if into_package else Path(out_dir)
    sizes = QUICK_SIZES if quick else SIZES
    trials = QUICK_TRIALS if quick else TRIALS
    min_trial_s = QUICK_MIN_TRIAL_S if quick else MIN_TRIAL_S
    machine_at_start = stored.machine()
    rows = launch.spawn(collectives_lab.time_primitives, sizes, trials, min_trial_s, FIRST_RUN,
                        world_size=world_size, timeout_s=3600)[0]
    if not quick:
        store_all(rows, world_size, trials, folder, machine_at_start)
    side_by_side, decisions = launch.spawn(
        time_side_by_side, sizes, trials, min_trial_s, None if quick else str(folder),
        world_size=world_size, timeout_s=3600)[0]
    rows += side_by_side
    if not quick:  # again, with the side-by-side run's "auto" and "gloo" rows for the lesson
        store_all(rows, world_size, trials, folder, machine_at_start)
    for collective, decided in decisions.items():
        print(f"auto {collective} ran " + ", ".join(
            f"{name} from {start} B" for start, name in zip(decided.starts, decided.algorithms))
            + f" (decided from {decided.source})")
    table = comparison_table(rows, world_size)
    path = Path(out_dir) / "collectives.csv"
    table.to_csv(path, index=False)
    with pd.option_context("display.width", 160, "display.max_rows", 200):
        print(f"lesson 76 benchmark: {world_size} ranks, gloo, median of {trials} trials")
        print(table.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    for primitive in ("auto all_reduce", "auto reduce_scatter", "auto all_gather"):
        ratios = table[table.primitive == primitive].ratio
        print(f"{primitive} / gloo: worst {ratios.max():.2f}x, best {ratios.min():.2f}x")
    print(f"table written to {path}")
    return table

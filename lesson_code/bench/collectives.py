"""Benchmark of lesson 76: our collectives beside gloo's built-ins, 1 KiB to 64 MiB on 4 ranks.

    python -m lesson_code.bench collectives [--world-size 4] [--out-dir bench-results]

Two runs of ranks. The first times every all-reduce algorithm and the other primitives; their
all-reduce times are stored with the package (`collectives/measured_all_reduce.csv`, with this
machine and the date), where `all_reduce(algorithm="auto")` fits its cost model. The second
times "auto" and gloo's all_reduce side by side, so the comparison that matters is measured in
one run; their rows are stored too (as "auto" and "gloo"), for lesson 76. Prints time, algbw and busbw (nccl-tests definitions) of each primitive next to the gloo
built-in doing the same job, with the ratio ours / built-in, and writes the table as CSV. A
`--quick` run stores nothing.
"""

from __future__ import annotations

import datetime
import os
import platform
from pathlib import Path

import pandas as pd
import torch

from lesson_code import collectives_lab, launch
from lesson_code.collectives import choose, cost_model

SIZES = [2 ** k for k in range(10, 27, 2)]  # 1 KiB, 4 KiB, ..., 64 MiB
QUICK_SIZES = [2 ** 10, 2 ** 16, 2 ** 20]
PAIRS = [  # (our primitive, the built-in doing the same job, the nccl-tests algorithm name)
    ("ring all_reduce", "gloo all_reduce", "all_reduce"),
    ("naive all_reduce", "gloo all_reduce", "all_reduce"),
    ("recursive_doubling all_reduce", "gloo all_reduce", "all_reduce"),
    ("halving_doubling all_reduce", "gloo all_reduce", "all_reduce"),
    ("auto all_reduce", "gloo all_reduce", "all_reduce"),
    ("ring reduce_scatter", "gloo reduce_scatter", "reduce_scatter"),
    ("ring all_gather", "gloo all_gather", "all_gather"),
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


# Stored names: the algorithms, and "auto" and "gloo" from the side-by-side run.
ALGORITHM_OF = {f"{name} all_reduce": name for name in (*choose.ALL_REDUCE, "auto", "gloo")}
FIRST_RUN = [op for op in collectives_lab.TIMED_OPS if op not in ("auto all_reduce", "gloo all_reduce")]


def algorithm_rows(rows: list[dict], world_size: int) -> list[dict]:
    """The all-reduce times (algorithms, auto, gloo) as `choose.store_times` wants them."""
    return [{"algorithm": ALGORITHM_OF[row["op"]], "world_size": world_size,
             "nbytes": row["nbytes"], "seconds": row["seconds"]}
            for row in rows if row["op"] in ALGORITHM_OF]


def machine_note(world_size: int, trials: int) -> str:
    """Where and when: for the comment lines of the stored times."""
    return (f"all-reduce times of {world_size} gloo ranks, median of {trials} trials, measured "
            f"{datetime.date.today().isoformat()} by python -m lesson_code.bench collectives\n"
            f"machine: {' '.join(filter(None, (platform.machine(), platform.processor())))}, "
            f"{os.cpu_count()} cores, "
            f"{platform.system()}, Python {platform.python_version()}, torch {torch.__version__}")


def run(world_size: int, out_dir: Path, quick: bool = False) -> pd.DataFrame:
    """Measure on `world_size` ranks, store the algorithms' times, print and write collectives.csv."""
    sizes = QUICK_SIZES if quick else SIZES
    trials = 3 if quick else 7
    min_trial_s = 0.05 if quick else 0.2
    rows = launch.spawn(collectives_lab.time_primitives, sizes, trials, min_trial_s, FIRST_RUN,
                        world_size=world_size, timeout_s=3600)[0]
    if not quick:
        stored = choose.store_times(algorithm_rows(rows, world_size),
                                    machine_note(world_size, trials))
        print(f"all-reduce algorithm times stored in {stored}")
    rows += launch.spawn(collectives_lab.time_primitives, sizes, trials, min_trial_s,
                         ["auto all_reduce", "gloo all_reduce"], world_size=world_size,
                         timeout_s=3600)[0]
    if not quick:  # again, with the side-by-side run's "auto" and "gloo" rows for the lesson
        choose.store_times(algorithm_rows(rows, world_size), machine_note(world_size, trials))
    table = comparison_table(rows, world_size)
    path = Path(out_dir) / "collectives.csv"
    table.to_csv(path, index=False)
    with pd.option_context("display.width", 160, "display.max_rows", 200):
        print(f"lesson 76 benchmark: {world_size} ranks, gloo, median of {trials} trials")
        print(table.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    for primitive in ("auto all_reduce", "ring reduce_scatter", "ring all_gather"):
        ratios = table[table.primitive == primitive].ratio
        print(f"{primitive} / gloo: worst {ratios.max():.2f}x, best {ratios.min():.2f}x")
    print(f"table written to {path}")
    return table

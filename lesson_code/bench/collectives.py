"""Benchmark of lesson 76: ring primitives beside gloo's built-ins, 1 KiB to 64 MiB on 4 ranks.

    python -m lesson_code.bench collectives [--world-size 4] [--out-dir bench-results]

Prints time, algbw and busbw (nccl-tests definitions) of each ring primitive next to the gloo
built-in doing the same job, with the ratio ring / built-in, and writes the table as CSV.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from lesson_code import collectives_lab, launch
from lesson_code.collectives import cost_model

SIZES = [2 ** k for k in range(10, 27, 2)]  # 1 KiB, 4 KiB, ..., 64 MiB
QUICK_SIZES = [2 ** 10, 2 ** 16, 2 ** 20]
PAIRS = [  # (our primitive, the built-in doing the same job, the nccl-tests algorithm name)
    ("ring all_reduce", "gloo all_reduce", "all_reduce"),
    ("naive all_reduce", "gloo all_reduce", "all_reduce"),
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


def run(world_size: int, out_dir: Path, quick: bool = False) -> pd.DataFrame:
    """Measure on `world_size` ranks, print the comparison and write collectives.csv."""
    sizes = QUICK_SIZES if quick else SIZES
    trials = 3 if quick else 7
    rows = launch.spawn(collectives_lab.time_primitives, sizes, trials, 0.05 if quick else 0.2,
                        world_size=world_size, timeout_s=3600)[0]
    table = comparison_table(rows, world_size)
    path = Path(out_dir) / "collectives.csv"
    table.to_csv(path, index=False)
    with pd.option_context("display.width", 160, "display.max_rows", 200):
        print(f"lesson 76 benchmark: {world_size} ranks, gloo, median of {trials} trials")
        print(table.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    ring = table[table.primitive == "ring all_reduce"]
    print(f"ring all_reduce / gloo all_reduce: worst {ring.ratio.max():.2f}x, "
          f"best {ring.ratio.min():.2f}x; table written to {path}")
    return table

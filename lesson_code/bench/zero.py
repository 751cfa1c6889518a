"""Benchmark of lesson 78: our DDP, ZeRO-1, naive ZeRO and torch's ZeroRedundancyOptimizer.

    python -m lesson_code.bench zero [--world-size 4] [--out-dir bench-results]

Each rank trains the 4.8M-parameter MiniGPT of the DDP benchmark with Adam on 8 sequences; the
table gives the slowest rank's median per phase over 8 steps (after 2 warm-up steps), the time
the ring communication itself took (`comm_ms`: inside the optimizer step for ZeRO, on a background
thread during backward for our DDP; not counted for torch's optimizer, which uses gloo), the bytes
each rank sent per step, and the step time relative to our DDP and to ZeroRedundancyOptimizer. A
full run also stores the table with the package (`lesson_code/measured_zero.csv`, with this machine and
the date); a `--quick` run stores nothing.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pandas as pd

from lesson_code import launch
from lesson_code.bench import stored
from lesson_code.bench.ddp import BENCH_GPT, QUICK_GPT
from lesson_code.models import build_model, count_parameters
from lesson_code.zero_lab import ZeroRun, time_steps

VARIANTS = ["ddp", "zero", "naive_zero", "torch_zero"]
PHASES = ("forward", "backward", "optimizer", "comm", "step")


def run(world_size: int, out_dir: Path, quick: bool = False,
        into_package: bool = False) -> pd.DataFrame:
    """Time every variant on `world_size` ranks, print the table, write zero.csv (and store it)."""
    config = QUICK_GPT if quick else BENCH_GPT
    base = ZeroRun(model="gpt", gpt=config, batch_size=8 * world_size, steps=3 if quick else 8)
    rows = []
    for optimizer in VARIANTS:
        per_rank = launch.spawn(time_steps, replace(base, optimizer=optimizer),
                                world_size=world_size, timeout_s=1800)
        slowest = {name: max(rank[name] for rank in per_rank) for name in PHASES}
        rows.append({"optimizer": optimizer, **{f"{name}_ms": 1e3 * slowest[name] for name in PHASES},
                     "MB_sent_per_step": per_rank[0]["bytes_sent"] / 2 ** 20})
    table = pd.DataFrame(rows).set_index("optimizer")
    table["vs_our_ddp"] = table.step_ms / table.step_ms["ddp"]
    table["vs_torch_zero"] = table.step_ms / table.step_ms["torch_zero"]
    parameters = count_parameters(build_model("gpt", 0, config))
    table["parameters"] = parameters
    path = Path(out_dir) / "zero.csv"
    table.to_csv(path)
    title = (f"lesson 78 benchmark: MiniGPT with {parameters:,} parameters, {world_size} ranks, "
             f"batch 8 per rank, Adam; slowest rank's median per phase over {base.steps} steps "
             "(ddp = our bucketed DDP + unsharded fp32-master Adam)")
    print(title)
    with pd.option_context("display.width", 200):
        print(table.to_string(float_format=lambda v: f"{v:.2f}"))
    print(f"table written to {path}")
    if not quick:
        folder = stored.STORED if into_package else out_dir
        print(f"stored in {stored.store(table, 'zero', title, folder)}")
    return table

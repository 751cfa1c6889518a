"""Benchmark of lesson 78: our DDP, ZeRO-1, naive ZeRO and torch's ZeroRedundancyOptimizer.

    python -m lesson_code.bench zero [--world-size 4] [--out-dir bench-results]

Each rank trains the 4.8M-parameter MiniGPT of the DDP benchmark with Adam on 8 sequences; the
table gives the slowest rank's median per phase over 8 steps (after 2 warm-up steps), the bytes
each rank sent per step (ring communicator; torch's optimizer uses gloo, uncounted), and the step
time relative to our DDP and to ZeroRedundancyOptimizer.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pandas as pd

from lesson_code import launch
from lesson_code.bench.ddp import BENCH_GPT, QUICK_GPT
from lesson_code.zero_lab import ZeroRun, time_steps

VARIANTS = ["ddp", "zero", "naive_zero", "torch_zero"]


def run(world_size: int, out_dir: Path, quick: bool = False) -> pd.DataFrame:
    """Time every variant on `world_size` ranks, print the table and write zero.csv."""
    config = QUICK_GPT if quick else BENCH_GPT
    base = ZeroRun(model="gpt", gpt=config, batch_size=8 * world_size, steps=3 if quick else 8)
    rows = []
    for optimizer in VARIANTS:
        per_rank = launch.spawn(time_steps, replace(base, optimizer=optimizer),
                                world_size=world_size, timeout_s=1800)
        slowest = {name: max(rank[name] for rank in per_rank) for name in per_rank[0]}
        rows.append({"optimizer": optimizer, **{f"{name}_ms": 1e3 * slowest[name]
                                                for name in ("forward", "backward", "optimizer", "step")},
                     "MB_sent_per_step": per_rank[0]["bytes_sent"] / 2 ** 20})
    table = pd.DataFrame(rows).set_index("optimizer")
    table["vs_our_ddp"] = table.step_ms / table.step_ms["ddp"]
    table["vs_torch_zero"] = table.step_ms / table.step_ms["torch_zero"]
    path = Path(out_dir) / "zero.csv"
    table.to_csv(path)
    print(f"lesson 78 benchmark: MiniGPT {config}, {world_size} ranks, Adam; slowest rank's "
          "median per phase (ddp = our bucketed DDP + unsharded fp32-master Adam)")
    with pd.option_context("display.width", 200):
        print(table.to_string(float_format=lambda v: f"{v:.2f}"))
    print(f"table written to {path}")
    return table

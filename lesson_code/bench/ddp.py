"""Benchmark of lesson 77: step time of naive, bucketed and torch DDP on a ~5M-parameter MiniGPT.

    python -m lesson_code.bench ddp [--world-size 4] [--out-dir bench-results]

Each rank trains MiniGPT (6 blocks, 256 wide, context 64; 4.8M parameters) with Adam on 8
sequences; the table gives the slowest rank's median per phase over 8 steps after 2 warm-up
steps, and the step time relative to torch's DistributedDataParallel with the same bucket size
(4 MB). Two more rows time the bucketed wrapper with smaller and larger buckets. A full run also
stores the table with the package (`lesson_code/measured_ddp.csv`, with this machine and the date),
where lesson 77 reads it; a `--quick` run stores nothing.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pandas as pd

from lesson_code import launch
from lesson_code.bench import stored
from lesson_code.ddp_lab import DDPRun, time_steps
from lesson_code.models import GPTConfig, build_model, count_parameters

BENCH_GPT = GPTConfig(n_embd=256, n_layer=6, n_head=8, context=64)
QUICK_GPT = GPTConfig(n_embd=64, n_layer=2, n_head=4, context=32)  # `--quick`: a smoke run
BUCKET_MB = 4.0
# (wrapper, communicator, bucket MB): the four variants, then the bucketed ring at two other sizes
VARIANTS = [("naive", "ring", BUCKET_MB), ("bucketed", "ring", BUCKET_MB),
            ("bucketed", "builtin", BUCKET_MB), ("torch", "builtin", BUCKET_MB),
            ("bucketed", "ring", 0.25), ("bucketed", "ring", 32.0)]


def run(world_size: int, out_dir: Path, quick: bool = False,
        into_package: bool = False) -> pd.DataFrame:
    """Time every variant on `world_size` ranks, print the table, write ddp.csv (and store it)."""
    config = QUICK_GPT if quick else BENCH_GPT
    base = DDPRun(model="gpt", gpt=config, optimizer="adam", batch_size=8 * world_size,
                  steps=3 if quick else 8)
    rows = []
    for wrapper, comm, bucket_mb in VARIANTS:
        phases = launch.spawn(time_steps, replace(base, wrapper=wrapper, comm=comm,
                                                  bucket_cap_mb=bucket_mb),
                              world_size=world_size, timeout_s=1800)
        slowest = {name: max(rank[name] for rank in phases) for name in phases[0]}
        rows.append({"wrapper": wrapper, "comm": comm, "bucket_mb": bucket_mb,
                     **{f"{name}_ms": 1e3 * value for name, value in slowest.items()}})
    table = pd.DataFrame(rows)
    table["vs_torch"] = table.step_ms / table.step_ms[table.wrapper == "torch"].iloc[0]
    table["hidden_comm_ms"] = table.comm_ms - table.wait_ms
    parameters = count_parameters(build_model("gpt", 0, config))
    table["parameters"] = parameters
    path = Path(out_dir) / "ddp.csv"
    table.to_csv(path, index=False)
    title = stored.description("ddp", parameters=f"{parameters:,}", ranks=world_size, batch=8,
                               steps=base.steps)
    print(title)
    with pd.option_context("display.width", 200):
        print(table.to_string(index=False, float_format=lambda v: f"{v:.2f}"))
    print(f"table written to {path}")
    if not quick:
        folder = stored.STORED if into_package else out_dir
        print(f"stored in {stored.store(table, 'ddp', title, folder)}")
    return table

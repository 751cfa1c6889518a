"""Benchmark of lesson 77: step time of naive, bucketed and torch DDP on a ~5M-parameter MiniGPT.

    python -m lesson_code.bench ddp [--world-size 4] [--out-dir bench-results]

Each rank trains MiniGPT (6 blocks, 256 wide, context 64; 4.8M parameters) with Adam on 8
sequences, once with each variant: the naive wrapper, the bucketed wrapper (ring and built-in
all-reduce) and torch's DistributedDataParallel with 4 MiB buckets, and the bucketed ring wrapper
with 0.25 MiB buckets and with one bucket of 32 MiB, which holds every gradient. All variants are
built in one process group and timed in alternation (`ddp_lab.time_variants`): ROUNDS rounds of
STEPS step of each, the variant that goes first changing every round, so that load from other
work on the machine falls on all of them alike. Of every step the table keeps the phases of the
rank whose step took longest; it gives each phase's median over all rounds, the range of the
per-round median step, and each variant's step relative to torch DDP's and to the one-bucket
variant's, round by round (median and range): a ratio whose range straddles 1 is within this
machine's noise. A full run also stores the table with the package
(`lesson_code/measured_ddp.csv`, with this machine, the date and the load before and after),
where lesson 77 reads it; a `--quick` run stores nothing.
"""

from __future__ import annotations

import os
import statistics
from dataclasses import replace
from pathlib import Path

import pandas as pd

from lesson_code import launch
from lesson_code.bench import stored
from lesson_code.ddp_lab import DDPRun, time_variants
from lesson_code.models import GPTConfig, build_model, count_parameters

BENCH_GPT = GPTConfig(n_embd=256, n_layer=6, n_head=8, context=64)
QUICK_GPT = GPTConfig(n_embd=64, n_layer=2, n_head=4, context=32)  # `--quick`: a smoke run
BUCKET_MB = 4.0  # MiB, as torch's bucket_cap_mb
ONE_BUCKET_MB = 32.0  # more than the 18.3 MiB of gradients: one bucket, reduced after backward
# (wrapper, communicator, bucket MiB): the four wrappers, then the bucketed ring at two other
# sizes. The naive wrapper has no buckets (its bucket size is not used).
VARIANTS = [("naive", "ring", BUCKET_MB), ("bucketed", "ring", BUCKET_MB),
            ("bucketed", "builtin", BUCKET_MB), ("torch", "builtin", BUCKET_MB),
            ("bucketed", "ring", 0.25), ("bucketed", "ring", ONE_BUCKET_MB)]
SEQUENCES = 8  # per rank
ROUNDS, STEPS = 24, 1  # a step of each variant per round, each first 4 times: ~4 min here
PHASES = ("forward", "backward", "wait", "check", "optimizer", "step", "comm")


def summarise(per_rank: list, variants: list[tuple[str, str, float]]) -> pd.DataFrame:
    """The table of `per_rank` (what `time_variants` returned on each rank) for `variants`.

    Of every step, the phases of the rank whose step took longest (so they add up to that
    step); each phase's median over all steps (ms); the range of the per-round median step; and,
    round by round, each variant's median step over torch DDP's and over the one-bucket
    variant's (`vs_torch`, `vs_one_bucket`: median, low, high).
    """
    slowest = [[[max((rank[v][r][s] for rank in per_rank), key=lambda p: p["step"])
                 for s in range(len(per_rank[0][v][r]))]
                for r in range(len(per_rank[0][v]))] for v in range(len(variants))]
    round_steps = [[statistics.median(p["step"] for p in steps) for steps in rounds]
                   for rounds in slowest]
    references = {"vs_torch": [w for w, _, _ in variants].index("torch"),
                  "vs_one_bucket": variants.index(("bucketed", "ring", ONE_BUCKET_MB))}
    rows = []
    for index, (wrapper, comm, bucket_mb) in enumerate(variants):
        steps = [p for round_ in slowest[index] for p in round_]
        row = {"wrapper": wrapper, "comm": comm,
               "bucket_mb": float("nan") if wrapper == "naive" else bucket_mb}
        row.update({f"{phase}_ms": 1e3 * statistics.median(p[phase] for p in steps)
                    for phase in PHASES})
        row["step_low_ms"] = 1e3 * min(round_steps[index])
        row["step_high_ms"] = 1e3 * max(round_steps[index])
        # The all-reduce calls' time before the backward ended (waits for slower ranks included),
        # comm - wait of each step, then the median: a difference of medians is no step's split.
        row["hidden_comm_ms"] = 1e3 * statistics.median(p["comm"] - p["wait"] for p in steps)
        for name, reference in references.items():
            ratios = [a / b for a, b in zip(round_steps[index], round_steps[reference])]
            row.update({name: statistics.median(ratios), f"{name}_low": min(ratios),
                        f"{name}_high": max(ratios)})
        rows.append(row)
    return pd.DataFrame(rows)


# `summarise`'s columns that lesson 77 shows, under the names its table of columns explains;
# each ratio as its median over the rounds, then its lowest and highest round.
BOOK_COLUMNS = {"wrapper": "wrapper", "comm": "communicator", "bucket_mb": "bucket MiB",
                "forward_ms": "forward", "backward_ms": "backward", "wait_ms": "wait",
                "check_ms": "check", "optimizer_ms": "optimizer", "step_ms": "step", "comm_ms": "comm",
                "hidden_comm_ms": "comm during backward", "vs_torch": "vs torch",
                "vs_torch_low": "vs torch low", "vs_torch_high": "vs torch high",
                "vs_one_bucket": "vs one bucket", "vs_one_bucket_low": "vs one bucket low",
                "vs_one_bucket_high": "vs one bucket high"}


def book_table(table: pd.DataFrame) -> pd.DataFrame:
    """`table` (`summarise`'s, as stored) as lesson 77 shows it: the columns of BOOK_COLUMNS,
    renamed, times in ms to 0.1 ms and ratios to 0.01 (the bucket sizes as they are)."""
    shown = table[list(BOOK_COLUMNS)].rename(columns=BOOK_COLUMNS)
    times = [BOOK_COLUMNS[c] for c in BOOK_COLUMNS if c.endswith("_ms")]
    ratios = [BOOK_COLUMNS[c] for c in BOOK_COLUMNS if c.startswith("vs_")]
    return shown.round(dict.fromkeys(times, 1) | dict.fromkeys(ratios, 2))


def run(world_size: int, out_dir: Path, quick: bool = False,
        into_package: bool = False) -> pd.DataFrame:
    """Time every variant on `world_size` ranks, print the table, write ddp.csv (and store it)."""
    config = QUICK_GPT if quick else BENCH_GPT
    rounds, steps = (2, 1) if quick else (ROUNDS, STEPS)
    base = DDPRun(model="gpt", gpt=config, optimizer="adam", batch_size=SEQUENCES * world_size)
    runs = [replace(base, wrapper=wrapper, comm=comm, bucket_cap_mb=bucket_mb)
            for wrapper, comm, bucket_mb in VARIANTS]
    machine_at_start = stored.machine()
    per_rank = launch.spawn(time_variants, runs, rounds, steps, world_size=world_size,
                            timeout_s=1800)
    load_after = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    table = summarise(per_rank, VARIANTS)
    parameters = count_parameters(build_model("gpt", 0, config))
    table["parameters"] = parameters
    path = Path(out_dir) / "ddp.csv"
    table.to_csv(path, index=False)
    title = stored.description("ddp", parameters=f"{parameters:,}", ranks=world_size, batch=SEQUENCES,
                               rounds=rounds, steps=steps, load=f"{load_after:.2f}")
    print(title)
    with pd.option_context("display.width", 250):
        print(table.to_string(index=False, float_format=lambda v: f"{v:.2f}"))
    print(f"table written to {path}")
    if not quick:
        folder = stored.STORED if into_package else out_dir
        print(f"stored in {stored.store(table, 'ddp', title, folder, machine_at_start)}")
    return table

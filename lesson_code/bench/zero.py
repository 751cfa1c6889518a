"""Benchmarks of lesson 78: our DDP, ZeRO-1, naive ZeRO and torch's ZeroRedundancyOptimizer
(`run`); and the peak memory and step time of DDP and ZeRO stages 1-3 on 1, 2 and 4 ranks
(`run_stages`).

    python -m lesson_code.bench zero [--world-size 4] [--out-dir bench-results]
    python -m lesson_code.bench zero_stages [--world-size 4] [--out-dir bench-results]

Each rank trains the 4.8M-parameter MiniGPT of the DDP benchmark with Adam on 8 sequences; the
table gives the slowest rank's median per phase over 8 steps (after 2 warm-up steps), the time
the ring communication itself took (`comm_ms`: inside the optimizer step for ZeRO, on a background
thread during backward for our DDP; not counted for torch's optimizer, which uses gloo), the bytes
each rank sent per step (`MB_sent_per_step`, in MB of 10**6 bytes, as the lessons count them), and
the step time relative to our DDP and to ZeroRedundancyOptimizer. A full run also stores the table
with the package (`lesson_code/measured_zero.csv`, with this machine and the date); a `--quick`
run stores nothing.

`zero_stages` trains `zero_lab.MEMORY_RUN` (a MiniGPT of 0.8M parameters on 4 sequences of 8
tokens, whose gradients are a large share of its memory) under DDP, ZeRO-1, ZeRO-2 and ZeRO-3
on 1, 2, 4, ... ranks up to --world-size: per world size and stage, the peak bytes a rank
allocated in a step (`zero_lab.stage_memory_table`: torch's allocator as its profiler reports
it, the highest rank; DDP is `NaiveDDP` there), the formula of `lesson_code.memory` beside it
with what the gap is made of, and the slowest rank's median step time over 8 steps (after 2
warm-up steps; DDP is the bucketed one there), the time its communication took and the MB
(10**6 bytes) each rank sent. Stored as `measured_zero_stages.csv`.
The step is so small that, with more ranks than cores, each collective call waits for the other
ranks to be scheduled: its time columns count the calls a stage makes per step (ZeRO-1 two; DDP,
ZeRO-2 and ZeRO-3 per bucket or per layer) more than the bytes (there ZeRO-1's two calls make
it far faster than the bucketed DDP), so the lessons read only its memory columns; `bench zero`,
where our DDP makes one call, is the timing benchmark.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pandas as pd

from lesson_code import launch
from lesson_code.bench import stored
from lesson_code.bench.ddp import BENCH_GPT, QUICK_GPT
from lesson_code.ddp_lab import each_run
from lesson_code.models import build_model, count_parameters
from lesson_code.zero_lab import (MEMORY_RUN, STAGE_OPTIMIZERS, ZeroRun, run_model,
                                  stage_memory_table, time_steps)

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
                     "MB_sent_per_step": per_rank[0]["bytes_sent"] / 1e6})
    table = pd.DataFrame(rows).set_index("optimizer")
    table["vs_our_ddp"] = table.step_ms / table.step_ms["ddp"]
    table["vs_torch_zero"] = table.step_ms / table.step_ms["torch_zero"]
    parameters = count_parameters(build_model("gpt", 0, config))
    table["parameters"] = parameters
    title = (f"lesson 78 benchmark: MiniGPT with {parameters:,} parameters, {world_size} ranks, "
             f"batch 8 per rank, Adam; slowest rank's median per phase over {base.steps} steps "
             "(ddp = our bucketed DDP + unsharded fp32-master Adam)")
    return report(table, "zero", title, out_dir, quick, into_package)


def report(table: pd.DataFrame, name: str, title: str, out_dir: Path, quick: bool,
           into_package: bool) -> pd.DataFrame:
    """Print `title` and `table`, write it as <name>.csv in `out_dir` and, unless `quick`, store
    it (`stored.store`: in the package with `into_package`, else in `out_dir`)."""
    path = Path(out_dir) / f"{name}.csv"
    table.to_csv(path)
    print(title)
    with pd.option_context("display.width", 250, "display.max_columns", 40):
        print(table.to_string(float_format=lambda v: f"{v:.2f}"))
    print(f"table written to {path}")
    if not quick:
        folder = stored.STORED if into_package else out_dir
        print(f"stored in {stored.store(table, name, title, folder)}")
    return table


def run_stages(world_size: int, out_dir: Path, quick: bool = False,
               into_package: bool = False) -> pd.DataFrame:
    """Measure each stage's peak memory and step time on 1, 2, 4, ... up to `world_size` ranks
    (1 and 2 with `quick`); print the table, write zero_stages.csv (and store it)."""
    world_sizes = [n for n in ((1, 2) if quick else (1, 2, 4, 8, 16, 32)) if n <= world_size]
    table = stage_memory_table(MEMORY_RUN, world_sizes)
    timed = replace(MEMORY_RUN, steps=3 if quick else 8)
    # Timed, DDP is lesson 77's bucketed DDP: NaiveDDP's all-reduce per parameter is not a fair
    # clock. (Its buckets' copy of the gradients, and its all-reduces on a thread of their own,
    # are why the memory columns measure NaiveDDP instead.)
    optimizers = {**STAGE_OPTIMIZERS, "DDP": "ddp"}
    for n in world_sizes:
        per_rank = launch.spawn(each_run, time_steps,
                                [replace(timed, optimizer=name) for name in optimizers.values()],
                                world_size=n, timeout_s=1800)
        for index, stage in enumerate(STAGE_OPTIMIZERS):
            for phase in ("step", "comm"):
                table.loc[(n, stage), f"{phase}_ms"] = 1e3 * max(r[index][phase] for r in per_rank)
            table.loc[(n, stage), "MB_sent_per_step"] = per_rank[0][index]["bytes_sent"] / 1e6
    ddp_ms = table["step_ms"].xs("DDP", level="stage")
    table["vs_ddp"] = table["step_ms"] / ddp_ms.reindex(table.index.get_level_values("N")).values
    table["parameters"] = count_parameters(run_model(MEMORY_RUN))
    table = table.reset_index(level="stage")
    config = MEMORY_RUN.gpt
    title = (f"lesson 78 stages: MiniGPT with {table['parameters'].iloc[0]:,} parameters "
             f"({config.n_layer} blocks of width {config.n_embd}), float32, global batch "
             f"{MEMORY_RUN.batch_size} x {config.context} tokens, Adam; bytes per rank: peak "
             "allocated in one step (torch's allocator, as its profiler reports it; the highest "
             "rank) beside the formula; slowest rank's median step over "
             f"{timed.steps} steps. DDP: our NaiveDDP (memory) or bucketed DDP (time), with "
             "fp32-master Adam")
    return report(table, "zero_stages", title, out_dir, quick, into_package)

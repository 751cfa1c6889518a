"""Benchmark of lesson 79: the measured pipeline bubble against (P - 1)/(m + P - 1).

    python -m lesson_code.bench pipeline [--out-dir bench-results]

Runs 1F1B steps of the lesson's wide MiniGPT (`pipeline_lab.WIDE_GPT`) on P = 2 and P = 4
stages with m = 1, 2, 4, 8, 16 micro-batches of a fixed size (8 sequences), so that every
micro-batch costs the same compute whatever m is. Each setting runs `WARMUP + REPEATS` steps;
the bubble is the median over the measured steps, with their minimum and maximum. The table is
stored as `measured_pipeline_bubble.csv` (with this machine and the date in its comment lines) in
bench-results/, or with `--into-package` in the package, where lesson 79 reads it; `--quick`
stores nothing.
"""

from __future__ import annotations

import datetime
from pathlib import Path

import pandas as pd

from lesson_code import launch, pipeline_lab
from lesson_code.pipeline import theoretical_bubble
from lesson_code.pipeline_lab import WIDE_GPT, PipeRun
from lesson_code.bench import stored
from lesson_code.harness.files import replacing
from lesson_code.harness.timing import machine_line

STORED = Path(__file__).resolve().parents[1] / "measured_pipeline_bubble.csv"
STAGES = (2, 4)
MICRO_BATCHES = (1, 2, 4, 8, 16)
SEQUENCES_PER_MICRO_BATCH = 8
WARMUP, REPEATS = 1, 7


def sweep_runs(micro_batches: tuple[int, ...], repeats: int) -> list[PipeRun]:
    """One 1F1B run per m, each micro-batch `SEQUENCES_PER_MICRO_BATCH` sequences."""
    return [PipeRun(gpt=WIDE_GPT, batch_size=SEQUENCES_PER_MICRO_BATCH * m, micro_batches=m,
                    schedule="1f1b", steps=WARMUP + repeats) for m in micro_batches]


def measure(stages: tuple[int, ...] = STAGES, micro_batches: tuple[int, ...] = MICRO_BATCHES,
            repeats: int = REPEATS) -> pd.DataFrame:
    """One row per (P, m): median, min and max measured bubble, the formula, the floor, step time."""
    rows = []
    for p in stages:
        runs = sweep_runs(micro_batches, repeats)
        results = launch.spawn(pipeline_lab.timed_sweep, runs, WARMUP, world_size=p,
                               timeout_s=3600)[0]
        for run, result in zip(runs, results):
            rows.append({"P": p, "m": run.micro_batches, "measured": result["bubble"],
                         "lowest": min(result["bubbles"]), "highest": max(result["bubbles"]),
                         "formula": theoretical_bubble(p, run.micro_batches),
                         "imbalance_floor": result["floor"], "step_s": result["step_seconds"]})
    return pd.DataFrame(rows)


def machine_note(repeats: int) -> str:
    """Where and when, for the comment lines of the stored table."""
    return (stored.description("pipeline", repeats=repeats, warmup=WARMUP,
                               sequences=SEQUENCES_PER_MICRO_BATCH,
                               date=datetime.date.today().isoformat())
            + f"\nmachine: {machine_line()}")


def store(table: pd.DataFrame, note: str, path: Path | str = STORED) -> Path:
    """Write `table` as CSV after `note` as comment lines; replaced whole (`files.replacing`)."""
    path = Path(path)
    with replacing(path) as handle:
        handle.writelines(f"# {line}\n" for line in note.splitlines())
        table.to_csv(handle, index=False)
    return path


def read_stored(path: Path | str = STORED) -> tuple[list[str], pd.DataFrame]:
    """The stored table and its comment lines (what was measured, where and when)."""
    lines = Path(path).read_text().splitlines()
    note = [line.removeprefix("# ") for line in lines if line.startswith("#")]
    return note, pd.read_csv(path, comment="#")


def run(world_size: int, out_dir: Path, quick: bool = False, into_package: bool = False,
        repeats: int | None = None) -> pd.DataFrame:
    """Measure the sweep (P = 2 and 4 whatever `world_size`), print it, write pipeline.csv."""
    repeats = repeats or (2 if quick else REPEATS)
    table = measure(micro_batches=(1, 4) if quick else MICRO_BATCHES, repeats=repeats)
    if not quick:
        folder = STORED.parent if into_package else Path(out_dir)
        print(f"stored in {store(table, machine_note(repeats), folder / STORED.name)}")
    path = Path(out_dir) / "pipeline.csv"
    table.to_csv(path, index=False)
    print(f"lesson 79 benchmark: 1F1B bubble, median of {repeats} steps")
    print(table.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    print(f"table written to {path}")
    return table

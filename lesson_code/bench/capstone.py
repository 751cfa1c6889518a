"""Benchmark of lesson 81: wall time of the whole capstone command against a torch-only twin.

    python -m lesson_code.bench capstone

Runs `python -m lesson_code.capstone` (our DDP broadcast + ZeRO-1 + sharded checkpoint) and
`python -m lesson_code.capstone.torch_baseline` (DistributedDataParallel +
ZeroRedundancyOptimizer + torch.distributed.checkpoint), each from process start to exit,
alternately, and reports the median of the runs, and whether both printed the same loss per step
(to the five decimals they print). The table is stored as `measured_capstone.csv` (with this
machine and the date in its comment lines) in bench-results/, or with `--into-package` in the
package, where lesson 81 reads it; `--quick` stores nothing. Beside it, `measured_capstone_curve.csv`
keeps the loss curve of one run of the command with a learning-rate spike at step 13 (steps, and
the guard's rollback), which lesson 81's explorer draws.
"""

from __future__ import annotations

import csv
import datetime
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

from lesson_code.capstone.report import read_metrics
from lesson_code.harness.files import replacing
from lesson_code.harness.timing import machine_line

STORED = Path(__file__).resolve().parents[1] / "measured_capstone.csv"
CURVE = STORED.with_name("measured_capstone_curve.csv")
SPIKE_STEP = 13  # as lesson 81's own spiked run
CURVE_COLUMNS = ("step", "loss", "event", "reason", "to_step", "at_step")
LOSS_ROW = re.compile(r"^\s*(\d+)\s+(\d+\.\d{5})(\s|$)")
COMMANDS = {
    "lesson_code.capstone (ours)": ["-m", "lesson_code.capstone"],
    "torch DDP + ZeroRedundancyOptimizer + DCP": ["-m", "lesson_code.capstone.torch_baseline"],
}


def time_command(arguments: list[str], out_dir: str, world_size: int) -> tuple[float, list[str]]:
    """Seconds from starting the Python process to its exit, and the loss rows it printed.

    Raises RuntimeError (with the command's stderr) if it fails.
    """
    environment = dict(os.environ, TORCH_CPP_LOG_LEVEL="ERROR")
    start = time.perf_counter()
    completed = subprocess.run([sys.executable, *arguments, "--out-dir", out_dir,
                                "--world-size", str(world_size)],
                               capture_output=True, text=True, env=environment, timeout=600)
    elapsed = time.perf_counter() - start
    if completed.returncode != 0:
        raise RuntimeError(f"{arguments} failed:\n{completed.stderr[-2000:]}")
    losses = [f"{int(m.group(1))} {m.group(2)}" for m in map(LOSS_ROW.match, completed.stdout.splitlines()) if m]
    return elapsed, losses


def machine_note(world_size: int, repeats: int) -> str:
    """Where and when, for the comment lines of the stored table."""
    return (f"the whole capstone command against its torch-only twin on {world_size} ranks, from "
            f"process start to exit, median of {repeats} runs, measured "
            f"{datetime.date.today().isoformat()} by python -m lesson_code.bench capstone\n"
            f"machine: {machine_line()}")


def store_curve(world_size: int, folder: Path) -> Path:
    """Run the capstone command once with a learning-rate spike at SPIKE_STEP and store its loss
    curve (every step, then the guard's events) as folder/measured_capstone_curve.csv."""
    with tempfile.TemporaryDirectory() as scratch:
        environment = dict(os.environ, TORCH_CPP_LOG_LEVEL="ERROR")
        subprocess.run([sys.executable, "-m", "lesson_code.capstone", "--out-dir", scratch,
                        "--world-size", str(world_size), "--lr-spike-step", str(SPIKE_STEP)],
                       check=True, capture_output=True, text=True, env=environment, timeout=600)
        rows = read_metrics(Path(scratch) / "metrics.jsonl")
    path = folder / CURVE.name
    with replacing(path) as handle:
        handle.write(f"# loss per step of python -m lesson_code.capstone --lr-spike-step {SPIKE_STEP} "
                     f"on {world_size} ranks, and its divergence guard's events, measured "
                     f"{datetime.date.today().isoformat()} by python -m lesson_code.bench capstone\n"
                     f"# machine: {machine_line()}\n")
        writer = csv.DictWriter(handle, fieldnames=CURVE_COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    return path


def read_curve(path: Path | str = CURVE) -> tuple[list[str], list[dict]]:
    """The stored curve's comment lines, and its rows as the capstone's metrics give them: steps
    {step, loss}, events {event, loss, reason, to_step, at_step} (numbers as numbers)."""
    lines = Path(path).read_text().splitlines()
    note = [line.removeprefix("# ") for line in lines if line.startswith("#")]
    rows = []
    for row in csv.DictReader(line for line in lines if not line.startswith("#")):
        kept = {key: value for key, value in row.items() if value != ""}
        for key in ("step", "to_step", "at_step"):
            if key in kept:
                kept[key] = int(kept[key])
        kept["loss"] = float(kept["loss"])
        rows.append(kept)
    return note, rows


def read_stored(path: Path | str = STORED) -> tuple[list[str], pd.DataFrame]:
    """The stored table (one row per command) and its comment lines."""
    lines = Path(path).read_text().splitlines()
    note = [line.removeprefix("# ") for line in lines if line.startswith("#")]
    return note, pd.read_csv(path, comment="#", index_col=0)


def run(world_size: int, out_dir: Path, quick: bool = False, into_package: bool = False,
        repeats: int | None = None) -> pd.DataFrame:
    """Time both commands `repeats` times (default 3, 1 when quick), alternately; print the
    medians and write capstone.csv."""
    repeats = repeats or (1 if quick else 3)
    seconds: dict[str, list[float]] = {name: [] for name in COMMANDS}
    losses: dict[str, list[str]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        for index in range(repeats):
            for name, arguments in COMMANDS.items():
                elapsed, losses[name] = time_command(
                    arguments, f"{scratch}/{index}-{len(seconds[name])}", world_size)
                seconds[name].append(elapsed)
    same = len(set(map(tuple, losses.values()))) == 1 and bool(next(iter(losses.values())))
    table = pd.DataFrame({"median_s": {n: statistics.median(v) for n, v in seconds.items()},
                          "runs_s": {n: " ".join(f"{s:.2f}" for s in v) for n, v in seconds.items()},
                          "loss_rows": {n: len(v) for n, v in losses.items()},
                          "same_losses": {n: same for n in COMMANDS}})
    table.index.name = "command"
    if not quick:
        stored = (STORED.parent if into_package else Path(out_dir)) / STORED.name
        with replacing(stored) as handle:
            handle.writelines(f"# {line}\n" for line in machine_note(world_size, repeats).splitlines())
            table.to_csv(handle)
        print(f"stored in {stored}")
        print(f"stored in {store_curve(world_size, stored.parent)}")
    path = Path(out_dir) / "capstone.csv"
    table.to_csv(path)
    print(f"lesson 81 benchmark: the whole 20-step command on {world_size} ranks, spawn to exit")
    print(table.to_string(float_format=lambda v: f"{v:.2f}"))
    print(f"table written to {path}")
    return table

"""Benchmark of lesson 81: wall time of the whole capstone command against a torch-only twin.

    python -m lesson_code.bench capstone

Runs `python -m lesson_code.capstone` (our DDP broadcast + ZeRO-1 + sharded checkpoint) and
`python -m lesson_code.capstone.torch_baseline` (DistributedDataParallel +
ZeroRedundancyOptimizer + torch.distributed.checkpoint), each from process start to exit,
alternately, and reports the median of the runs.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

COMMANDS = {
    "lesson_code.capstone (ours)": ["-m", "lesson_code.capstone"],
    "torch DDP + ZeroRedundancyOptimizer + DCP": ["-m", "lesson_code.capstone.torch_baseline"],
}


def time_command(arguments: list[str], out_dir: str, world_size: int) -> float:
    """Seconds from starting the Python process to its exit; raises if it fails."""
    environment = dict(os.environ, TORCH_CPP_LOG_LEVEL="ERROR")
    start = time.perf_counter()
    completed = subprocess.run([sys.executable, *arguments, "--out-dir", out_dir,
                                "--world-size", str(world_size)],
                               capture_output=True, text=True, env=environment, timeout=600)
    elapsed = time.perf_counter() - start
    if completed.returncode != 0:
        raise RuntimeError(f"{arguments} failed:\n{completed.stderr[-2000:]}")
    return elapsed


def run(world_size: int, out_dir: Path, quick: bool = False) -> pd.DataFrame:
    """Time both commands `repeats` times, alternately; print medians and write capstone.csv."""
    repeats = 1 if quick else 3
    seconds: dict[str, list[float]] = {name: [] for name in COMMANDS}
    with tempfile.TemporaryDirectory() as scratch:
        for index in range(repeats):
            for name, arguments in COMMANDS.items():
                seconds[name].append(time_command(arguments, f"{scratch}/{index}-{len(seconds[name])}",
                                                  world_size))
    table = pd.DataFrame({"median_s": {n: statistics.median(v) for n, v in seconds.items()},
                          "runs_s": {n: ", ".join(f"{s:.2f}" for s in v) for n, v in seconds.items()}})
    path = Path(out_dir) / "capstone.csv"
    table.to_csv(path)
    print(f"lesson 81 benchmark: the whole 20-step command on {world_size} ranks, spawn to exit")
    print(table.to_string(float_format=lambda v: f"{v:.2f}"))
    print(f"table written to {path}")
    return table

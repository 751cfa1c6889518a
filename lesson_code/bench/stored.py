"""Benchmark tables stored with the package, with the machine and the date they were measured on.

A lesson cannot run a long measurement while its page is built, so it reads the table that
`python -m lesson_code.bench ddp` (or `zero`, `zero_stages`) measured,
`lesson_code/measured_<name>.csv` (package data), headed by comment lines that say when, where
and with which command it was measured.
Run on your machine, a benchmark writes its table into bench-results/ and leaves the package's
alone; `--into-package` replaces the package's (for whoever refreshes the book's figures).

    table, note = load("ddp")        # note["measured"], note["machine"], note["command"]
"""

from __future__ import annotations

import datetime
import os
from pathlib import Path

import pandas as pd

from lesson_code.harness.files import replacing
from lesson_code.harness.timing import machine_line

STORED = Path(__file__).resolve().parents[1]  # lesson_code/, whose measured_*.csv ship with it
NAMES = ("ddp", "zero", "zero_stages")


def path_of(name: str, folder: Path | None = None) -> Path:
    """The stored CSV of benchmark `name` in `folder` (by default the package's, STORED);
    raises ValueError for a benchmark that stores none."""
    if name not in NAMES:
        raise ValueError(f"no stored table for benchmark {name!r}: use one of {', '.join(NAMES)}")
    return Path(STORED if folder is None else folder) / f"measured_{name}.csv"


def machine() -> str:
    """This machine in one line (`timing.machine_line`), and its load average at the start."""
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return f"{machine_line()}, load average {load:.2f} at the start"


def store(table: pd.DataFrame, name: str, description: str, folder: Path) -> Path:
    """Write `table` (index included) as the stored CSV of `name` in `folder`, headed by what,
    when and where it was measured; replaced whole (`files.replacing`), never left cut short."""
    path = path_of(name, folder)
    note = {"description": description, "measured": datetime.date.today().isoformat(),
            "command": f"python -m lesson_code.bench {name}", "machine": machine()}
    header = "".join(f"# {key}: {value}\n" for key, value in note.items())
    with replacing(path) as handle:
        handle.write(header + table.to_csv())
    return path


def load(name: str) -> tuple[pd.DataFrame, dict[str, str]]:
    """(the stored table of benchmark `name`, its note: description, measured, command, machine).

    Raises FileNotFoundError naming the command that makes the table when none is stored.
    """
    path = path_of(name)
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: run python -m lesson_code.bench {name}")
    lines = path.read_text().splitlines()
    note = dict(line[2:].split(": ", 1) for line in lines if line.startswith("# "))
    return pd.read_csv(path, comment="#", index_col=0), note

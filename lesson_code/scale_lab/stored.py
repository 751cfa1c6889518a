"""The scale lab's sweep as the book stores it: `lesson_code/scale_lab/sweep.csv` (lesson 78b).

The sweep of `scale_lab.sweep()` (every strategy, N = 1 ... 512, the last rank of each) takes
about 20 s of one core, too long to run on every build of the book. Its bytes are counted on
the meta device, so they depend on the course's code and torch's version, not on the machine:
the page reads the stored table and checks a few world sizes of it against a live run
(`differences`), and the book's memory calculator reads its points from it
(`lesson_code.book_build.explorer_data`). The file starts with comment lines that say what it
holds, when, with which command, and where (torch's version among it), as every stored table
of the course does (`lesson_code.bench.stored`).

    python -m lesson_code.scale_lab --into-package    # runs the sweep, replaces the stored one

    table, note = load()     # note["measured"], note["command"], note["machine"]
"""

from __future__ import annotations

import datetime
from pathlib import Path

import pandas as pd

from lesson_code.bench import stored as bench_stored
from lesson_code.harness.files import replacing

PATH = Path(__file__).resolve().with_name("sweep.csv")
COMMAND = "python -m lesson_code.scale_lab --into-package"
# What a live run and the stored table must agree on, column by column (the rest is derived).
COMPARED = ("parameters", "gradients", "optimizer", "buffers", "counted", "expected", "matches",
            "peak", "setup_peak", "sent", "messages_sent", "padding", "shard_numel",
            "scalar_reads")
KEY = ["N", "strategy", "rank"]


def write(table: pd.DataFrame, description: str, path: Path = PATH) -> Path:
    """Write `table` (a `scale_lab.sweep`) as the stored sweep, headed by `description` (what it
    holds: `report.stored_description`), the date, the command and the machine; replaced whole
    (`files.replacing`), never left cut short."""
    note = {"description": description, "measured": datetime.date.today().isoformat(),
            "command": COMMAND, "machine": bench_stored.machine()}
    header = "".join(f"# {key}: {value}\n" for key, value in note.items())
    with replacing(path) as handle:
        handle.write(header + table.to_csv(index=False))
    return path


def load(path: Path = PATH) -> tuple[pd.DataFrame, dict[str, str]]:
    """(the stored sweep, its note: description, measured, command, machine).

    Raises FileNotFoundError naming the command that writes it when there is none."""
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: run {COMMAND}")
    note = dict(line.split(": ", 1) for line in bench_stored.comment_lines(path))
    return pd.read_csv(path, comment="#"), note


def differences(live: pd.DataFrame, stored: pd.DataFrame) -> pd.DataFrame:
    """The cells where `live` (a sweep of some of the stored world sizes) differs from the
    stored rows of the same (N, strategy, rank): one row per difference, with the column and
    both values; empty when they agree. A live row the table does not hold is a difference too
    (column "row", stored value None)."""
    stored_rows = stored.set_index(KEY)
    found = []
    for key, row in live.set_index(KEY).iterrows():
        if key not in stored_rows.index:
            found.append({**dict(zip(KEY, key)), "column": "row", "live": "measured",
                          "stored": None})
            continue
        for column in COMPARED:
            if row[column] != stored_rows.loc[key, column]:
                found.append({**dict(zip(KEY, key)), "column": column, "live": row[column],
                              "stored": stored_rows.loc[key, column]})
    return pd.DataFrame(found, columns=[*KEY, "column", "live", "stored"])

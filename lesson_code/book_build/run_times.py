"""How long each lesson notebook takes to run, measured by `make notebooks` (book infrastructure).

    python -m lesson_code.book_build.run_times notebooks/en/78-zero.ipynb notebooks/fa/78-zero.ipynb

executes each notebook in place in its own folder (as `jupyter execute --inplace` does), times it,
and records one row per notebook in notebooks/run-times.csv: the notebook, the seconds, the machine,
the date and the hash of its code cells. The book's lesson pages quote the seconds
(lesson_code.book_build.pages), and `make book` reuses a notebook's stored outputs only while its code
still has the recorded hash (lesson_code.book_build.cache), so the book never shows outputs of other code.
"""

from __future__ import annotations

import csv
import datetime
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

from lesson_code.harness.files import replacing

CSV = "notebooks/run-times.csv"
COLUMNS = ("notebook", "seconds", "machine", "date", "code_hash")
# The longest a cell may go without output before the run stops with a TimeoutError: the lessons'
# own waits are bounded, but a kernel that dies or stops answering would otherwise be waited for
# without end. Lesson 81's crash runs take a few minutes on a loaded 2-core machine.
CELL_TIMEOUT_S = 1800


def notebook_hash(path: Path) -> str:
    """jupyter-cache's hash of a notebook's code cells and kernel: what the book's cache matches."""
    import nbformat
    from jupyter_cache.cache.main import JupyterCacheBase

    notebook = nbformat.read(str(path), nbformat.NO_CONVERT)
    # Hashing reads no cache: the folder given here is never created.
    return JupyterCacheBase(str(path.parent / ".jupyter_cache")).create_hashed_notebook(notebook)[1]


def read(path: Path) -> dict[str, dict[str, str]]:
    """Rows of the CSV keyed by notebook ("en/78-zero.ipynb"); empty when it does not exist yet."""
    if not path.is_file():
        return {}
    with path.open(newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    if rows and set(COLUMNS) - set(rows[0]):
        raise ValueError(f"{path} has columns {sorted(rows[0])}, expected {COLUMNS}: "
                         "delete it and run `make notebooks` to write it again")
    return {row["notebook"]: row for row in rows}


def write(path: Path, rows: dict[str, dict[str, str]]) -> None:
    """Write the rows sorted by notebook, so that the file's diff shows only what was re-run."""
    with replacing(path) as handle:  # whole or not at all: `make notebooks` may be interrupted
        writer = csv.DictWriter(handle, fieldnames=COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows[name] for name in sorted(rows))


def machine() -> str:
    """A short description of this machine: system, architecture and CPU count."""
    cpus = os.cpu_count()
    return f"{platform.system()} {platform.machine()}, {cpus} CPU{'' if cpus == 1 else 's'}"


def machine_parts(line: str) -> tuple[str, str] | None:
    """`machine()`'s line read back: (system and architecture, CPU count), or None for a line
    in another form (one written by hand, or by an older version)."""
    found = re.fullmatch(r"(.+), (\d+) CPUs?", line)
    return (found[1], found[2]) if found else None


def execute(notebook: Path, root: Path) -> dict[str, str]:
    """Run `notebook` in place in its folder with the environment's jupyter; its CSV row.

    Raises subprocess.CalledProcessError (after jupyter printed the failing cell) if a cell fails
    or goes CELL_TIMEOUT_S seconds without output.
    """
    jupyter = Path(sys.executable).with_name("jupyter")
    start = time.monotonic()
    subprocess.run([str(jupyter), "execute", "--inplace", f"--timeout={CELL_TIMEOUT_S}",
                    notebook.name], cwd=notebook.parent, check=True)
    seconds = time.monotonic() - start
    return {"notebook": notebook.resolve().relative_to(root / "notebooks").as_posix(),
            "seconds": f"{seconds:.0f}", "machine": machine(),
            "date": datetime.datetime.now(datetime.timezone.utc).date().isoformat(),
            "code_hash": notebook_hash(notebook)}


def main(argv: list[str]) -> int:
    """Execute and time every notebook named in `argv`, updating the CSV after each one."""
    root = Path.cwd()
    if not argv:
        print("usage: python -m lesson_code.book_build.run_times NOTEBOOK.ipynb ...", file=sys.stderr)
        return 2
    missing = [name for name in argv if not Path(name).is_file()]
    if missing:
        print(f"run_times: no such notebook {missing}; pass paths such as "
              "notebooks/en/78-zero.ipynb, from the repository root", file=sys.stderr)
        return 2
    for name in argv:
        row = execute(Path(name), root)
        rows = read(root / CSV)
        rows[row["notebook"]] = row
        write(root / CSV, rows)
        print(f"{row['notebook']}: {row['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

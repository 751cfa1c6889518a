"""Every lesson notebook, both editions, reproduces its stored outputs under strict nbval.

Each notebook runs as a reader or a CI types it, `pytest --nbval notebooks/<lang>/<lesson>.ipynb`
from the repository root, in its own pytest subprocess, so that a failure shows the cell, its
traceback and the difference. notebooks/conftest.py gives nbval the shipped sanitize file
(digests, versions); cells marked `# NBVAL_IGNORE_OUTPUT` run without comparing their output.
"""

import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*/*.ipynb"))
MARKERS = ("# NBVAL_CHECK_OUTPUT", "# NBVAL_IGNORE_OUTPUT")


def nbval(*args: str) -> subprocess.CompletedProcess:
    """pytest with nbval on the given arguments, from the repository root."""
    return subprocess.run([sys.executable, "-m", "pytest", "--nbval-current-env", "-p",
                           "no:cacheprovider", "-q", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=1200)


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda path: f"{path.parent.name}/{path.name}")
def test_notebook_reproduces_its_stored_outputs(notebook):
    completed = nbval("--nbval", str(notebook.relative_to(ROOT)))
    assert completed.returncode == 0, completed.stdout[-6000:] + completed.stderr[-2000:]


def test_every_lesson_has_both_editions():
    assert NOTEBOOKS, "no notebooks found"
    editions = {path.parent.name for path in NOTEBOOKS}
    assert editions == {"fa", "en"}


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda path: f"{path.parent.name}/{path.name}")
def test_every_cell_with_output_says_whether_it_is_compared(notebook):
    """The first line of each code cell with output is CHECK or IGNORE: --nbval and --nbval-lax
    then compare the same cells, and a reader sees which outputs change from run to run."""
    cells = [c for c in nbformat.read(notebook, as_version=4).cells if c.cell_type == "code"]
    unmarked = [index for index, cell in enumerate(cells)
                if cell.outputs and cell.source.splitlines()[0] not in MARKERS]
    assert not unmarked, f"code cells {unmarked} start with neither of {MARKERS}"


def test_the_strict_comparison_catches_a_changed_output(tmp_path):
    """A stored output edited by hand fails strict nbval: the comparison is not a no-op."""
    notebook = nbformat.read(ROOT / "notebooks" / "en" / "78-zero.ipynb", as_version=4)
    first = next(c for c in notebook.cells if c.cell_type == "code")
    notebook.cells = [first]  # memory arithmetic, no rank, no file: checked
    stored = first.outputs[0]["data"]["text/plain"]
    assert "84.0" in stored
    first.outputs[0]["data"]["text/plain"] = stored.replace("84.0", "85.0")
    path = tmp_path / "en" / "78-zero.ipynb"  # an en/ folder: the English edition runs
    path.parent.mkdir()
    nbformat.write(notebook, path)
    completed = nbval("--nbval", str(path))
    assert completed.returncode == 1 and "85.0" in completed.stdout, completed.stdout[-3000:]

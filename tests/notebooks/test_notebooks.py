"""Every lesson notebook, both editions, runs top to bottom under nbval (--nbval-lax).

Each notebook runs in its own pytest subprocess, in its own folder (as Jupyter and the book build
run it), so that a failure shows the cell and its traceback. Cells marked `# NBVAL_CHECK_OUTPUT`
must also reproduce their stored output exactly.
"""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*/*.ipynb"))


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda path: f"{path.parent.name}/{path.name}")
def test_notebook_runs_and_reproduces_its_checked_outputs(notebook):
    completed = subprocess.run(
        [sys.executable, "-m", "pytest", "--nbval-lax", "--nbval-current-env", "-p",
         "no:cacheprovider", "-q", "--rootdir", str(notebook.parent), str(notebook)],
        cwd=notebook.parent, capture_output=True, text=True, timeout=1200,
    )
    assert completed.returncode == 0, completed.stdout[-6000:] + completed.stderr[-2000:]


def test_every_lesson_has_both_editions():
    assert NOTEBOOKS, "no notebooks found"
    editions = {path.parent.name for path in NOTEBOOKS}
    assert editions == {"fa", "en"}

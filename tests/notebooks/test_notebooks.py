"""Every lesson notebook, both editions, reproduces its stored outputs under strict nbval.

Each notebook runs as a reader or a CI types it, `pytest --nbval notebooks/<lang>/<lesson>.ipynb`
from the repository root, in its own pytest subprocess, so that a failure shows the cell, its
traceback and the difference. notebooks/conftest.py gives nbval the shipped sanitize file
(digests, versions) and adds an item that fails while a listing cell is not the current code;
cells tagged `nbval-ignore-output` run without comparing their output. The notebooks store the
kernel that JupyterLab starts for them, so that opening one does not change it.
"""

import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*/*.ipynb"))
TAGS = ("nbval-check-output", "nbval-ignore-output")


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
    """Each code cell with output carries exactly one of the tags nbval reads, check or ignore:
    --nbval and --nbval-lax then compare the same cells. Tags, not comments, so that a reader
    of the book or the lab sees the lesson's code and not the test's markers."""
    cells = [c for c in nbformat.read(notebook, as_version=4).cells if c.cell_type == "code"]
    unmarked = [index for index, cell in enumerate(cells) if cell.outputs
                and sum(tag in TAGS for tag in cell.metadata.get("tags", [])) != 1]
    assert not unmarked, f"code cells {unmarked} carry not exactly one of the tags {TAGS}"
    commented = [index for index, cell in enumerate(cells) if "# NBVAL_" in cell.source]
    assert not commented, f"code cells {commented} mark nbval in a comment: use the tags {TAGS}"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda path: f"{path.parent.name}/{path.name}")
def test_the_stored_kernel_is_the_one_jupyterlab_starts(notebook):
    """JupyterLab writes the kernel's spec into a notebook's metadata when the kernel starts:
    a stored spec that differs (a display name "Python 3" for ipykernel's "Python 3 (ipykernel)")
    marks the lesson modified the moment it opens."""
    from jupyter_client.kernelspec import KernelSpecManager

    stored = nbformat.read(notebook, as_version=4).metadata.kernelspec
    spec = KernelSpecManager().get_kernel_spec(stored.name)
    assert stored == {"name": stored.name, "display_name": spec.display_name,
                      "language": spec.language}, f"the kernel JupyterLab starts is {spec.to_dict()}"


def test_strict_nbval_fails_while_a_listing_is_stale(tmp_path):
    """A copy of lesson 78 with a listing edited by hand and one renamed to a method that does
    not exist: `pytest --nbval` fails its `listings` item naming both (notebooks/conftest.py,
    loaded here as a plugin, since the copy is not under notebooks/); the lesson as stored passes."""
    notebook = nbformat.read(ROOT / "notebooks" / "en" / "78-zero.ipynb", as_version=4)
    shown = {cell.metadata["listing"]: cell for cell in notebook.cells if "listing" in cell.metadata}
    shown["lesson_code/zero.py::adam_update"].source = "```python\ndef adam_update():\n    pass\n```"
    shown["lesson_code/zero.py::ZeroOptimizer.step"].metadata["listing"] = \
        "lesson_code/zero.py::ZeroOptimizer.stride"
    path = tmp_path / "en" / "78-zero.ipynb"
    path.parent.mkdir()
    nbformat.write(notebook, path)
    stale = nbval("--nbval", "-p", "notebooks.conftest", str(path), "-k", "listings")
    assert stale.returncode == 1, stale.stdout[-3000:]
    assert "lesson_code/zero.py::adam_update has changed since it was stored" in stale.stdout
    assert "no function or class 'stride', so no ZeroOptimizer.stride" in stale.stdout
    stored = nbval("--nbval", "notebooks/en/78-zero.ipynb", "-k", "listings")
    assert stored.returncode == 0 and "1 passed" in stored.stdout, stored.stdout[-3000:]


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

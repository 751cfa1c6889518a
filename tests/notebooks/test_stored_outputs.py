"""The outputs stored in the notebooks come from one complete, clean, top-to-bottom run.

Readers on a code host, and the book build in `make test`, see the stored outputs; nbval re-runs
every cell. Together these guarantee that what the reader sees is what the code produces.
Refresh them with `make notebooks`.
"""

from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*/*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda path: f"{path.parent.name}/{path.name}")
def test_stored_outputs_are_one_clean_run(path):
    notebook = nbformat.read(path, as_version=4)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    counts = [cell.get("execution_count") for cell in code]
    assert counts == list(range(1, len(code) + 1)), f"{path.name}: execution counts {counts}"
    for index, cell in enumerate(code):
        errors = [out for out in cell.outputs if out.output_type == "error"]
        assert not errors, f"{path.name}, code cell {index}: stored error {errors[0].get('ename')}"
        streams = [out.text for out in cell.outputs if out.output_type == "stream"
                   and out.name == "stderr"]
        assert not any("Traceback" in text for text in streams), f"{path.name}, cell {index}"

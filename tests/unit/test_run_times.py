"""Run times of the notebooks and the book's execution cache (lesson_code.book_build: run_times, cache).

One tiny notebook is really executed by a kernel and really cached with jupyter-cache: the test
checks that the book reuses stored outputs exactly while the code is the code that produced them.
"""

import json
import os
from pathlib import Path

import nbformat
import pytest

from lesson_code.book_build import cache as book_cache
from lesson_code.book_build import run_times

pytest.importorskip("jupyter_cache")


def write_notebook(path: Path, code: str) -> None:
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_markdown_cell("# A lesson"), nbformat.v4.new_code_cell(code)]
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                       "language": "python"}
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(notebook, str(path))


def test_rows_round_trip_sorted(tmp_path):
    rows = {name: {"notebook": name, "seconds": "3", "machine": "m", "date": "2026-12-03",
                   "code_hash": "h"} for name in ("fa/b.ipynb", "en/a.ipynb")}
    run_times.write(tmp_path / "t.csv", rows)
    assert run_times.read(tmp_path / "t.csv") == rows
    lines = (tmp_path / "t.csv").read_text().splitlines()
    assert lines[0] == ",".join(run_times.COLUMNS) and lines[1].startswith("en/a.ipynb")


def test_a_csv_with_other_columns_is_refused(tmp_path):
    (tmp_path / "t.csv").write_text("name,seconds\nx,1\n")
    with pytest.raises(ValueError, match="make notebooks"):
        run_times.read(tmp_path / "t.csv")


def test_stored_outputs_are_cached_only_for_the_code_that_made_them(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    notebook = tmp_path / "notebooks" / "en" / "lesson.ipynb"
    write_notebook(notebook, "print(6 * 7)")
    assert run_times.main([str(notebook.relative_to(tmp_path))]) == 0
    row = run_times.read(tmp_path / run_times.CSV)["en/lesson.ipynb"]
    assert float(row["seconds"]) >= 0 and row["machine"] == run_times.machine()
    stored = json.loads(notebook.read_text())["cells"][1]["outputs"][0]["text"]
    assert "".join(stored) == "42\n"

    from jupyter_cache import get_cache

    done = book_cache.seed(tmp_path, tmp_path / "_build" / ".jupyter_cache")
    assert done["en/lesson.ipynb"].startswith("stored outputs reused")
    cache = get_cache(str(tmp_path / "_build" / ".jupyter_cache"))
    assert cache.match_cache_notebook(nbformat.read(str(notebook), 4)) is not None

    edited = tmp_path / "edited.ipynb"
    write_notebook(edited, "print(6 * 9)")
    edited_nb = nbformat.read(str(edited), 4)
    edited_nb.cells[1].outputs = nbformat.read(str(notebook), 4).cells[1].outputs
    edited_nb.cells[1].execution_count = 1
    nbformat.write(edited_nb, str(notebook))  # new code, old outputs: must not be reused
    done = book_cache.seed(tmp_path, tmp_path / "fresh-cache")
    assert done["en/lesson.ipynb"].startswith("code changed")
    with pytest.raises(KeyError):
        get_cache(str(tmp_path / "fresh-cache")).match_cache_notebook(edited_nb)


def test_a_missing_notebook_is_refused_before_running_anything(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert run_times.main(["notebooks/en/nope.ipynb"]) == 2
    assert "notebooks/en/78-zero.ipynb" in capsys.readouterr().err
    assert not (tmp_path / run_times.CSV).exists() and not os.listdir(tmp_path)


def test_every_lesson_notebook_is_recorded_with_the_hash_of_its_code_as_stored():
    # A row whose hash is not the notebook's makes `make book` execute that notebook itself
    # instead of showing its stored outputs: a notebook executed, then edited, then committed.
    root = Path(__file__).resolve().parents[2]
    rows = run_times.read(root / run_times.CSV)
    notebooks = sorted(p.relative_to(root / "notebooks").as_posix()
                       for p in (root / "notebooks").glob("*/*.ipynb"))
    assert sorted(rows) == notebooks
    stale = [name for name in notebooks
             if run_times.notebook_hash(root / "notebooks" / name) != rows[name]["code_hash"]]
    assert stale == [], f"run `python -m lesson_code.book_build.run_times` on {stale}"

"""Every listing a lesson shows is the current code of lesson_code, in both editions, everywhere.

A listing is a markdown cell of its own holding the source of one function, class or method
(lesson_code/book_build/listings.py). JupyterLab, VS Code and a code host's notebook viewer show
only what a notebook stores, so the code is stored in the notebook, and these tests keep it equal
to the package: each listing against the module it names, the two editions against each other,
and what a code host draws (the stored markdown and outputs, as `jupyter nbconvert --to html`
renders them without running anything). The checker itself is run on changed copies of the code
and of a notebook, and must find them.
"""

from __future__ import annotations

import ast
import html
import json
import re
from pathlib import Path

import pytest

from lesson_code.book_build import listings

pytestmark = pytest.mark.book

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*/*.ipynb"))
LESSONS = sorted(path.name for path in (ROOT / "notebooks" / "en").glob("*.ipynb"))
DEFINITION = re.compile(r"^(?:async\s+def|def|class)\s", re.MULTILINE)


def load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def is_listing(cell: dict) -> bool:
    return cell["cell_type"] == "markdown" and listings.KEY in cell.get("metadata", {})


def listing_cells(notebook: dict) -> list[dict]:
    return [cell for cell in notebook["cells"] if is_listing(cell)]


def definition_line(cell: dict) -> str:
    """The `def` or `class` line of a listing: the first thing a reader must see of it."""
    return next(line for line in "".join(cell["source"]).splitlines() if DEFINITION.match(line))


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_listing_is_the_current_code(notebook: Path) -> None:
    cells = load(notebook)
    assert listing_cells(cells), f"{notebook.name} shows no code of lesson_code in a listing cell"
    stale = listings.stale_listings(cells)
    assert not stale, (f"{notebook.relative_to(ROOT)}:\n" + "\n".join(stale)
                       + "\nstore the current code: python -m lesson_code.book_build.listings")


@pytest.mark.parametrize("name", LESSONS)
def test_both_editions_show_the_same_listings_in_the_same_places(name: str) -> None:
    """Same cells (id, metadata, code), in the same order, after the same code cells."""
    def shown(lang: str) -> list[tuple]:
        placed, code_cells = [], 0
        for cell in load(ROOT / "notebooks" / lang / name)["cells"]:
            code_cells += cell["cell_type"] == "code"
            if is_listing(cell):
                placed.append((code_cells, cell.get("id"), cell["metadata"], "".join(cell["source"])))
        return placed

    fa, en = shown("fa"), shown("en")
    assert [p[:3] for p in fa] == [p[:3] for p in en]
    assert fa == en, "the editions' listings hold different code: run python -m lesson_code.book_build.listings"


def test_no_literalinclude_is_left() -> None:
    """A {literalinclude} is read only by the book's build: everywhere else it shows nothing."""
    left = [f"{path.relative_to(ROOT)} cell {cell.get('id')}" for path in NOTEBOOKS
            for cell in load(path)["cells"] if cell["cell_type"] == "markdown"
            and listings.LITERALINCLUDE.search("".join(cell["source"]))]
    assert not left, f"make these listing cells: {left}"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_a_code_host_shows_every_listing(notebook: Path) -> None:
    """The notebook as a code host's viewer draws it: stored markdown and outputs, nothing run."""
    import nbformat
    from nbconvert import HTMLExporter

    page, _ = HTMLExporter().from_notebook_node(nbformat.read(notebook, as_version=4))
    text = html.unescape(re.sub(r"<[^>]+>", "", page))
    directive_shown = "{literalinclude}" in text
    assert not directive_shown, f"{notebook.name}: a directive is shown instead of code"
    cells = listing_cells(load(notebook))
    assert cells, f"{notebook.name} shows no listing"
    missing = [cell["metadata"][listings.KEY] for cell in cells if definition_line(cell) not in text]
    assert not missing, f"{notebook.name}: a code host does not show {missing}"


# --- The checker itself can fail ----------------------------------------------------------------

MODULE = '''\
import functools


@functools.lru_cache(maxsize=None)
def cached(n: int) -> int:
    """Twice n."""
    return 2 * n


class Outer:
    """A class."""

    @staticmethod
    def helper(x):
        text = """
a string at column 0
"""
        return x, text

    class Inner:
        def deep(self):
            return 1
'''


def test_the_source_is_cut_as_sphinx_cuts_it(tmp_path: Path) -> None:
    """From the first decorator to the end of the body; a method moved left to column 0, and
    nothing else changed (a string that starts at column 0 keeps its lines)."""
    module = tmp_path / "module.py"
    module.write_text(MODULE)
    assert listings.object_source(module, "cached") == (
        '@functools.lru_cache(maxsize=None)\ndef cached(n: int) -> int:\n    """Twice n."""\n'
        "    return 2 * n")
    assert listings.object_source(module, "Outer.helper") == (
        '@staticmethod\ndef helper(x):\n    text = """\na string at column 0\n"""\n    return x, text')
    assert listings.object_source(module, "Outer.Inner.deep") == "def deep(self):\n    return 1"
    assert listings.object_source(module, "Outer").startswith('class Outer:\n    """A class."""')
    assert listings.fenced("x = '```'") == "````python\nx = '```'\n````"


@pytest.mark.parametrize("name, said", [
    ("missing", "no function or class 'missing', so no missing; it defines Outer, cached"),
    ("Outer.missing", "in Outer: no function or class 'missing', so no Outer.missing; "
                      "it defines Inner, helper"),
])
def test_a_missing_object_is_named_with_its_file(tmp_path: Path, name: str, said: str) -> None:
    module = tmp_path / "module.py"
    module.write_text(MODULE)
    with pytest.raises(listings.ListingError) as raised:
        listings.object_source(module, name)
    assert str(raised.value) == f"{module}{', ' if '.' in name else ': '}{said}"
    with pytest.raises(listings.ListingError, match=r"other\.py: no such file, so it has no cached"):
        listings.object_source(tmp_path / "other.py", "cached")


def copy_of_zero(tmp_path: Path, change) -> Path:
    """A checkout in tmp_path whose lesson_code/zero.py is the real one changed by `change`,
    beside the real zero_lab.py and zero_exercises.py (lesson 78 lists objects of all three)."""
    (tmp_path / "lesson_code").mkdir()
    source = (ROOT / "lesson_code" / "zero.py").read_text(encoding="utf-8")
    changed = change(source)
    assert changed != source, "the change did not apply: the test needs another anchor"
    (tmp_path / "lesson_code" / "zero.py").write_text(changed, encoding="utf-8")
    for beside in ("zero_lab.py", "zero_exercises.py"):
        code = (ROOT / "lesson_code" / beside).read_text(encoding="utf-8")
        (tmp_path / "lesson_code" / beside).write_text(code, encoding="utf-8")
    return tmp_path


def test_the_check_finds_a_changed_function(tmp_path: Path) -> None:
    """Lesson 78 checked against a zero.py whose adam_update gained a line: that listing, and no
    other, is stale."""
    def add_a_line(source: str) -> str:
        end = next(node.end_lineno for node in ast.parse(source).body
                   if getattr(node, "name", "") == "adam_update")
        lines = source.splitlines(keepends=True)
        return "".join(lines[:end] + ["    del step  # a line added after the listing was stored\n"]
                       + lines[end:])

    root = copy_of_zero(tmp_path, add_a_line)
    notebook = load(ROOT / "notebooks" / "fa" / "78-zero.ipynb")
    assert listings.stale_listings(notebook) == []
    stale = listings.stale_listings(notebook, root)
    assert len(stale) == 1 and "lesson_code/zero.py::adam_update has changed" in stale[0], stale
    assert "(listing-zero-adam-update)" in stale[0], stale


def test_the_check_names_a_listed_object_that_no_longer_exists(tmp_path: Path) -> None:
    root = copy_of_zero(tmp_path, lambda s: s.replace("    def step(self)", "    def advance(self)", 1))
    stale = listings.stale_listings(load(ROOT / "notebooks" / "en" / "78-zero.ipynb"), root)
    assert len(stale) == 1, stale
    assert "in ZeroOptimizer: no function or class 'step', so no ZeroOptimizer.step" in stale[0]


def test_the_command_stores_the_current_code_and_check_fails_until_then(tmp_path: Path,
                                                                         capsys) -> None:
    """`--check` exits 1 naming a listing edited by hand; the command restores the code, byte
    for byte the stored notebook; then `--check` passes."""
    original = ROOT / "notebooks" / "en" / "78-zero.ipynb"
    copy = tmp_path / "78-zero.ipynb"
    notebook = load(original)
    cell = next(c for c in listing_cells(notebook) if c["metadata"][listings.KEY].endswith("::flatten_params"))
    cell["source"] = "```python\ndef flatten_params(module):\n    return None\n```"
    copy.write_text(json.dumps(notebook), encoding="utf-8")

    assert listings.main(["--check", str(copy)]) == 1
    out = capsys.readouterr()
    assert f"{copy}: cell " in out.out and "lesson_code/zero.py::flatten_params has changed" in out.out
    assert "python -m lesson_code.book_build.listings" in out.err
    assert listings.main([str(copy)]) == 0
    assert "stored the current lesson_code/zero.py::flatten_params" in capsys.readouterr().out
    assert copy.read_bytes() == original.read_bytes()
    assert listings.main(["--check", str(copy)]) == 0


def test_the_command_refuses_a_listing_of_nothing(tmp_path: Path, capsys) -> None:
    copy = tmp_path / "78-zero.ipynb"
    notebook = load(ROOT / "notebooks" / "en" / "78-zero.ipynb")
    listing_cells(notebook)[0]["metadata"][listings.KEY] = "lesson_code/zero.py::no_such_function"
    copy.write_text(json.dumps(notebook), encoding="utf-8")
    before = copy.read_bytes()
    assert listings.main([str(copy)]) == 1
    assert "no function or class 'no_such_function'" in capsys.readouterr().err
    assert copy.read_bytes() == before
    assert listings.main(["--check", str(copy)]) == 1
    assert "no_such_function" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_:
        listings.main([str(tmp_path / "nothing.ipynb")])
    assert exit_.value.code == 2 and "no such notebook" in capsys.readouterr().err


def test_the_check_finds_a_literalinclude(tmp_path: Path) -> None:
    cells = [{"cell_type": "markdown", "id": "c1", "metadata": {},
              "source": "Text\n\n```{literalinclude} ../../lesson_code/zero.py\n:pyobject: adam_update\n```"}]
    assert listings.stale_listings({"cells": cells}) == [
        "cell 0 (c1): a {literalinclude}, which JupyterLab and code hosts show empty: make it a listing cell"]

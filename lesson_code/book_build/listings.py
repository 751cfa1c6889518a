"""The code the lessons show, stored in their notebooks and kept equal to lesson_code (book infrastructure).

A *listing* is a markdown cell of its own holding one fenced ```python block: the source of one
function, class or method of lesson_code, named in the cell's metadata as `path::name`:

    {"cell_type": "markdown", "id": "listing-zero-zerooptimizer-step",
     "metadata": {"listing": "lesson_code/zero.py::ZeroOptimizer.step"},
     "source": "```python\\ndef step(self) -> None:\\n    ..."}

The code is stored in the notebook rather than included when the book is built, so that every
reader sees it: the book, JupyterLab, Jupyter Notebook, VS Code, and a code host's notebook
viewer, which shows only what the notebook stores. The source is cut from the module with `ast`
as Sphinx's `literalinclude :pyobject:` cuts it: from the first decorator to the last line of the
body, a method moved left to column 0, nothing else changed. Both editions hold the same listings.

    python -m lesson_code.book_build.listings           # store the current code in every listing
    python -m lesson_code.book_build.listings --check   # list the stale ones; exit 1 if any

`make notebooks` stores them before it runs the notebooks; tests/book/test_listings.py and strict
nbval (notebooks/conftest.py) fail while a listing differs from the code it names. To add one, put
a markdown cell with that metadata and any source where the prose introduces the code, and run
the first command.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the checkout holding lesson_code/ and notebooks/
KEY = "listing"  # the cell metadata that names a listing's object
NOTEBOOKS = "notebooks/*/*.ipynb"
LITERALINCLUDE = re.compile(r"^[`:]{3,}\{literalinclude\}", re.MULTILINE)
DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


class ListingError(LookupError):
    """A listing names a file or an object that does not exist."""


def _definitions(body: list[ast.stmt]) -> dict[str, ast.AST]:
    return {node.name: node for node in body if isinstance(node, DEFINITIONS)}


def object_source(path: Path, name: str) -> str:
    """The source of function or class `name` ("Class.method" for a method) in module `path`.

    Decorators included, moved left so that the definition starts at column 0. Raises
    ListingError naming the file and the object when either does not exist.
    """
    if not path.is_file():
        raise ListingError(f"{path}: no such file, so it has no {name}")
    text = path.read_text(encoding="utf-8")
    scope, node = ast.parse(text, filename=str(path)).body, None
    for part in name.split("."):
        found = _definitions(scope)
        if part not in found:
            where = f"{path}" + (f", in {node.name}" if node else "")
            raise ListingError(f"{where}: no function or class {part!r}, so no {name}; "
                               f"it defines {', '.join(sorted(found)) or 'none'}")
        node = found[part]
        scope = node.body
    first = min([node.lineno] + [d.lineno for d in node.decorator_list])
    lines = text.splitlines()[first - 1:node.end_lineno]
    indent = node.col_offset
    return "\n".join(line[indent:] if line[:indent].isspace() else line for line in lines)


def fenced(code: str) -> str:
    """`code` as a markdown cell shows it: a ```python block, its fence longer than any run of
    backticks inside."""
    fence = "`" * max(3, 1 + max((len(run) for run in re.findall(r"`+", code)), default=0))
    return f"{fence}python\n{code}\n{fence}"


def listing_source(spec: str, root: Path = ROOT) -> str:
    """What the listing cell naming `spec` ("lesson_code/zero.py::ZeroOptimizer.step") holds."""
    path, separator, name = spec.partition("::")
    if not separator or not path or not name:
        raise ListingError(f"listing {spec!r}: name it as path/to/module.py::function "
                           "(or ::Class.method), the path from the repository root")
    return fenced(object_source(root / path, name))


def _source(cell) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else source


def _where(index: int, cell) -> str:
    return f"cell {index}" + (f" ({cell['id']})" if cell.get("id") else "")


def stale_listings(notebook, root: Path = ROOT) -> list[str]:
    """What a notebook shows that is not the current code, one sentence per cell; [] when none.

    `notebook` is a notebook as a dict (json.load or nbformat.read). A listing cell that differs
    from its object's source, or names one that does not exist, is stale; so is a
    {literalinclude} left in a markdown cell, which only the book can draw.
    """
    problems = []
    for index, cell in enumerate(notebook["cells"]):
        if cell["cell_type"] != "markdown":
            continue
        spec = cell.get("metadata", {}).get(KEY)
        if spec is None:
            if LITERALINCLUDE.search(_source(cell)):
                problems.append(f"{_where(index, cell)}: a {{literalinclude}}, which JupyterLab "
                                "and code hosts show empty: make it a listing cell")
            continue
        try:
            expected = listing_source(spec, root)
        except ListingError as error:
            problems.append(f"{_where(index, cell)}: {error}")
            continue
        if _source(cell) != expected:
            problems.append(f"{_where(index, cell)}: {spec} has changed since it was stored")
    return problems


def refresh(notebook, root: Path = ROOT) -> list[str]:
    """Store the current code in every listing cell of `notebook`; the specs it changed.

    Raises ListingError (before changing anything) when a listing names no existing object.
    """
    sources = {index: listing_source(cell["metadata"][KEY], root)
               for index, cell in enumerate(notebook["cells"])
               if cell["cell_type"] == "markdown" and KEY in cell.get("metadata", {})}
    changed = []
    for index, source in sources.items():
        cell = notebook["cells"][index]
        if _source(cell) != source:
            cell["source"] = source
            changed.append(cell["metadata"][KEY])
    return changed


def main(argv: list[str]) -> int:
    """Refresh (or with --check, check) the listings of the notebooks named, else of all."""
    import nbformat

    parser = argparse.ArgumentParser(
        prog="python -m lesson_code.book_build.listings",
        description="Store the current source of lesson_code in the notebooks' listing cells.")
    parser.add_argument("--check", action="store_true",
                        help="change nothing; list the stale listings and exit 1 if there are any")
    parser.add_argument("notebooks", nargs="*", type=Path, metavar="NOTEBOOK",
                        help=f"notebooks to treat (default: every {NOTEBOOKS} of the repository)")
    args = parser.parse_args(argv)
    paths = args.notebooks or sorted(ROOT.glob(NOTEBOOKS))
    missing = [str(path) for path in paths if not path.is_file()]
    if missing:
        parser.error(f"no such notebook {missing}: pass paths such as notebooks/en/78-zero.ipynb")
    failed = False
    for path in paths:
        notebook = nbformat.read(path, as_version=nbformat.NO_CONVERT)
        shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        if args.check:
            problems = stale_listings(notebook)
            failed |= bool(problems)
            for problem in problems:
                print(f"{shown}: {problem}")
            continue
        try:
            changed = refresh(notebook)
        except ListingError as error:
            print(f"{shown}: {error}", file=sys.stderr)
            failed = True
            continue
        if changed:
            nbformat.write(notebook, path)
            print(f"{shown}: stored the current {', '.join(changed)}")
    if args.check and failed:
        print("Store the current code with: python -m lesson_code.book_build.listings",
              file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

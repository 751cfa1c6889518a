"""Every `{literalinclude}` of a lesson names a file and a `:pyobject:` that exist.

The book build with -W finds a broken one only after executing and rendering everything; this
finds it in a second, naming the notebook, when code moves between modules.
"""

import ast
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*/*.ipynb"))
INCLUDE = re.compile(r"```\{literalinclude\} (\S+)\n((?::[^\n]*\n)*)")


def defined_names(path: Path) -> set[str]:
    """Functions and classes of a module, with methods as Class.method."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        if isinstance(node, ast.ClassDef):
            names |= {f"{node.name}.{item.name}" for item in node.body
                      if isinstance(item, ast.FunctionDef)}
    return names


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_included_object_exists(notebook):
    cells = json.loads(notebook.read_text())["cells"]
    text = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    for match in INCLUDE.finditer(text):
        path = (notebook.parent / match.group(1)).resolve()
        assert path.is_file(), f"{notebook.name}: {match.group(1)} does not exist"
        obj = dict(re.findall(r":(\w+):\s*(.*)", match.group(2))).get("pyobject")
        if obj:
            assert obj in defined_names(path), f"{notebook.name}: no {obj} in {match.group(1)}"

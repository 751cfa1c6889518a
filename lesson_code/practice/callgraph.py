"""Which of the learner's own functions a name of the learner's file calls, read from its source.

After the ranks hang inside a learner's function, a later check that calls it would wait the
whole timeout again. A check names the template's functions it calls (`Check.needs`); a learner
reaches the function that hung through helpers of their own (`ring_reduce_scatter` ->
`_reduce_scatter` -> `_step`), which only the file's source shows. This reads it statically,
without importing it: every name and attribute a function or class mentions counts as a call
(a class also "calls" its methods). That over-approximates, which is the safe side here: a
check skipped by mistake costs a rerun after the fix; one not skipped costs a timeout.
"""

from __future__ import annotations

import ast
from pathlib import Path


def call_graph(source: str) -> dict[str, set[str]]:
    """{function or class name: every name it mentions}, for each def or class at any depth."""
    graph: dict[str, set[str]] = {}
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        mentioned = graph.setdefault(node.name, set())
        for inner in ast.walk(node):
            if isinstance(inner, ast.Name):
                mentioned.add(inner.id)
            elif isinstance(inner, ast.Attribute):
                mentioned.add(inner.attr)
            elif inner is not node and isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef)):
                mentioned.add(inner.name)
    return graph


def first_reached(path: str, names: tuple[str, ...], targets: set[str]) -> tuple[str, str] | None:
    """(one of `names`, the first of `targets` it reaches) in the learner's file, or None.

    A file that cannot be read or parsed reaches only what it is asked for by name.
    """
    try:
        graph = call_graph(Path(path).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        graph = {}
    for name in names:
        seen, waiting = set(), [name]
        while waiting:
            current = waiting.pop(0)
            if current in seen:
                continue
            seen.add(current)
            if current in targets:
                return name, current
            waiting += sorted(graph.get(current, set()) - seen)
    return None

"""The package stays navigable: small modules, public boundaries, no import cycle, no global state.

Read from the source with `ast` (nothing is imported), so a violation is found wherever it is:
in the package, in the tests, or in a notebook's code cells.
"""

import ast
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "lesson_code"
MUTATING_METHODS = {"append", "extend", "insert", "update", "setdefault", "pop", "popitem",
                    "clear", "add", "discard", "remove"}


def package_modules() -> dict[str, Path]:
    """Dotted module name -> file, for every module of lesson_code."""
    modules = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def python_sources() -> list[tuple[str, str]]:
    """(label, source) for the package, the tests and every notebook's code cells."""
    sources = [(str(p.relative_to(ROOT)), p.read_text())
               for folder in (PACKAGE, ROOT / "tests") for p in sorted(folder.rglob("*.py"))]
    for notebook in sorted((ROOT / "notebooks").rglob("*.ipynb")):
        cells = json.loads(notebook.read_text())["cells"]
        code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
        lines = [line for line in code.splitlines() if not line.lstrip().startswith(("%", "!"))]
        sources.append((str(notebook.relative_to(ROOT)), "\n".join(lines)))
    return sources


def imported_modules(tree: ast.AST, module: str, is_package: bool, modules: set[str]) -> set[str]:
    """Modules of lesson_code that `tree` imports (at any level, lazy imports included).

    `from package import submodule` depends on the submodule (Python has the package's
    `__init__` running or done already); `from package import name` on the package.
    """
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against this module's package
                package = module.split(".") if is_package else module.split(".")[:-1]
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            submodules = {f"{base}.{alias.name}" for alias in node.names} & modules
            found.update(submodules)
            if len(submodules) < len(node.names):  # names defined in `base` itself
                found.add(base)
    return {name for name in found if name.startswith("lesson_code")}


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def lesson_code_bindings(tree: ast.AST) -> set[str]:
    """Local names bound to lesson_code modules by `import` / `from lesson_code[.x] import y`."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update((a.asname or a.name.split(".")[0]) for a in node.names
                         if a.name.startswith("lesson_code"))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("lesson_code"):
            names.update(a.asname or a.name for a in node.names)
    return names


SOURCES = dict(python_sources())


@pytest.mark.parametrize("label", sorted(SOURCES))
def test_no_private_name_crosses_a_module_boundary(label):
    tree = ast.parse(SOURCES[label])
    crossings = [f"line {node.lineno}: from {node.module} import {alias.name}"
                 for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                 and (node.module or "").startswith("lesson_code")
                 for alias in node.names if is_private(alias.name)]
    bound = lesson_code_bindings(tree)
    crossings += [f"line {node.lineno}: {node.value.id}.{node.attr}" for node in ast.walk(tree)
                  if isinstance(node, ast.Attribute) and is_private(node.attr)
                  and isinstance(node.value, ast.Name) and node.value.id in bound]
    assert not crossings, f"{label} uses private names of other modules: {crossings}"


def test_lesson_code_has_no_import_cycle():
    modules = package_modules()
    graph = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        targets = imported_modules(tree, name, path.name == "__init__.py", set(modules))
        graph[name] = {t for t in targets if t in modules and t != name}
    cycle = find_cycle(graph)
    assert cycle is None, f"import cycle: {' -> '.join(cycle)}"


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` as a list of nodes (first == last), or None."""
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == "open":
                return stack[stack.index(target):] + [target]
            if target not in state and (found := visit(target)):
                return found
        state[node] = "done"
        stack.pop()
        return None
    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


@pytest.mark.parametrize("name", sorted(package_modules()))
def test_no_module_level_mutable_state(name):
    tree = ast.parse(package_modules()[name].read_text())
    problems = [f"line {n.lineno}: global {', '.join(n.names)}" for n in ast.walk(tree)
                if isinstance(n, ast.Global)]
    module_names = {t.id for n in tree.body if isinstance(n, (ast.Assign, ast.AnnAssign))
                    for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
                    if isinstance(t, ast.Name)}
    bound = lesson_code_bindings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and isinstance(node.func.value, ast.Name) and node.func.value.id in module_names \
                and node.func.attr in MUTATING_METHODS:
            problems.append(f"line {node.lineno}: {node.func.value.id}.{node.func.attr}(...)")
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
        for target in targets:
            base = target.value if isinstance(target, (ast.Subscript, ast.Attribute)) else None
            if isinstance(base, ast.Name) and (base.id in module_names or base.id in bound):
                problems.append(f"line {node.lineno}: assigns into {base.id}")
    assert not problems, f"{name} changes module-level state: {problems}"


def test_the_checks_above_catch_what_they_forbid(tmp_path):
    cyclic = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}
    assert find_cycle(cyclic) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
    tree = ast.parse("from lesson_code import zero_lab\nzero_lab._loss(1)\n")
    bound = lesson_code_bindings(tree)
    assert any(isinstance(n, ast.Attribute) and n.value.id in bound and is_private(n.attr)
               for n in ast.walk(tree) if isinstance(n, ast.Attribute))
    assert not is_private("__version__") and is_private("_model")


def import_graph() -> dict[str, set[str]]:
    """Module -> the modules of lesson_code it imports."""
    modules = package_modules()
    return {name: imported_modules(ast.parse(path.read_text()), name,
                                   path.name == "__init__.py", set(modules)) - {name}
            for name, path in modules.items()}


def test_the_top_level_reads_like_the_course():
    """The lessons, their labs and exercises, the models and data at the top; the machinery in
    subpackages that say what they are (runtime, harness, book_build, ...), each with a docstring.
    Each lesson brings at most a module, its lab and its exercises (22 today): more at the top
    means machinery that belongs in a subpackage."""
    top = sorted(p.stem for p in PACKAGE.glob("*.py"))
    assert len(top) <= 24, f"{len(top)} modules at the top of lesson_code: {top}"
    assert all(f"{name[:-len('_exercises')]}_lab" in top for name in top if name.endswith("_exercises"))
    assert {"launch", "models", "data", "zero", "zero_lab", "ddp", "pipeline"} <= set(top)
    for package in ("runtime", "harness", "book_build", "collectives", "checkpoint", "capstone"):
        init = PACKAGE / package / "__init__.py"
        assert ast.get_docstring(ast.parse(init.read_text())), f"{init} says nothing of itself"


@pytest.mark.parametrize("layer, forbidden", [
    ("lesson_code.checkpoint", ("lesson_code.zero", "lesson_code.zero_lab",
                                "lesson_code.checkpoint_lab", "lesson_code.capstone")),
    ("lesson_code.models", ("lesson_code.",)),
    ("lesson_code.language", ("lesson_code.",)),
    ("lesson_code.memory", ("lesson_code.launch", "lesson_code.runtime", "lesson_code.collectives")),
    ("lesson_code.runtime", ("lesson_code.collectives", "lesson_code.zero", "lesson_code.ddp",
                             "lesson_code.checkpoint", "lesson_code.harness", "lesson_code.launch")),
    ("lesson_code.launch", ("lesson_code.harness", "lesson_code.collectives", "lesson_code.practice")),
    ("lesson_code.plots", ("lesson_code.launch", "lesson_code.runtime")),
])
def test_each_layer_imports_only_what_it_may(layer, forbidden):
    """The checkpoint layer stores what it is given (ZeRO's state comes as plain tensors and
    dicts); models stand alone, memory is arithmetic; the runtime, and the launcher on it, stand
    on nothing above them (a lesson, what the labs share); figures launch nothing; the way the
    Persian edition writes numbers stands on nothing, so that every layer may follow it."""
    found = {f"{module} imports {target}" for module, targets in import_graph().items()
             if module == layer or module.startswith(layer + ".")
             for target in targets if target.startswith(forbidden)}
    assert not found, sorted(found)

"""The Persian and English lessons stay in step: only the prose may differ.

For every notebook in notebooks/fa and notebooks/en: the same file names; the same code cells
(source and tags) in the same order; the same listing cells (the code of lesson_code a lesson
shows, lesson_code/book_build/listings.py: id, the object named, the code) after the same code
cells; the same number of headings at each level; the same MyST labels and cross-reference
targets; the same number of figures and images; the same number of tables (DataFrame or other
HTML tables among the outputs, and markdown tables in the prose). `compare_notebooks` returns the
differences as sentences that name the file, the cell and what differs.

Sphinx labels are global, so the two editions cannot both define `(ring-all-reduce)=`: labels
(and `:name:`/`:label:` options) in notebooks/fa start with `fa-` or end with `-fa`, those in
notebooks/en likewise with `en`, and the comparison is made without that marker.
"""

from __future__ import annotations

import difflib
import json
import re
from collections import Counter
from pathlib import Path

import pytest

from lesson_code.book_build.listings import KEY as LISTING

pytestmark = pytest.mark.book

ROOT = Path(__file__).resolve().parents[2]
LANGS = ("fa", "en")
FENCE = re.compile(r"^\s*(`{3,}|~{3,})")
HEADING = re.compile(r"^(#{1,6})\s+\S")
LABEL = re.compile(r"^\s*\(([^()\s]+)\)=\s*$")
MATH_LABEL = re.compile(r"\$\$\s*\(([^()\s]+)\)\s*$")
NAME_OPTION = re.compile(r"^\s*:(?:name|label):\s*(\S+)\s*$")
REF = re.compile(r"\{(?:ref|numref|eq)\}`(?:[^`<]*<([^`>]+)>|([^`<]+))`")
HASH_LINK = re.compile(r"\]\(#([^)\s]+)\)")
FIGURE = re.compile(r"^\s*(?:`{3,}|:{3,})\{(?:figure|image)\}|!\[|<img\b", re.MULTILINE)
CODE_DIRECTIVES = {"{code}", "{code-block}", "{code-cell}", "{sourcecode}"}
IMAGE_MIME = ("image/png", "image/jpeg", "image/svg+xml", "image/gif")
HTML_TABLE = re.compile(r"<table\b")
MARKDOWN_TABLE_RULE = re.compile(r"^\s*\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)+\|?\s*$")


def _source(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def _markdown_lines(text: str) -> list[str]:
    """Lines of a markdown cell that are not inside a code block.

    A `#` in a code block is not a heading, nor `![` an image. Content of MyST directive fences
    (```{figure}, ```{note}) is kept, except for the directives that hold code.
    """
    kept: list[str] = []
    stack: list[tuple[str, bool]] = []  # open fences: (fence, holds code)
    for line in text.splitlines():
        if m := FENCE.match(line):
            fence, info = m.group(1), line[m.end():].strip()
            top = stack[-1] if stack else None
            if top and not info and fence[0] == top[0][0] and len(fence) >= len(top[0]):
                stack.pop()  # a closing fence: same character, at least as long, no info
                continue
            if not (top and top[1]):  # inside a code block a fence is just text
                holds_code = not info.startswith("{") or info.split()[0] in CODE_DIRECTIVES
                stack.append((fence, holds_code))
                if not holds_code:
                    kept.append(line)  # the directive line itself, e.g. ```{figure} ring.svg
                continue
        if not any(holds_code for _, holds_code in stack):
            kept.append(line)
    return kept


def _without_edition(name: str, lang: str, cell: int, problems: list[str]) -> str:
    """`name` without its edition marker (`fa-x` or `x-fa` -> `x`); notes a name that has none."""
    if name.startswith(f"{lang}-"):
        return name[len(lang) + 1:]
    if name.endswith(f"-{lang}"):
        return name[: -len(lang) - 1]
    problems.append(
        f"{lang} cell {cell}: label {name!r} should start with '{lang}-' or end with '-{lang}' "
        "(Sphinx labels are global: each edition needs its own name for it)"
    )
    return name


def _summary(nb: dict, lang: str, problems: list[str]) -> dict:
    """What must match between editions, each item tagged with the cell it came from."""
    code, headings, labels, refs, figures, tables = [], Counter(), {}, {}, [], []
    listings = []  # (cell, code cells before it, id, object named, source)
    where_headings: dict[int, list[int]] = {}
    for i, cell in enumerate(nb.get("cells", [])):
        text = _source(cell)
        if LISTING in cell.get("metadata", {}):
            listings.append((i, len(code), cell.get("id"), cell["metadata"][LISTING], text))
        if cell.get("cell_type") == "code":
            tags = sorted(cell.get("metadata", {}).get("tags", []))
            code.append((i, text, tags))
            for out in cell.get("outputs", []):
                if any(m in out.get("data", {}) for m in IMAGE_MIME):
                    figures.append(i)
                html = out.get("data", {}).get("text/html", "")
                html = "".join(html) if isinstance(html, list) else html
                tables += [i] * len(HTML_TABLE.findall(html))
        elif cell.get("cell_type") == "markdown":
            lines = _markdown_lines(text)
            for line in lines:
                if m := HEADING.match(line):
                    headings[len(m.group(1))] += 1
                    where_headings.setdefault(len(m.group(1)), []).append(i)
                for pattern in (LABEL, MATH_LABEL, NAME_OPTION):
                    if m := pattern.search(line):
                        labels[_without_edition(m.group(1), lang, i, problems)] = i
            prose = "\n".join(lines)
            for a, b in REF.findall(prose):
                refs[_without_edition((a or b).strip(), lang, i, problems)] = i
            for target in HASH_LINK.findall(prose):
                refs[_without_edition(target, lang, i, problems)] = i
            figures += [i] * len(FIGURE.findall(prose))
            tables += [i] * sum(1 for line in lines if MARKDOWN_TABLE_RULE.match(line))
    return dict(code=code, listings=listings, headings=headings, where_headings=where_headings,
                labels=labels, refs=refs, figures=figures, tables=tables)


def _first_difference(a: str, b: str) -> str:
    diff = difflib.unified_diff(a.splitlines(), b.splitlines(), "fa", "en", lineterm="", n=0)
    return "\n      ".join(list(diff)[2:8])


def compare_notebooks(fa: dict, en: dict, name: str = "notebook") -> list[str]:
    """Differences between the Persian and English versions of one lesson, as sentences.

    Empty when the two agree on everything but prose. Cell numbers are 0-based indices into
    each notebook's cells.
    """
    problems: list[str] = []
    a, b = _summary(fa, "fa", problems), _summary(en, "en", problems)

    for k, (ca, cb) in enumerate(zip(a["code"], b["code"])):
        (ia, sa, ta), (ib, sb, tb) = ca, cb
        if sa != sb:
            problems.append(f"code cell #{k} (fa cell {ia}, en cell {ib}) differs:\n      "
                            + _first_difference(sa, sb))
        if ta != tb:
            problems.append(f"code cell #{k} (fa cell {ia}, en cell {ib}) tags differ: {ta} vs {tb}")
    if len(a["code"]) != len(b["code"]):
        extra, lang = (a, "fa") if len(a["code"]) > len(b["code"]) else (b, "en")
        cells = [i for i, _, _ in extra["code"][min(len(a["code"]), len(b["code"])):]]
        problems.append(f"fa has {len(a['code'])} code cells, en {len(b['code'])}: "
                        f"extra in {lang} at cells {cells}")

    for k, (la, lb) in enumerate(zip(a["listings"], b["listings"])):
        where = f"listing #{k} (fa cell {la[0]}, en cell {lb[0]})"
        if la[1:4] != lb[1:4]:
            problems.append(f"{where} differs: after code cell #{la[1]}, {la[2]}, {la[3]} in fa; "
                            f"after code cell #{lb[1]}, {lb[2]}, {lb[3]} in en")
        elif la[4] != lb[4]:
            problems.append(f"{where} ({la[3]}) holds other code in each edition: "
                            "python -m lesson_code.book_build.listings stores the current code in both")
    if len(a["listings"]) != len(b["listings"]):
        problems.append(f"fa has {len(a['listings'])} listing cells, en {len(b['listings'])}: "
                        "both editions show the same code")

    for level in sorted(set(a["headings"]) | set(b["headings"])):
        if a["headings"][level] != b["headings"][level]:
            problems.append(
                f"level-{level} headings: fa has {a['headings'][level]} (cells "
                f"{a['where_headings'].get(level, [])}), en has {b['headings'][level]} (cells "
                f"{b['where_headings'].get(level, [])})")

    for kind in ("labels", "refs"):
        what = "label" if kind == "labels" else "reference target"
        for key in sorted(set(a[kind]) - set(b[kind])):
            problems.append(f"{what} '{key}' in fa (cell {a[kind][key]}) is missing in en")
        for key in sorted(set(b[kind]) - set(a[kind])):
            problems.append(f"{what} '{key}' in en (cell {b[kind][key]}) is missing in fa")

    if len(a["figures"]) != len(b["figures"]):
        problems.append(f"figures and images: fa has {len(a['figures'])} (cells {a['figures']}), "
                        f"en has {len(b['figures'])} (cells {b['figures']})")
    if len(a["tables"]) != len(b["tables"]):
        problems.append(f"tables: fa has {len(a['tables'])} (cells {a['tables']}), "
                        f"en has {len(b['tables'])} (cells {b['tables']})")
    return [f"{name}: {p}" for p in dict.fromkeys(problems)]  # each problem once, in order


def _notebooks(lang: str) -> dict[str, Path]:
    return {p.name: p for p in sorted((ROOT / "notebooks" / lang).glob("*.ipynb"))}


def test_both_editions_have_the_same_notebooks() -> None:
    fa, en = _notebooks("fa"), _notebooks("en")
    assert set(fa) == set(en), (
        f"only in notebooks/fa: {sorted(set(fa) - set(en))}; "
        f"only in notebooks/en: {sorted(set(en) - set(fa))}"
    )


@pytest.mark.parametrize("name", sorted(set(_notebooks("fa")) & set(_notebooks("en"))))
def test_editions_agree_on_everything_but_prose(name: str) -> None:
    load = lambda lang: json.loads((ROOT / "notebooks" / lang / name).read_text(encoding="utf-8"))
    problems = compare_notebooks(load("fa"), load("en"), name)
    assert not problems, "\n".join(problems)


# --- The checker itself can fail --------------------------------------------------------------

def _cell(kind: str, src: str) -> dict:
    """A cell of `kind` "code", "markdown" or "listing <path::name>" (a listing cell)."""
    if kind == "code":
        return {"cell_type": kind, "source": src, "metadata": {}, "outputs": []}
    if kind.startswith("listing "):
        return {"cell_type": "markdown", "source": src, "id": "listing-f",
                "metadata": {LISTING: kind.split(" ", 1)[1]}}
    return {"cell_type": kind, "source": src, "metadata": {}}


def _nb(*cells: tuple[str, str]) -> dict:
    return {"cells": [_cell(kind, src) for kind, src in cells]}


F = "listing lesson_code/m.py::f"


FA = _nb(("markdown", "(fa-intro)=\n# درس\n\nبه {ref}`fa-intro` نگاه کنید."),
         ("code", "x = 1\nprint(x)"),
         ("markdown", "## بخش\n\n```{figure} ring.svg\n:name: fa-ring\n```\n\n"
                      "```python\n# a comment, not a heading\n```"),
         (F, "```python\ndef f():\n    return 1\n```"))
EN = _nb(("markdown", "(en-intro)=\n# Lesson\n\nSee {ref}`en-intro`."),
         ("code", "x = 1\nprint(x)"),
         ("markdown", "## Part\n\n```{figure} ring.svg\n:name: en-ring\n```"),
         (F, "```python\ndef f():\n    return 1\n```"))
EN_SUFFIXED = _nb(("markdown", "(intro-en)=\n# Lesson\n\nSee {ref}`intro-en`."),
                  ("code", "x = 1\nprint(x)"),
                  ("markdown", "## Part\n\n```{figure} ring.svg\n:name: ring-en\n```"),
                  (F, "```python\ndef f():\n    return 1\n```"))


@pytest.mark.parametrize("en", [EN, EN_SUFFIXED], ids=["prefixed-labels", "suffixed-labels"])
def test_checker_accepts_editions_that_differ_only_in_prose(en: dict) -> None:
    assert compare_notebooks(FA, en) == []


@pytest.mark.parametrize("drift, expected", [
    ({1: ("code", "x = 2\nprint(x)")}, "code cell #0 (fa cell 1, en cell 1) differs"),
    ({2: ("markdown", "### Part\n\n```{figure} ring.svg\n:name: en-ring\n```")},
     "level-2 headings: fa has 1"),
    ({2: ("markdown", "## Part\n\n```{figure} ring.svg\n:name: en-rings\n```")},
     "label 'ring' in fa (cell 2) is missing in en"),
    ({2: ("markdown", "## Part")}, "figures and images: fa has 1"),
    ({2: ("markdown", "## Part\n\n```{figure} ring.svg\n:name: en-ring\n```\n\n"
                      "| a | b |\n|---|---|\n| 1 | 2 |")}, "tables: fa has 0"),
    ({0: ("markdown", "(intro)=\n# Lesson\n\nSee {ref}`intro`.")}, "should start with 'en-'"),
    ({3: (F, "```python\ndef f():\n    return 2\n```")},
     "listing #0 (fa cell 3, en cell 3) (lesson_code/m.py::f) holds other code in each edition"),
    ({3: ("listing lesson_code/m.py::g", "```python\ndef f():\n    return 1\n```")},
     "listing #0 (fa cell 3, en cell 3) differs: after code cell #1, listing-f, lesson_code/m.py::f in fa"),
    ({3: ("markdown", "The end.")}, "fa has 1 listing cells, en 0"),
])
def test_checker_reports_drift(drift: dict, expected: str) -> None:
    cells = [(F if c["metadata"] else c["cell_type"], c["source"]) for c in EN["cells"]]
    for index, cell in drift.items():
        cells[index] = cell
    problems = compare_notebooks(FA, _nb(*cells), "76-collectives.ipynb")
    assert any(expected in p for p in problems), problems
    assert all(p.startswith("76-collectives.ipynb: ") for p in problems)


def test_checker_counts_table_outputs() -> None:
    table_output = {"output_type": "execute_result", "metadata": {}, "execution_count": 1,
                    "data": {"text/html": ["<div><table class=\"dataframe\">", "</table></div>"],
                             "text/plain": ["   a\n0  1"]}}
    en = json.loads(json.dumps(EN))
    en["cells"][1]["outputs"] = [table_output]
    problems = compare_notebooks(FA, en, "77-ddp.ipynb")
    assert any("tables: fa has 0 (cells []), en has 1 (cells [1])" in p for p in problems), problems

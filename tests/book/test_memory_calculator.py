"""Lesson 78's offline calculator (book/static/memory-calculator.js) against lesson_code.memory.

The JavaScript runs in node when node is installed, else in headless Chromium; on a grid of
parameter counts, world sizes, stages and precisions it must give the bytes of
memory.bytes_per_rank to the last bit that a float64 sum allows.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from lesson_code import memory

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "book" / "static" / "memory-calculator.js"
CHROMIUM = Path("/usr/bin/chromium-headless-shell")
PARAMS = [1, 1e6, 7.5e9, 1.75e11, 1e12]
WORLD_SIZES = [1, 2, 3, 7, 8, 64, 1000]
PRECISIONS = {"mixed": memory.MIXED_ADAM, "fp32": memory.FP32_ADAM}
GRID = [(stage, p, n, name) for stage in memory.STAGES for p in PARAMS for n in WORLD_SIZES
        for name in PRECISIONS]
EVALUATE = """(grid) => grid.map(([stage, p, n, precision]) =>
    globalThis.MemoryCalculator.bytesPerRank(stage, p, n,
                                             globalThis.MemoryCalculator.PRECISIONS[precision]))"""


def run_javascript(expression: str, argument: object) -> object:
    """Evaluate `expression` (a JS function of one JSON argument) after loading the calculator."""
    source = SCRIPT.read_text(encoding="utf-8")
    if shutil.which("node"):
        program = f"{source}\nconsole.log(JSON.stringify(({expression})({json.dumps(argument)})));"
        done = subprocess.run(["node", "-e", program], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)
    if not CHROMIUM.exists():
        pytest.skip("neither node nor chromium-headless-shell is installed to run the script")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        page = browser.new_page()
        page.add_script_tag(content=source)
        result = page.evaluate(expression, argument)
        browser.close()
    return result


def test_the_script_computes_what_lesson_code_memory_computes():
    got = run_javascript(EVALUATE, GRID)
    for (stage, p, n, name), js in zip(GRID, got, strict=True):
        python = memory.bytes_per_rank(stage, p, n, PRECISIONS[name])
        assert js == pytest.approx(python, rel=1e-15), (stage, p, n, name)


def test_lesson_78_figures_in_both_languages():
    rows = run_javascript("""() => [8, 64].flatMap((n) => ["en", "fa"].map((lang) =>
        globalThis.MemoryCalculator.rows(1, n, "mixed", lang)[1].perParam))""", None)
    assert rows == ["5.5Ψ", "۵٫۵Ψ", "4.19Ψ", "۴٫۱۹Ψ"]


def test_a_bad_world_size_is_refused_with_the_fix():
    message = run_javascript("""() => { try { globalThis.MemoryCalculator.bytesPerRank(
        "ZeRO-1", 1, 0); return "accepted"; } catch (e) { return e.message; } }""", None)
    assert "world size 0" in message and "such as 8" in message

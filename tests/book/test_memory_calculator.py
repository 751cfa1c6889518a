"""Lesson 78's offline calculator (book/static/memory-calculator.js) against lesson_code.memory.

The JavaScript runs in node when node is installed, else in headless Chromium; on a grid of
parameter counts, world sizes, stages and precisions it must give the bytes of
memory.bytes_per_rank to the last bit that a float64 sum allows.
"""

from __future__ import annotations

import pytest

from lesson_code import memory
from lesson_code.plots import number
from javascript import evaluate

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
    return evaluate(["memory-calculator.js"], expression, argument)


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


def test_the_traffic_column_is_memory_traffic_per_step():
    got = run_javascript("""(grid) => grid.map(([stage, p, n, precision]) =>
        globalThis.MemoryCalculator.trafficPerStep(stage, p, n,
            globalThis.MemoryCalculator.PRECISIONS[precision].grads))""", GRID)
    for (stage, p, n, name), js in zip(GRID, got, strict=True):
        python = memory.traffic_per_step(stage, p, n, dtype_bytes=PRECISIONS[name].grads)
        assert js == pytest.approx(python, rel=1e-15, abs=0), (stage, p, n, name)


# Lesson 78a's step explorer, in the same file: one ZeRO-3 step as memory.stage3_step models it.
STEP_UNITS = [[["embed", 9216], ["blocks.0", 198272], ["blocks.1", 198272], ["head", 8448]],
              [["layers.0", 2112], ["layers.2", 4160], ["layers.4", 650]], [["one", 1]]]
STEP_GRID = [(units, n, name) for units in STEP_UNITS for n in (1, 2, 3, 4, 7, 64)
             for name in ("fp32master", "mixed")]
STEP_PRECISIONS = {"fp32master": memory.FP32_MASTER_ADAM, "mixed": memory.MIXED_ADAM}


def test_the_step_explorer_models_what_lesson_code_memory_models():
    got = run_javascript("""(grid) => grid.map(([units, n, precision]) =>
        globalThis.MemoryCalculator.stage3Step(units, n,
            globalThis.MemoryCalculator.STAGE3_PRECISIONS[precision]))""", STEP_GRID)
    for (units, n, name), js in zip(STEP_GRID, got, strict=True):
        python = memory.stage3_step([tuple(unit) for unit in units], n, STEP_PRECISIONS[name])
        assert js == python, (units, n, name)  # whole bytes: equal, not close


def test_the_step_explorer_reads_the_measured_units_and_peaks():
    from lesson_code import zero_lab
    from lesson_code.bench import stored
    from lesson_code.book_build import explorer_data

    data = explorer_data.for_lesson("78a-zero-stages")
    assert data["units"] == [list(unit) for unit in zero_lab.stage3_units()]
    table, note = stored.load("zero_stages")
    zero3 = table[table["stage"] == "ZeRO-3"]
    assert {int(n): row["peak"] for n, row in data["measured_peaks"].items()} == zero3["peak"].to_dict()
    assert data["measured"]["date"] == note["measured"]
    message = run_javascript("""() => { try { globalThis.MemoryCalculator.stage3Step([["a", 1]], 0);
        return "accepted"; } catch (e) { return e.message; } }""", None)
    assert "world size 0" in message and "such as 8" in message


# Under the calculator: the points lesson 78b's scale lab measured, from the stored sweep.
def test_the_measured_points_are_the_stored_sweeps_beside_the_formula():
    from lesson_code import scale_lab
    from lesson_code.bench.stored import persian_machine
    from lesson_code.book_build import explorer_data
    from lesson_code.scale_lab import stored as scale_stored

    data = explorer_data.for_lesson("78-zero")
    table, note = scale_stored.load()
    assert data["measured"] == {"date": note["measured"], "machine": {
        "en": note["machine"], "fa": persian_machine(note["machine"])}}
    points = scale_lab.measured_points(table)
    assert data["points"] == points["points"] and data["model"] == points["model"]
    assert data["dtype"] == "bfloat16"  # the calculator's mixed precision: 2-byte weights and grads
    cases = [(strategy, lang) for strategy in memory.STAGES for lang in ("en", "fa")]
    got = run_javascript("""([data, cases]) => cases.map(([strategy, lang]) =>
        globalThis.MemoryCalculator.measuredRows(data, strategy, lang))""", [data, cases])
    parameters = data["model"]["parameters"]
    for (strategy, lang), rows in zip(cases, got, strict=True):
        measured = {int(n): int(b) for n, b in zip(table[table["strategy"] == strategy]["N"],
                                                    table[table["strategy"] == strategy]["model_states"])}
        assert [(row["N"], row["bytes"]) for row in rows] == sorted(measured.items()), strategy
        for row in rows:
            formula = memory.total_bytes(strategy, parameters, row["N"], memory.MIXED_ADAM)
            assert row["formulaBytes"] == pytest.approx(formula, rel=1e-15), (strategy, row["N"])
            assert row["measured"] == number(f"{row['bytes'] / 1e6:.2f}".rstrip("0").rstrip("."), lang)
            assert row["formula"] == number(f"{formula / 1e6:.2f}".rstrip("0").rstrip("."), lang)

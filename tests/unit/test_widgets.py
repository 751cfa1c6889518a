"""The memory calculator widget computes from lesson_code.memory (no kernel front-end needed)."""

import ipywidgets

from lesson_code import widgets


def test_calculator_table_matches_the_paper():
    table = widgets.memory_table_for(7.5, 64, "ZeRO-1", "mixed (bf16 + fp32 master)")
    assert table.loc["total", "GB per rank"] == 31.41
    fp32 = widgets.memory_table_for(1.0, 1, "DDP", "fp32")
    assert fp32.loc["total", "GB per rank"] == 16.0


def test_calculator_is_an_interactive_widget():
    calculator = widgets.memory_calculator()
    assert isinstance(calculator, ipywidgets.interactive)
    names = {child.description for child in calculator.children if hasattr(child, "description")}
    assert {"P (billions)", "N", "stage", "precision"} <= names

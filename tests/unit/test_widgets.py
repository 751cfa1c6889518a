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


def test_in_persian_the_calculator_is_labelled_in_the_glossarys_words():
    calculator = widgets.memory_calculator("fa")
    controls = {child.description: child for child in calculator.children
                if getattr(child, "description", "")}
    assert {"P (میلیارد)", "N", "مرحلهٔ ZeRO", "دقت عددی"} <= set(controls)
    precision = controls["دقت عددی"]
    assert precision.options[0] == ("ترکیبی (bf16 با وزن‌های اصلی fp32)", "mixed (bf16 + fp32 master)")
    calculator.update()  # the table it shows for the default choices
    shown = calculator.result._repr_html_()
    assert shown.startswith('<div dir="rtl"') and "گیگابایت در هر رتبه" in shown
    english = widgets.memory_calculator("en")
    english.update()
    assert list(english.result.columns) == ["GB per rank"]


def test_the_calculator_shows_its_table_not_only_keeps_it(capsys):
    """A bare ipywidgets.interactive keeps what its function returns in .result and shows
    nothing: in Jupyter the sliders had no table under them. Outside a kernel, what it shows is
    printed."""
    calculator = widgets.memory_calculator()
    capsys.readouterr()
    calculator.update()
    assert "GB per rank" in capsys.readouterr().out

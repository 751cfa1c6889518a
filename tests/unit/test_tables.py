"""Table labels in the reader's language (plots.tables): labels change, values never do."""

import re

import pandas as pd
import pytest

from lesson_code.plots import capstone, checkpoint, pipeline
from lesson_code.plots.tables import PersianSeries, PersianTable, persian_cell, translate

WORDS = {"fa": {"stage": "مرحله", "schedule": "زمان‌بندی", "value": "مقدار"}}


def test_labels_are_translated_and_numbered_labels_get_persian_digits():
    frame = pd.DataFrame({"stage 0": [1.5], "stage 12": [2.5]},
                         index=pd.MultiIndex.from_tuples([("gpipe", 8)], names=["schedule", "m"]))
    persian = translate(frame, WORDS, "fa")
    assert list(persian.columns) == ["مرحلهٔ ۰", "مرحلهٔ ۱۲"]  # the ezafe of a word in silent ه
    assert persian.index.names == ["زمان‌بندی", "m"]  # an unknown label stays as it was
    assert persian.values.tolist() == frame.values.tolist()
    assert translate(frame, WORDS, "en") is frame


def test_a_series_name_is_translated_and_an_unknown_language_named():
    assert translate(pd.Series([1], name="value"), WORDS, "fa").name == "مقدار"
    with pytest.raises(ValueError, match="unknown language 'de'"):
        translate(pd.Series([1]), WORDS, "de")


@pytest.mark.parametrize("module", [pipeline, checkpoint, capstone])
def test_every_lesson_word_has_a_persian_label(module):
    words = module.TABLE_WORDS["fa"]
    assert words and all(any("\u0600" <= ch <= "\u06ff" for ch in label) or label.isascii()
                         for label in words.values())
    assert set(module.table(pd.DataFrame(columns=list(words)), "fa").columns) == set(words.values())


def test_a_persian_table_computes_in_english_values_and_shows_right_to_left():
    """The Persian table is still the DataFrame the notebook asserts on (numbers, booleans), its
    text/plain is pandas' own (what nbval compares stays as it was), and its HTML runs right to
    left with Persian digits and بله/خیر: no Latin digit, no True, in any cell."""
    frame = pd.DataFrame({"value": [12.5, -0.25], "stage 3": [True, False],
                          "schedule": ["1F1B", "value"]}, index=["stage 0", "stage 12"])
    persian = translate(frame, WORDS, "fa")
    assert isinstance(persian, PersianTable) and isinstance(persian, pd.DataFrame)
    assert persian.to_numpy().tolist() == frame.to_numpy().tolist()
    assert bool(persian["مقدار"].sum() == 12.25) and persian["مرحلهٔ ۳"].dtype == bool
    assert repr(persian) == repr(pd.DataFrame(persian))
    shown = persian._repr_html_()
    assert shown.startswith('<div dir="rtl" lang="fa"')
    cells = re.findall(r"<t[hd](?:\s[^>]*)?>(.*?)</t[hd]>", shown, flags=re.S)
    assert "۱۲٫۵۰" in cells and "بله" in cells and "خیر" in cells and "مرحلهٔ ۱۲" in cells
    assert '<bdi dir="ltr">1F1B</bdi>' in cells and "مقدار" in cells  # a name keeps its digits
    latin_digits = [c for c in cells if re.search(r"[0-9]", c) and "1F1B" not in c]
    assert not latin_digits, latin_digits
    assert '<bdi dir="ltr">−۰٫۲۵</bdi>' in cells  # the minus sign, left of the number


def test_a_persian_series_becomes_a_persian_table_and_english_stays_pandas():
    series = translate(pd.Series({"stage 1": True}, name="value"), WORDS, "fa")
    assert isinstance(series, PersianSeries) and isinstance(series.to_frame(), PersianTable)
    assert "بله" in series.to_frame()._repr_html_()
    shown = series._repr_html_()  # a one-column table headed by its name: no Name:, no dtype:
    assert shown.startswith('<div dir="rtl"') and "<th>مقدار</th>" in shown and "بله" in shown
    assert "dtype" not in shown and "Name" not in shown
    english = pd.DataFrame({"value": [1.5]})
    assert type(translate(english, WORDS, "en")) is pd.DataFrame
    assert "dir=\"rtl\"" not in english._repr_html_()


@pytest.mark.parametrize("value, shown", [
    ("3.814697e-06", '<bdi dir="ltr">۳٫۸۱۴۶۹۷ × ۱۰<sup>−۶</sup></bdi>'),  # pandas' digits, all
    ("0.000190", "۰٫۰۰۰۱۹۰"),  # written plainly where pandas wrote it plainly
    ("2.500000e-01", '<bdi dir="ltr">۲٫۵۰۰۰۰۰ × ۱۰<sup>−۱</sup></bdi>'),  # as its column
    ("0.000000e+00", "۰"),  # an exact zero needs no power of ten
    ("-0.41", '<bdi dir="ltr">−۰٫۴۱</bdi>'),  # the minus sign, not a hyphen, on the left
    ("NaN", "—"), ("None", "—"),
    ("(6, 1.667)", "(۶، ۱٫۶۶۷)"), ("[12, 11, 2]", "[۱۲، ۱۱، ۲]"),  # the Persian comma
    ("embedding, block 0", "لایهٔ جاسازی، بلوک ۰"),  # a list of known words
    ("+ .step-00000002.tmp", '<bdi dir="ltr">+ .step-00000002.tmp</bdi>'),  # the dot stays first
    ("ZeRO-1 روی ۴ رتبه", '<bdi dir="ltr">ZeRO-1</bdi> روی ۴ رتبه'),
    ("ZeRO-3 (کد ما)", '<bdi dir="ltr">ZeRO-3</bdi> (کد ما)'),  # both brackets in the Persian run
    ("خواندن replicated.pt (۸ رتبه)", 'خواندن <bdi dir="ltr">replicated.pt</bdi> (۸ رتبه)'),  # so its number
    ("خواندن replicated.pt (8 رتبه)", 'خواندن <bdi dir="ltr">replicated.pt</bdi> (۸ رتبه)'),
    ("خواندن replicated.pt (1.5 رتبه)", 'خواندن <bdi dir="ltr">replicated.pt</bdi> (۱٫۵ رتبه)'),
    ("f(2) رتبه", '<bdi dir="ltr">f(2)</bdi> رتبه'),  # a pair inside the name stays whole
    ("(کد ما) ZeRO-3", '(کد ما) <bdi dir="ltr">ZeRO-3</bdi>'),
    ("بلوک (ZeRO-3)", 'بلوک <bdi dir="ltr">(ZeRO-3)</bdi>'),  # a pair inside the name stays
    (".step-00000004.tmp: ذخیره‌ای نیمه‌کاره", '<bdi dir="ltr">.step-00000004.tmp</bdi>: ذخیره‌ای نیمه‌کاره'),
    # the colon that ends a Persian clause, and its number, stay before the name, right to left
    ("کل مرحله: GPipe، m = ۳۲", 'کل مرحله: <bdi dir="ltr">GPipe</bdi>، <bdi dir="ltr">m = ۳۲</bdi>'),
    ("روی ۸: 1F1B، مرحلهٔ ۰", 'روی ۸: <bdi dir="ltr">1F1B</bdi>، مرحلهٔ ۰'),
    ("روی 8: 1F1B، مرحلهٔ ۰", 'روی ۸: <bdi dir="ltr">1F1B</bdi>، مرحلهٔ ۰'),
    ("حدود 1,024 tokens", 'حدود <bdi dir="ltr">1,024 tokens</bdi>'),  # its own comma: kept whole
])
def test_a_persian_cell_writes_numbers_lists_and_names_by_the_rule(value, shown):
    words = {"embedding": "لایهٔ جاسازی", "block": "بلوک"}
    assert persian_cell(value, words) == shown


CELL = re.compile(r"<t[dh](?:\s[^>]*)?>(.*?)</t[dh]>", re.S)
VALUE = re.compile(r"<td(?:\s[^>]*)?>(.*?)</td>", re.S)
FROM_PERSIAN = str.maketrans("۰۱۲۳۴۵۶۷۸۹٫٬−", "0123456789.,-")


def _english_cells(frame) -> list[str]:
    return CELL.findall(frame._repr_html_())


def _persian_cells_in_latin(frame) -> list[str]:
    """The Persian table's cells, their numbers written back in Latin digits as pandas does."""
    cells = []
    for cell in CELL.findall(translate(frame, {"fa": {}}, "fa")._repr_html_()):
        cell = re.sub(r" × ۱۰<sup>(.*?)</sup>", lambda m: "e" + m.group(1), cell)
        cell = re.sub(r"</?bdi[^>]*>", "", cell).translate(FROM_PERSIAN)
        cells.append({"—": "NaN", "بله": "True", "خیر": "False"}.get(cell, cell))
    return cells


def _exponent_as_number(cell: str) -> str:
    if re.fullmatch(r"-?0\.0*e[-+]?\d+", cell):  # an exact zero among powers of ten: «۰»
        return "0"
    return re.sub(r"e([-+]?)0*(\d)", lambda m: "e" + m.group(1).replace("+", "") + m.group(2), cell)


@pytest.mark.parametrize("columns", [
    {"ints": [1, 4788224, -3, 0]},
    {"mixed": [1.5, 0.000190, 123456.789, 2.0], "plain": [0.25, 0.5, 12.125, 3.0]},
    {"tiny": [3.814697e-06, 1.2e-09, 0.0, 1.0], "small": [0.0123, 0.000012, 0.4, 0.002]},
    {"huge": [1.5e12, 3.0, 7.25, 1e6], "negative": [-0.41, -1e-08, 2.5, -1234.5]},
    {"missing": [1.0, float("nan"), -0.41, 0.0009], "count": [1, 2, 3, 4]},
    {"flag": [True, False, True, False], "ratio": [1 / 3, 2 / 3, 1.0, 1e-7]},
])
def test_a_persian_table_shows_the_english_tables_numbers_digit_for_digit(columns):
    frame = pd.DataFrame(columns)
    english = [_exponent_as_number(cell) for cell in _english_cells(frame)]
    assert _persian_cells_in_latin(frame) == english
    persian = CELL.findall(translate(frame, {"fa": {}}, "fa")._repr_html_())
    assert not any("-" in cell for cell in persian)  # the minus sign «−», never a hyphen
    for column in frame.columns:  # one notation per column: a power of ten in all or none
        english_column = VALUE.findall(frame[[column]]._repr_html_())
        persian_column = VALUE.findall(translate(frame[[column]], {"fa": {}}, "fa")._repr_html_())
        shown = [(p, e) for p, e in zip(persian_column, english_column) if p != "۰"]
        assert len({"×" in cell for cell, _ in shown}) == 1, persian_column
        assert ("×" in shown[0][0]) == bool(re.search(r"\de", shown[0][1]))

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
    left with Persian digits and درست/نادرست: no Latin digit, no True, in any cell."""
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
    assert "۱۲٫۵۰" in cells and "درست" in cells and "نادرست" in cells and "مرحلهٔ ۱۲" in cells
    assert '<bdi dir="ltr">1F1B</bdi>' in cells and "مقدار" in cells  # a name keeps its digits
    latin_digits = [c for c in cells if re.search(r"[0-9]", c) and "1F1B" not in c]
    assert not latin_digits, latin_digits
    assert '<bdi dir="ltr">−۰٫۲۵</bdi>' in cells  # the minus sign, left of the number


def test_a_persian_series_becomes_a_persian_table_and_english_stays_pandas():
    series = translate(pd.Series({"stage 1": True}, name="value"), WORDS, "fa")
    assert isinstance(series, PersianSeries) and isinstance(series.to_frame(), PersianTable)
    assert "درست" in series.to_frame()._repr_html_()
    shown = series._repr_html_()  # a one-column table headed by its name: no Name:, no dtype:
    assert shown.startswith('<div dir="rtl"') and "<th>مقدار</th>" in shown and "درست" in shown
    assert "dtype" not in shown and "Name" not in shown
    english = pd.DataFrame({"value": [1.5]})
    assert type(translate(english, WORDS, "en")) is pd.DataFrame
    assert "dir=\"rtl\"" not in english._repr_html_()


@pytest.mark.parametrize("value, shown", [
    ("3.814697e-06", '<bdi dir="ltr">۳٫۸۱ × ۱۰<sup>−۶</sup></bdi>'),  # small: × ۱۰ to a power
    ("0.000006", '<bdi dir="ltr">۶ × ۱۰<sup>−۶</sup></bdi>'),  # however pandas wrote it
    ("2.500000e-01", "۰٫۲۵"),  # a power of ten only where the number needs one
    ("0.000000e+00", "۰"),
    ("-0.41", '<bdi dir="ltr">−۰٫۴۱</bdi>'),  # the minus sign, not a hyphen, on the left
    ("NaN", "—"), ("None", "هیچ"),
    ("(6, 1.667)", "(۶، ۱٫۶۶۷)"), ("[12, 11, 2]", "[۱۲، ۱۱، ۲]"),  # the Persian comma
    ("embedding, block 0", "لایهٔ جاسازی، بلوک ۰"),  # a list of known words
    ("+ .step-00000002.tmp", '<bdi dir="ltr">+ .step-00000002.tmp</bdi>'),  # the dot stays first
    ("ZeRO-1 روی ۴ رتبه", '<bdi dir="ltr">ZeRO-1</bdi> روی ۴ رتبه'),
])
def test_a_persian_cell_writes_numbers_lists_and_names_by_the_rule(value, shown):
    words = {"embedding": "لایهٔ جاسازی", "block": "بلوک"}
    assert persian_cell(value, words) == shown


@pytest.mark.parametrize("value, shown", [
    ("1.901835e-04", '<bdi dir="ltr">۱٫۹۰ × ۱۰<sup>−۴</sup></bdi>'),  # three significant digits
    ("0.000190", '<bdi dir="ltr">۱٫۹۰ × ۱۰<sup>−۴</sup></bdi>'),  # the zero pandas shows
    ("0.000006", '<bdi dir="ltr">۶ × ۱۰<sup>−۶</sup></bdi>'),  # no digit pandas does not show
    ("1.000000e-08", '<bdi dir="ltr">۱٫۰۰ × ۱۰<sup>−۸</sup></bdi>'),
    ("2.353038", "۲٫۳۵۳۰۳۸"),  # a number written plainly stays as it is
])
def test_a_persian_cell_can_keep_the_trailing_zeros_the_english_table_shows(value, shown):
    assert persian_cell(value, zeros=True) == shown
    assert persian_cell(value) == shown.replace("۱٫۹۰", "۱٫۹").replace("۱٫۰۰ × ۱۰", "۱۰")

"""Table labels in the reader's language (plots.tables): labels change, values never do."""

import pandas as pd
import pytest

from lesson_code.plots import capstone, checkpoint, pipeline
from lesson_code.plots.tables import translate

WORDS = {"fa": {"stage": "مرحله", "schedule": "زمان‌بندی", "value": "مقدار"}}


def test_labels_are_translated_and_numbered_labels_get_persian_digits():
    frame = pd.DataFrame({"stage 0": [1.5], "stage 12": [2.5]},
                         index=pd.MultiIndex.from_tuples([("gpipe", 8)], names=["schedule", "m"]))
    persian = translate(frame, WORDS, "fa")
    assert list(persian.columns) == ["مرحله ۰", "مرحله ۱۲"]
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

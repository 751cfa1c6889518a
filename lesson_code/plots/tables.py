"""Tables in the reader's language: the labels of a pandas DataFrame or Series, translated.

A notebook's code cells are identical in both editions, so a cell builds its table with English
labels and passes it through its lesson's `table(frame, lang)`, which calls `translate` with the
lesson's words. Values stay as measured; only labels (column and index names and their values)
change. A label "stage 3" becomes the word for "stage" followed by the number in Persian digits.

    figures.table(pd.DataFrame(rows).set_index("stage"), lang=plots.page_language())
"""

from __future__ import annotations

import re

import pandas as pd

from lesson_code.plots import check_language

PERSIAN_DIGITS = str.maketrans("0123456789", "۰۱۲۳۴۵۶۷۸۹")


def translate_label(label, words: dict[str, str]):
    """One label in the words' language: a known word, a known word and a number, or as it was."""
    if not isinstance(label, str):
        return label
    if label in words:
        return words[label]
    numbered = re.fullmatch(r"(.+?) (\d+)", label)
    if numbered and numbered.group(1) in words:
        return f"{words[numbered.group(1)]} {numbered.group(2).translate(PERSIAN_DIGITS)}"
    return label


def translate(frame: pd.DataFrame | pd.Series, words: dict[str, dict[str, str]], lang: str):
    """`frame` with its labels in `lang` ("en" returns it as it is); raises ValueError for another.

    `words[lang]` maps English labels to that language's; labels not in it stay unchanged.
    """
    mapping = words.get(check_language(lang), {})
    if not mapping:
        return frame
    rename = lambda label: translate_label(label, mapping)  # noqa: E731
    frame = frame.rename(index=rename)
    frame.index = frame.index.set_names([rename(n) for n in frame.index.names])
    if isinstance(frame, pd.DataFrame):
        frame = frame.rename(columns=rename)
        frame.columns = frame.columns.set_names([rename(n) for n in frame.columns.names])
    else:
        frame = frame.rename(rename(frame.name))
    return frame

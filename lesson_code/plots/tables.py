"""Tables in the reader's language: the labels of a pandas DataFrame or Series, translated.

A notebook's code cells are identical in both editions, so a cell builds its table with English
labels and passes it through its lesson's `table(frame, lang)`, which calls `translate` with the
lesson's words. Values stay as measured; only labels (column and index names and their values)
change. A label "stage 3" becomes the word for "stage" followed by the number in Persian digits.

In Persian the result is a `PersianTable` (or `PersianSeries`): the same pandas object, whose
values the notebook's asserts still read as numbers and booleans, and whose text/plain is
pandas' own, but whose HTML (what Jupyter and the book show) runs right to left, with Persian
digits, درست/نادرست for True/False, and the lesson's words for English values it knows.

    figures.table(pd.DataFrame(rows).set_index("stage"), lang=plots.page_language())
"""

from __future__ import annotations

import html
import re

import pandas as pd

from lesson_code.plots import FREE_NUMBER, split_latin, check_language, number

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
    if lang != "fa":
        return frame if not mapping else _renamed(frame, mapping)
    frame = _renamed(frame, mapping)
    shown = (PersianTable if isinstance(frame, pd.DataFrame) else PersianSeries)(frame)
    shown.words = mapping
    return shown


def _renamed(frame, mapping: dict[str, str]):
    """`frame` with every label that `mapping` (or `translate_label`) knows translated."""
    rename = lambda label: translate_label(label, mapping)  # noqa: E731
    frame = frame.rename(index=rename)
    frame.index = frame.index.set_names([rename(n) for n in frame.index.names])
    if isinstance(frame, pd.DataFrame):
        frame = frame.rename(columns=rename)
        frame.columns = frame.columns.set_names([rename(n) for n in frame.columns.names])
    else:
        frame = frame.rename(rename(frame.name))
    return frame


BOOLEANS = {"True": "درست", "False": "نادرست"}
NUMBER = re.compile(r"[-+−]?\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?%?|nan|inf|-inf")
TEXT_NODE = re.compile(r">([^<>]+)<")


def persian_cell(text: str, words: dict[str, str] | None = None) -> str:
    """One table cell as the Persian edition shows it, as HTML: a number in Persian digits (kept
    left to right, so a sign or an exponent stays in place), True/False as درست/نادرست, an English
    value the lesson's `words` know in Persian, and else its free numbers in Persian digits
    (names such as ZeRO-1 keep theirs)."""
    stripped = text.strip()
    if not stripped:
        return html.escape(text, quote=False)
    if stripped in BOOLEANS:
        return BOOLEANS[stripped]
    if NUMBER.fullmatch(stripped):
        persian = number(stripped.replace(",", "٬"), "fa")
        return persian if stripped[0].isdigit() and "e" not in stripped \
            else f'<bdi dir="ltr">{html.escape(persian, quote=False)}</bdi>'
    if words and stripped in words:
        return html.escape(words[stripped], quote=False)
    pieces = split_latin(stripped)
    return html.escape("".join(
        FREE_NUMBER.sub(lambda m: number(m.group(), "fa"), piece) if index % 2 == 0 else piece
        for index, piece in enumerate(pieces)), quote=False)


def persian_html(table_html: str, words: dict[str, str] | None = None) -> str:
    """pandas' HTML of a table, shown right to left: every cell through `persian_cell`, the
    whole in a <div dir="rtl" lang="fa"> (the first column on the right, mixed headers such as
    "صرفه‌جویی (٪)" in reading order)."""
    head, style_end, body = table_html.partition("</style>")
    if not style_end:
        head, body = "", table_html
    body = TEXT_NODE.sub(lambda m: ">" + persian_cell(html.unescape(m.group(1)), words) + "<",
                         body)
    shown = head + style_end + body
    opening = '<div dir="rtl" lang="fa" class="persian-table" style="direction: rtl">'
    if shown.startswith("<div>"):
        return opening + shown[len("<div>"):]
    return opening + shown + "</div>"


class PersianTable(pd.DataFrame):
    """A DataFrame of the Persian edition: pandas in every way, shown right to left in HTML."""

    _metadata = ["words"]
    words: dict[str, str] = {}

    @property
    def _constructor(self):
        return PersianTable

    @property
    def _constructor_sliced(self):
        return PersianSeries

    def _repr_html_(self) -> str | None:
        table_html = pd.DataFrame(self)._repr_html_()
        return None if table_html is None else persian_html(table_html, self.words)


class PersianSeries(pd.Series):
    """A Series of the Persian edition. Its display is pandas' (text only, as in the English
    edition); `to_frame()` gives a `PersianTable`."""

    _metadata = ["words"]
    words: dict[str, str] = {}

    @property
    def _constructor(self):
        return PersianSeries

    @property
    def _constructor_expanddim(self):
        return PersianTable

"""Tables in the reader's language: the labels of a pandas DataFrame or Series, translated.

A notebook's code cells are identical in both editions, so a cell builds its table with English
labels and passes it through its lesson's `table(frame, lang)`, which calls `translate` with the
lesson's words. Values stay as measured; only labels (column and index names and their values)
change. A label "stage 3" becomes the word for "stage" and the number, «مرحلهٔ ۳».

In Persian the result is a `PersianTable` (or `PersianSeries`): the same pandas object, whose
values the notebook's asserts still read as numbers and booleans, and whose text/plain is
pandas' own, but whose HTML (what Jupyter, a code host and the book show) runs right to left,
with the numbers pandas writes for the English table, digit for digit and in the same notation,
in Persian digits (`lesson_code.language.table_number_text`), بله/خیر (yes/no) for True/False, the
lesson's words for English values it knows, and Latin names isolated left to right.

    figures.table(pd.DataFrame(rows).set_index("stage"), lang=plots.page_language())
"""

from __future__ import annotations

import html
import re

import pandas as pd

from lesson_code import language, plots
from lesson_code.plots import FREE_NUMBER, check_language, number

def translate_label(label, words: dict[str, str]):
    """One label in the words' language: a known word, a known word and its number («مرحلهٔ ۳»,
    `language.numbered`), a known template with its numbers in place of "{}" ("a node's 8 ranks"
    through "a node's {} ranks"), or as it was."""
    if not isinstance(label, str):
        return label
    if label in words:
        return words[label]
    numbered = re.fullmatch(r"(.+?) (\d+)", label)
    if numbered and numbered.group(1) in words:
        return language.numbered(words[numbered.group(1)], numbered.group(2))
    template = re.sub(r"\d+", "{}", label)
    if template != label and "{}" in words.get(template, ""):
        return words[template].format(*map(language.persian_digits, re.findall(r"\d+", label)))
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


# A boolean cell in the words the Persian sentences use (language.BOOLEANS); None is an empty cell
# (no error raised, no value): a dash, as for NaN.
BOOLEANS = {str(value): word for value, word in language.BOOLEANS["fa"].items()} | {"None": "—"}
NUMBER = re.compile(r"[-+−]?\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?%?|nan|NaN|inf|-inf")
TEXT_NODE = re.compile(r">([^<>]+)<")
SEQUENCE = re.compile(r"[(\[](?:[^()\[\]A-Za-z]*)[)\]]")  # (6, 1.5), [12, 11, 2, 4]
NOT_PERSIAN_LETTERS = re.compile(r"[^\u0600-\u065f\u066e-\u06ef\u06fa-\u06ff]+")
EDGE_SPACE = re.compile(r"^(\s*)(.*?)(\s*)$", re.S)
# A bracket that pairs with one across Persian words stays outside the Latin name's isolate:
# inside it, "ZeRO-3 (" + «کد ما)» would show two opening brackets. So does a number that opens
# that bracket's Persian clause ("replicated.pt (۸ رتبهٔ یک گره)"), and the colon or comma that
# ends the name's clause: inside, right to left, it would show before the name. Before the name,
# the colon that ends the Persian clause, and the number it follows, stay outside too
# («کل مرحله: GPipe», «روی ۸: 1F1B»): inside, the colon would show after the name. A colon or
# comma with no space after it is the name's own ("1,024 tokens", "10:30 UTC").
EDGE_BRACKETS = re.compile(r"^([\s)\]]*(?:[0-9\u06f0-\u06f9]*[:;,]\s+)?)(.*?)"
                           r"((?:\s*[(\[][0-9.,\u06f0-\u06f9\u066b\u066c]*)?[\s(\[:;,]*)$", re.S)


def persian_cell(text: str, words: dict[str, str] | None = None) -> str:
    """One table cell as the Persian edition shows it, as HTML: a number with the digits and
    notation pandas gave the English table (`language.table_number_text`: Persian digits, «٫»,
    «−», «۳٫۸۱۴۶۹۷ × ۱۰⁻⁶» for "3.814697e-06", isolated where it holds a sign or a power),
    True/False as بله/خیر and None as «—», an English value the lesson's `words` know (alone, numbered
    as "block 3", or in a list "embedding, block 0") in Persian, a tuple or list of numbers with
    the Persian comma, and else its free numbers in Persian digits and its Latin names (ZeRO-1,
    .step-00000002.tmp) isolated left to right; a `name` in backticks (in a label of `words`
    too) is code: <code>name</code>."""
    stripped = text.strip()
    words = words or {}
    if not stripped:
        return html.escape(text, quote=False)
    if stripped in BOOLEANS:
        return BOOLEANS[stripped]
    if NUMBER.fullmatch(stripped):
        return language.table_number_text(stripped, html=True)
    known = _known(stripped, words)
    if known is not None:
        return _with_code(known)
    if SEQUENCE.fullmatch(stripped) and NUMBER.search(stripped):
        items = [item.strip() for item in stripped[1:-1].split(",") if item.strip()]
        if all(NUMBER.fullmatch(item) for item in items):
            shown = f"{language.PERSIAN_COMMA} ".join(
                language.table_number_text(item, html=True) for item in items)
            return f"{stripped[0]}{shown}{stripped[-1]}"
    return _with_code(stripped) if "`" in stripped else _isolated_latin(stripped)


def _with_code(text: str) -> str:
    """`text` as HTML, each `name` in backticks as <code>name</code> (code font, left to right),
    the rest with its Latin names isolated."""
    pieces = text.split("`")
    if len(pieces) % 2 == 0:  # an unmatched backtick: no code in it
        return _isolated_latin(text)
    return "".join(f"<code>{html.escape(piece, quote=False)}</code>" if index % 2
                   else _isolated_latin(piece) if piece.strip() else html.escape(piece, quote=False)
                   for index, piece in enumerate(pieces))


def _known(text: str, words: dict[str, str]) -> str | None:
    """`text` in Persian when `words` know it: a word, a numbered word, or a list of them."""
    if text in words:
        return words[text]
    items = [item.strip() for item in text.split(", ")]
    shown = [translate_label(item, words) for item in items]
    if all(a != b for a, b in zip(items, shown)):
        return f"{language.PERSIAN_COMMA} ".join(shown)
    return None


def _persian_digits(text: str) -> str:
    """`text` with its free numbers written as the Persian edition writes them."""
    return FREE_NUMBER.sub(lambda m: number(m.group(), "fa"), text)


def _isolated_latin(text: str) -> str:
    """`text` as HTML: Latin names isolated left to right (the whole cell when it has no Persian
    letter; a bracket that opens or closes across Persian words left outside), the numbers
    outside them in Persian digits."""
    if not plots.PERSIAN_LETTER.search(text):
        if not plots.LATIN_LETTER.search(text):
            return html.escape(_persian_digits(text), quote=False)
        return f'<bdi dir="ltr">{html.escape(text, quote=False)}</bdi>'
    pieces, last = [], 0
    for run in NOT_PERSIAN_LETTERS.finditer(text):
        pieces.append(html.escape(text[last:run.start()], quote=False))
        before, core, after = EDGE_SPACE.fullmatch(run.group()).groups()
        if plots.LATIN_LETTER.search(core):
            closing, name, opening = EDGE_BRACKETS.fullmatch(core).groups()
            shown = (html.escape(_persian_digits(closing), quote=False)
                     + f'<bdi dir="ltr">{html.escape(name, quote=False)}</bdi>'
                     + html.escape(_persian_digits(opening), quote=False))
        else:
            shown = html.escape(_persian_digits(core), quote=False)
        pieces.append(before + shown + after)
        last = run.end()
    return "".join(pieces) + html.escape(text[last:], quote=False)


def persian_html(table_html: str, words: dict[str, str] | None = None) -> str:
    """pandas' HTML of a table, shown right to left: every cell through `persian_cell`, the
    whole in a <div dir="rtl" lang="fa"> (the first column on the right, mixed headers such as
    "صرفه‌جویی (٪)" in reading order)."""
    head, style_end, body = table_html.partition("</style>")
    if not style_end:
        head, body = "", table_html
    cell = lambda m: ">" + persian_cell(html.unescape(m.group(1)), words) + "<"  # noqa: E731
    body = TEXT_NODE.sub(cell, body)
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
    """A Series of the Persian edition: pandas in every way, shown in HTML as a one-column
    table that runs right to left, its name as the column's heading (no "Name:" or "dtype:"
    lines); `to_frame()` gives a `PersianTable`."""

    _metadata = ["words"]
    words: dict[str, str] = {}

    @property
    def _constructor(self):
        return PersianSeries

    @property
    def _constructor_expanddim(self):
        return PersianTable

    def _repr_html_(self) -> str | None:
        frame = pd.Series(self).to_frame(name="" if self.name is None else self.name)
        table_html = frame._repr_html_()
        return None if table_html is None else persian_html(table_html, self.words)

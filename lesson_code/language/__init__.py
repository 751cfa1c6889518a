"""The reader's language: how the Persian edition writes numbers and fills its sentences.
Standard library only, so that every layer that prints for a reader (the launcher's
errors, the checkpoint's, the figures and tables, the labs and benchmarks) follows one rule.

The rule for a number in Persian text, a table cell or a figure (`number`):

- digits are Persian (۰ to ۹), the decimal mark is «٫» and the thousands mark «٬»;
- a number smaller than 0.001 or from a million up (not a whole number) is written
  «۳٫۸۱ × ۱۰⁻⁶»: three significant digits times a power of ten, as a Persian textbook writes it
  (in HTML the power is raised with <sup>, «۱۰<sup>−۶</sup>»; in plain text it takes Unicode's
  raised digits, ⁻⁶, the only raised digits plain text has);
- a negative number takes the minus sign «−» (U+2212), not the hyphen;
- whatever is a formula (a sign, a power of ten) stands in a left-to-right isolate, so that a
  right-to-left line keeps the minus on its left and the power after the ten: U+2066 ... U+2069
  in plain text, <bdi dir="ltr"> in HTML;
- items of a list or tuple are separated by the Persian comma «،»;
- a code name or a command in a printed line, which the course's strings mark with backticks,
  stands in a left-to-right isolate instead (`isolated_code`): plain text has no Markdown.

A table shows its numbers as pandas writes them for the English table, digit for digit and in
the same notation, only in Persian digits (`table_number_text`): the two editions' tables agree.

    from lesson_code import language
    language.number(3.814697e-06, "fa")         # '\u2066۳٫۸۱ × ۱۰⁻⁶\u2069'
    language.number(0.25, "fa")                 # '۰٫۲۵'
    language.numbered("رتبه", 2)                # 'رتبهٔ ۲'
    language.fill("{n} ranks, {ms:.1f} ms", "fa", n=4, ms=2.25)  # '۴ ranks, ۲٫۲ ms'
"""

from __future__ import annotations

import math
import re
import string

LANGUAGES = ("en", "fa")
PERSIAN_DIGITS = "۰۱۲۳۴۵۶۷۸۹"
TO_PERSIAN = str.maketrans("0123456789", PERSIAN_DIGITS)
RAISED = str.maketrans("0123456789-+", "⁰¹²³⁴⁵⁶⁷⁸⁹⁻⁺")
MINUS = "\u2212"
TIMES = "\u00d7"
DECIMAL_MARK = "\u066b"  # ٫
THOUSANDS_MARK = "\u066c"  # ٬
PERSIAN_COMMA = "\u060c"  # ،
LEFT_TO_RIGHT_ISOLATE, POP_ISOLATE = "\u2066", "\u2069"
# Numbers written plainly: from SMALLEST up to below LARGEST (whole numbers are always plain).
SMALLEST, LARGEST = 1e-3, 1e6
SIGNIFICANT = 3
# A number as Python, pandas or an f-string writes it: sign, digits (maybe grouped by commas),
# decimals, exponent; or nan and inf.
NUMBER_TEXT = re.compile(r"(?P<sign>[-+\u2212]?)(?:(?P<int>\d{1,3}(?:,\d{3})+|\d+)(?:\.(?P<frac>\d*))?"
                         r"(?:[eE](?P<exp>[-+]?\d+))?|(?P<special>nan|NaN|inf|Infinity))(?P<percent>%?)")
NO_VALUE = "—"  # a missing value (NaN) in a Persian table


def check_language(lang: str) -> str:
    """Return `lang` if the course speaks it; raise ValueError naming the choices otherwise."""
    if lang not in LANGUAGES:
        raise ValueError(f"unknown language {lang!r}: use one of {', '.join(LANGUAGES)}")
    return lang


def persian_digits(text: str) -> str:
    """`text` with every Western digit written as a Persian one (nothing else changes)."""
    return str(text).translate(TO_PERSIAN)


def isolated(text: str) -> str:
    """`text` in a left-to-right isolate (U+2066 ... U+2069): a formula or a name that keeps its
    own order inside a right-to-left line."""
    return f"{LEFT_TO_RIGHT_ISOLATE}{text}{POP_ISOLATE}"


CODE_SPAN = re.compile(r"`([^`\n]+)`")  # a name in backticks, as the course's strings mark code


def isolated_code(text: str) -> str:
    """`text` with each `name` in backticks (a code name, a file, a command) in a left-to-right
    isolate instead: a printed line is plain text, where backticks would show as they are, and
    a Latin run inside a right-to-left line must keep its own order («انتخاب ⁦auto⁩ ...»)."""
    return CODE_SPAN.sub(lambda found: isolated(found.group(1)), text)


def number(value, lang: str, spec: str = "", html: bool = False) -> str:
    """`value` (a number) as edition `lang` writes it, after `format(value, spec)`.

    English: `format(value, spec)` as it is. Persian: the module's rule (Persian digits, «٫»,
    «−», «× ۱۰⁻⁶» below 0.001 and from a million up, isolated left to right where it holds a
    sign or a power); `html=True` writes the isolate as <bdi dir="ltr"> and the power with <sup>.
    """
    text = format(value, spec)
    if check_language(lang) == "en":
        return text
    return persian_number_text(text, html=html)


def persian_number_text(text: str, html: bool = False) -> str:
    """The Persian form of a number written the Western way ("3.814697e-06", "-0.41",
    "4,788,224", "12.5%", "nan"), as running text writes it: see the module's rule. A number the
    rule rewrites (with a power of ten) keeps three significant digits and drops its trailing
    zeros («۱٫۹ × ۱۰⁻⁴» for "1.901835e-04"). Raises ValueError for text that is not one number."""
    found = _number_parts(text)
    if found["special"]:
        return _special(found, html)
    negative = found["sign"] in ("-", MINUS) and bool(found["sign"])
    if found["exp"] is not None:
        value = abs(float(f"{found['int'].replace(',', '')}.{found['frac'] or 0}e{found['exp']}"))
        body, power = _scientific(value)
    else:
        whole = found["int"].replace(",", THOUSANDS_MARK)
        body = whole + (DECIMAL_MARK + found["frac"] if found["frac"] is not None else "")
        power = None
        value = abs(float(f"{found['int'].replace(',', '')}.{found['frac'] or 0}"))
        if value and (found["frac"] or "").strip("0") and not SMALLEST <= value < LARGEST:
            body, power = _scientific(value)
    if value == 0:
        negative = False  # -0.0 is 0
    return _persian_form(negative, body, power, bool(found["percent"]), html)


def table_number_text(text: str, html: bool = False) -> str:
    """The Persian form of a number exactly as the English edition's table wrote it: the same
    digits and the same notation, only localised. "1.234568e-07" is «۱٫۲۳۴۵۶۸ × ۱۰⁻⁷»,
    "0.000190" is «۰٫۰۰۰۱۹۰», "-2.500000" is «−۲٫۵۰۰۰۰۰», "NaN" is «—»: pandas already writes a
    column in one notation and precision, so the Persian column shows what the English one shows,
    digit for digit, in Persian digits, «٫», «−» and a raised power of ten; an exact zero
    written with a power of ten ("0.000000e+00") is «۰». Raises ValueError for text that is not
    one number."""
    found = _number_parts(text)
    if found["special"]:
        return _special(found, html)
    if found["exp"] is not None and not (found["int"] + (found["frac"] or "")).strip("0,"):
        return "۰"  # an exact zero in a column of powers of ten: «۰ × ۱۰⁰» says nothing more
    body = found["int"].replace(",", THOUSANDS_MARK) + (
        DECIMAL_MARK + found["frac"] if found["frac"] is not None else "")
    power = int(found["exp"]) if found["exp"] is not None else None
    negative = found["sign"] in ("-", MINUS) and bool(found["sign"])
    return _persian_form(negative, body, power, bool(found["percent"]), html)


def _number_parts(text: str) -> re.Match:
    """`NUMBER_TEXT`'s match of `text`, or ValueError naming the text."""
    found = NUMBER_TEXT.fullmatch(text.strip())
    if not found:
        raise ValueError(f"{text!r} is not a number: pass digits such as 12.5 or 3.8e-06")
    return found


def _special(found: re.Match, html: bool) -> str:
    """NaN as «—» (no value), infinity as «∞», with its sign."""
    shown = NO_VALUE if found["special"].lower() == "nan" else "∞"
    return _wrapped((MINUS if found["sign"] in "-\u2212" and found["sign"] else "") + shown,
                    html, bool(found["sign"]))


def _persian_form(negative: bool, body: str, power: int | None, percent: bool, html: bool) -> str:
    """A number's Western `body` ("1.5" with «٫» and «٬» already in it) and power of ten, written
    in Persian digits with its minus sign, «٪» and raised power, isolated where it holds a sign
    or a power."""
    body = persian_digits(body) + ("٪" if percent else "")
    if power is not None:
        raised = f"<sup>{_signed(power)}</sup>" if html else str(power).translate(RAISED)
        body = f"{body} {TIMES} ۱۰{raised}" if body != "۱" else f"۱۰{raised}"
    return _wrapped((MINUS if negative else "") + body, html, negative or power is not None)


def _scientific(value: float) -> tuple[str, int | None]:
    """(mantissa, power of ten) of a positive `value` by the rule: plain digits (3 significant)
    with no power between SMALLEST and LARGEST, else a mantissa from 1 to 10 and its power;
    trailing zeros dropped."""
    if value == 0:
        return "0", None
    if SMALLEST <= value < LARGEST:
        decimals = max(0, SIGNIFICANT - 1 - math.floor(math.log10(value)))
        return _trimmed(f"{value:.{decimals}f}").replace(".", DECIMAL_MARK), None
    mantissa, power = f"{value:.{SIGNIFICANT - 1}e}".split("e")
    return _trimmed(mantissa).replace(".", DECIMAL_MARK), int(power)


def _trimmed(text: str) -> str:
    """"2.50" -> "2.5", "3.00" -> "3": trailing zeros of the decimals dropped."""
    return text.rstrip("0").rstrip(".") if "." in text else text


def _signed(power: int) -> str:
    """A power of ten in Persian digits with its sign, for HTML's <sup>: "−۶", "۱۲"."""
    return (MINUS if power < 0 else "") + persian_digits(str(abs(power)))


def _wrapped(text: str, html: bool, isolate: bool) -> str:
    """`text` isolated left to right when `isolate`, for HTML or plain text."""
    if not isolate:
        return text
    return f'<bdi dir="ltr">{text}</bdi>' if html else isolated(text)


def listed(items, lang: str) -> str:
    """Items joined as a list of `lang`: "a, b, c" in English, «a، b، c» in Persian."""
    return (", " if check_language(lang) == "en" else f"{PERSIAN_COMMA} ").join(map(str, items))


def series(items, lang: str) -> str:
    """Items listed in a sentence of `lang`: "10, 20" in English; in Persian the last joined with
    «و», «۱۰ و ۲۰» (a، b و c), as Persian prose lists them (`listed` is a table's list)."""
    items = list(items)
    if check_language(lang) == "en" or len(items) < 2:
        return listed(items, lang)
    return f"{listed(items[:-1], lang)} و {items[-1]}"


def numbered(word: str, value, lang: str = "fa") -> str:
    """A word and its number as `lang` writes them: "rank 2"; «رتبهٔ ۲» in Persian, where a word
    that ends in a silent «ه» takes the ezafe «ٔ» before the number (رتبه، مرحله، لایه)."""
    if check_language(lang) == "en":
        return f"{word} {value}"
    shown = number(value, "fa") if isinstance(value, (int, float)) else persian_digits(str(value))
    return f"{word}{'ٔ' if word.endswith('ه') else ''} {shown}"


BOOLEANS = {"en": {True: "True", False: "False"}, "fa": {True: "بله", False: "خیر"}}
# The course's terms as its Persian tables label them (book/fa/glossary.md): English label ->
# Persian. Each lesson's table words (lesson_code.plots) start from these and add their own, so a
# term shared by the lessons is written here once and reads the same in every table.
TERMS = {
    "rank": "رتبه", "step": "گام", "stage": "مرحله", "value": "مقدار", "loss": "زیان",
    "parameters": "پارامترها", "gradients": "گرادیان‌ها", "optimizer": "بهینه‌ساز",
    "forward": "گذر رفت", "backward": "گذر برگشت", "measured": "اندازه‌گیری‌شده", "formula": "فرمول",
    "all_reduce": "کاهش همگانی", "reduce_scatter": "کاهش و پخش", "all_gather": "گردآوری همگانی",
    "reduce-scatter": "کاهش و پخش", "broadcast": "بازپخش", "naive": "ساده‌لوحانه", "ring": "حلقه",
    "messages sent": "پیام‌های فرستاده", "holds": "برقرار است",
}


class _Filler(string.Formatter):
    """str.format for a sentence of `lang`: numbers by the rule, True/False in its words, a list
    of numbers with its comma; anything else as str.format writes it."""

    def __init__(self, lang: str):
        super().__init__()
        self.lang = check_language(lang)

    def format_field(self, value, format_spec: str) -> str:
        if self.lang == "en":
            return format(value, format_spec)
        if isinstance(value, bool):
            return BOOLEANS["fa"][value]
        if isinstance(value, (int, float)):
            return number(value, "fa", format_spec)
        if isinstance(value, (list, tuple)) and value and all(
                isinstance(item, (int, float)) and not isinstance(item, bool) for item in value):
            shown = listed((number(item, "fa", format_spec) for item in value), "fa")
            return f"[{shown}]" if isinstance(value, list) else f"({shown})"
        return format(value, format_spec)


def fill(template: str, lang: str, **values) -> str:
    """`template.format(**values)` as a sentence of `lang`: in Persian, numbers by the course's
    rule (a format spec such as {ms:.1f} still applies), True/False as بله/خیر (yes/no), lists of
    numbers with «،», and the template's `names` isolated left to right (`isolated_code`). In
    English, exactly `template.format(**values)`."""
    if check_language(lang) == "fa":
        template = isolated_code(template)
    return _Filler(lang).format(template, **values)

"""Figures of the course, in the reader's language: draw, never launch ranks.

Each lesson's figures live in a submodule (`plots.collectives` for lesson 76, ...) and take the data
a run measured plus `lang` ("fa" or "en"). A notebook's code cells are identical in both editions,
so they pass `lang=plots.page_language()`, which reads the edition from the folder the notebook
runs in (notebooks/fa or notebooks/en). Persian labels use the bundled Vazirmatn font (OFL); with
matplotlib 3.11 Persian text is shaped and ordered right to left without extra packages.

    from lesson_code import plots
    from lesson_code.plots import collectives as figures76
    figures76.ring_schedule_figure(4, lang=plots.page_language())
"""

from __future__ import annotations

import re
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
from matplotlib import font_manager, ticker, transforms
from matplotlib.figure import Figure
from matplotlib.text import Text

from lesson_code import language
from lesson_code.language import LANGUAGES, check_language

ASSETS = Path(__file__).with_name("assets")
FONT_FAMILY = "Vazirmatn"


def page_language(directory: Path | str | None = None) -> str:
    """"fa" when `directory` (default: the working directory) is notebooks/fa, else "en".

    Jupyter, nbval and the book build all run a notebook in its own folder, so this tells which
    edition is running without a code cell that differs between the editions.
    """
    folder = Path(directory) if directory is not None else Path.cwd()
    return "fa" if folder.name == "fa" else "en"


# Sizes in points for a figure at most FIGURE_WIDTH inches wide: the book shows a figure at the
# column's width, on a phone about 360 CSS pixels, so 11 points in 6.5 inches are 8.5 pixels
# there (tests/unit/test_plots.py checks every word of every figure against that).
FIGURE_WIDTH = 6.5
COURSE_STYLE = {
    "axes.spines.top": False,
    "axes.spines.right": False,
    "font.size": 12,
    "axes.titlesize": 12,
    "axes.labelsize": 12,
    "xtick.labelsize": 11,
    "ytick.labelsize": 11,
    "legend.fontsize": 11,
    "figure.titlesize": 12,
    "figure.dpi": 100,
    "savefig.dpi": 150,
    # SVG with every letter drawn as a path: sharp at any zoom, and the Persian words need no
    # web font; a fixed salt keeps the SVG's ids, hence a re-run's output, the same.
    "svg.fonttype": "path",
    "svg.hashsalt": "lesson_code",
}


def use_course_style() -> None:
    """Register Vazirmatn (Latin and Persian glyphs), make it matplotlib's font, set the course's
    sizes, and, inside IPython, show figures as SVG (no date, so the same figure gives the same
    output).

    Idempotent; called by every figure function before it draws.
    """
    if FONT_FAMILY not in {font.name for font in font_manager.fontManager.ttflist}:
        for path in sorted(ASSETS.glob("Vazirmatn-*.ttf")):
            font_manager.fontManager.addfont(str(path))
    matplotlib.rcParams.update({"font.family": [FONT_FAMILY, "DejaVu Sans"], **COURSE_STYLE})
    _show_figures_as_svg()


def _show_figures_as_svg() -> None:
    """Make the running IPython kernel (if any) display figures as SVG instead of PNG."""
    try:
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()
    if shell is None or not hasattr(shell, "display_formatter"):
        return
    from matplotlib_inline.backend_inline import set_matplotlib_formats
    set_matplotlib_formats("svg", metadata={"Date": None})


RIGHT_TO_LEFT_MARK = "\u200f"
DIGITS = {"fa": str.maketrans("0123456789.", "۰۱۲۳۴۵۶۷۸۹٫")}
PERSIAN_LETTER = re.compile(r"[\u0600-\u065f\u066e-\u06ef\u06fa-\u06ff]")  # not digits
LATIN_LETTER = re.compile(r"[A-Za-z]")
# A number in running text; not the digits of a name such as ZeRO-1, 1F1B or fp32.
FREE_NUMBER = re.compile(r"(?<![A-Za-z_\-])\d+(?:\.\d+)?(?![A-Za-z_\d])")
# A formula or a name in Latin letters, "(P − 1)/(m + P − 1)" or "12P/N": its digits stay Latin,
# so that it stays one left-to-right run (a Persian digit inside would split it and reorder it).
# In a Persian label it stands in a left-to-right isolate (U+2066 ... U+2069), which libraqm
# honours: "(P − 1)/(m + P − 1)، P = ۲" would otherwise show as (m + P − 1)/(P − 1).
LATIN_SPAN = re.compile(r"\(?(?:[A-Za-zα-ωµ]|\d+/)[A-Za-z0-9α-ωµ +\-−×/()=.,:^_*]*[A-Za-z0-9α-ωµ)]"
                        r"|\d+[A-Za-z][\w/]*")
ISOLATED = re.compile("(\u2066.*?\u2069)")


def number(value, lang: str) -> str:
    """`value` as text in `lang`'s digits ("۱۲" in Persian, "12" in English): a number by the
    course's rule (`language.number`: 3e-06 is «۳ × ۱۰⁻⁶»), text digit by digit."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return language.number(value, lang)
    return str(value).translate(DIGITS.get(check_language(lang), {}))


def persian_text(text: str) -> str:
    """`text` as a Persian figure shows it: numbers in Persian digits (names such as ZeRO-1 kept),
    and, when it holds Persian words, a right-to-left mark first, so that a label that starts
    with a Latin word still reads right to left. Latin-only text and mathtext stay as they are."""
    text = str(text)
    if not text or "$" in text:
        return text
    if PERSIAN_LETTER.search(text):
        text = "".join(piece if ISOLATED.fullmatch(piece) else _persian_piece(piece)
                       for piece in ISOLATED.split(text))
        return text if text.startswith(RIGHT_TO_LEFT_MARK) else RIGHT_TO_LEFT_MARK + text
    if not LATIN_LETTER.search(text):  # a number, a tick label: 12, 0.5, −3, 0123
        return number(text, "fa")
    return text


def _persian_piece(text: str) -> str:
    """Persian digits in `text`, and each Latin formula or name in it isolated left to right."""
    pieces = []
    for index, piece in enumerate(split_latin(text)):
        if index % 2:
            pieces.append(f"\u2066{piece}\u2069" if not piece.isalpha() or " " in piece else piece)
        else:
            pieces.append(FREE_NUMBER.sub(lambda m: number(m.group(), "fa"), piece))
    return "".join(pieces)


def split_latin(text: str) -> list[str]:
    """`text` cut into [other, Latin span, other, Latin span, ..., other]: the Latin names and
    formulas of a Persian label or table cell, which keep their own direction and digits."""
    pieces, last = [], 0
    for match in LATIN_SPAN.finditer(text):
        pieces += [text[last:match.start()], match.group()]
        last = match.end()
    return pieces + [text[last:]]


def _binary_size(value: float) -> str | None:
    """1024 -> "۱ KiB", 65536 -> "۶۴ KiB": multiples of a binary unit of bytes, or None."""
    for power, unit in ((40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")):
        if value >= 2 ** power and (value / 2 ** power).is_integer():
            return f"{number(f'{value / 2 ** power:g}', 'fa')} {unit}"
    return None


class PersianTicks(ticker.Formatter):
    """Wraps an axis's formatter: its labels in Persian digits. Mathtext powers (2^10, 10^-3),
    whose font has no Persian digits, become plain numbers (64 KiB, 0.001)."""

    def __init__(self, inner: ticker.Formatter):
        self.inner = inner

    def set_axis(self, axis):
        super().set_axis(axis)
        self.inner.set_axis(axis)

    def set_locs(self, locs):
        super().set_locs(locs)
        self.inner.set_locs(locs)

    def __call__(self, x, pos=None):
        text = str(self.inner(x, pos))
        if "$" in text:
            scale = self.axis.get_scale() if self.axis is not None else ""
            text = (scale == "log" and getattr(self.inner, "_base", 10) == 2 and _binary_size(x)) \
                or language.number(x, "fa", "g")
        return persian_text(text)


class CourseFigure(Figure):
    """A figure in one edition's language: in Persian, every label, tick and legend entry is
    made Persian (`persian_text`) just before it is drawn, whatever drew it."""

    lang = "en"

    def draw(self, renderer):
        if self.lang == "fa":
            _make_persian(self)
        return super().draw(renderer)


def _make_persian(fig: Figure) -> None:
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            for get, set_ in ((axis.get_major_formatter, axis.set_major_formatter),
                              (axis.get_minor_formatter, axis.set_minor_formatter)):
                if not isinstance(get(), PersianTicks):
                    set_(PersianTicks(get()))
    for text in fig.findobj(Text):
        shown = persian_text(text.get_text())
        if shown != text.get_text():
            text.set_text(shown)


def start_figure(labels: dict[str, dict[str, str]], lang: str, *grid, **subplots_options):
    """(this language's labels, figure, axes): what every figure function begins with.

    Checks `lang`, applies the course style and calls `plt.subplots(*grid, **subplots_options)`.
    The figure is a `CourseFigure`: in Persian its words get Persian digits and a right-to-left
    mark when drawn (matplotlib orders a label's words by the direction of its first letter, so
    "Adam ..." in a Persian title would otherwise stand at its left end).
    """
    chosen = labels[check_language(lang)]
    if lang == "fa":
        chosen = {key: RIGHT_TO_LEFT_MARK + text if isinstance(text, str) else text
                  for key, text in chosen.items()}
    use_course_style()
    fig, axes = plt.subplots(*grid, FigureClass=CourseFigure, **subplots_options)
    fig.lang = lang
    return chosen, fig, axes


def legend(ax, **options):
    """`ax.legend(**options)`, with each key's marker right of its words in a Persian figure."""
    persian = getattr(ax.figure, "lang", "en") == "fa"
    return ax.legend(**{"markerfirst": not persian, **options})


def legend_below(ax, ncol: int = 2, below: float = 0.7, **options):
    """The legend under the axes, `below` inches under their bottom edge (past the tick labels
    and the x label, whatever size the layout gives the axes), so it never covers a bar or a
    line."""
    under = ax.transAxes + transforms.ScaledTranslation(0, -below, ax.figure.dpi_scale_trans)
    return legend(ax, **{"loc": "upper center", "bbox_to_anchor": (0.5, 0),
                         "bbox_transform": under, "ncol": ncol, **options})


def label_ranks(fig, ax, ranks: list[int], labels: dict[str, str], ylabel: str, lang: str):
    """Finish a bar chart with a bar per rank: rank ticks, the y label, legend, layout."""
    ax.set_xticks(ranks, [language.numbered(labels["rank"], r, lang) for r in ranks])
    ax.set_ylabel(ylabel)
    legend_below(ax, below=0.45)  # no x label: the rank names are the ticks
    fig.tight_layout()
    return fig

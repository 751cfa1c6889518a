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

from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
from matplotlib import font_manager

LANGUAGES = ("en", "fa")
ASSETS = Path(__file__).with_name("assets")
FONT_FAMILY = "Vazirmatn"


def page_language(directory: Path | str | None = None) -> str:
    """"fa" when `directory` (default: the working directory) is notebooks/fa, else "en".

    Jupyter, nbval and the book build all run a notebook in its own folder, so this tells which
    edition is running without a code cell that differs between the editions.
    """
    folder = Path(directory) if directory is not None else Path.cwd()
    return "fa" if folder.name == "fa" else "en"


def check_language(lang: str) -> str:
    """Return `lang` if supported; raise ValueError naming the choices otherwise."""
    if lang not in LANGUAGES:
        raise ValueError(f"unknown language {lang!r}: use one of {', '.join(LANGUAGES)}")
    return lang


def use_course_style() -> None:
    """Register Vazirmatn (Latin and Persian glyphs) and make it matplotlib's font.

    Idempotent; called by every figure function before it draws.
    """
    if FONT_FAMILY not in {font.name for font in font_manager.fontManager.ttflist}:
        for path in sorted(ASSETS.glob("Vazirmatn-*.ttf")):
            font_manager.fontManager.addfont(str(path))
    matplotlib.rcParams.update({
        "font.family": [FONT_FAMILY, "DejaVu Sans"],
        "axes.spines.top": False,
        "axes.spines.right": False,
        "figure.dpi": 100,
        "savefig.dpi": 120,
    })


RIGHT_TO_LEFT_MARK = "\u200f"
DIGITS = {"fa": str.maketrans("0123456789.", "۰۱۲۳۴۵۶۷۸۹٫")}


def number(value, lang: str) -> str:
    """`value` as text in `lang`'s digits ("۱۲" in Persian, "12" in English)."""
    return str(value).translate(DIGITS.get(check_language(lang), {}))


def start_figure(labels: dict[str, dict[str, str]], lang: str, *grid, **subplots_options):
    """(this language's labels, figure, axes): what every figure function begins with.

    Checks `lang`, applies the course style and calls `plt.subplots(*grid, **subplots_options)`.
    Persian labels start with a right-to-left mark: matplotlib orders a label's words by the
    direction of its first letter, so "Adam ..." in a Persian title would stand at its left end.
    """
    chosen = labels[check_language(lang)]
    if lang == "fa":
        chosen = {key: RIGHT_TO_LEFT_MARK + text if isinstance(text, str) else text
                  for key, text in chosen.items()}
    use_course_style()
    fig, axes = plt.subplots(*grid, **subplots_options)
    return chosen, fig, axes


def label_ranks(fig, ax, ranks: list[int], labels: dict[str, str], ylabel: str, lang: str):
    """Finish a bar chart with a bar per rank: rank ticks, the y label, legend, layout."""
    ax.set_xticks(ranks, [f"{labels['rank']} {number(r, lang)}" for r in ranks])
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig

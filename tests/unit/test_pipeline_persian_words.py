"""Lesson 79's Persian edition and its optional pages 79a and 79b say each thing with one word:
the words their figures, tables and prose use are the glossary's, and no word of a page means
two things on it.

The lesson cuts a model at its "cuts" («برش»), so gradient clipping cannot be «برش گرادیان»
there; «رشته» is a thread, so a run of layers is not «رشته‌ای از لایه‌ها»; «رتبه» is a rank, so
ordering things is not «رتبه‌بندی». The figures and tables print Persian units, as the prose
writes them (گیگابایت, میلی‌ثانیه), and the glossary's محک and باکت, never a loan word beside them.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd

from lesson_code.plots import pipeline

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "notebooks" / "fa" / name
         for name in ("79-pipeline.ipynb", "79a-pipeline-production.ipynb", "79b-pipeline-costs.ipynb")]
OFF_PAGE = {  # pattern: (why, the word to use)
    "بنچمارک": ("benchmark", "محک"),
    "سطل": ("bucket", "باکت"),
    r"برش(?: گرادیان| انجام شد| می‌خورد| بخورند)": ("clipping (the page's «برش» is a cut)",
                                                     "بریدن گرادیان"),
    "رتبه‌بندی": ("ordering (reads as something done to ranks)", "بزرگ‌تر یا کوچک‌تر"),
    "رشته‌ای پیوسته": ("a run of layers (a «رشته» is a thread)", "گروهی از لایه‌های پشت سر هم"),
    "رشتهٔ متنی": ("a string (a «رشته» is a thread)", "عبارت متنی"),
    r"(?<![\u0600-\u06ff\u200c])پخش \(broadcast\)": ("broadcast", "بازپخش"),
    "بخش‌بندی‌شده": ("sharded", "شاردشده"),
    "خودِ این درس روی": ("the course's own pipeline (this is lesson 79's)", "این مجموعه"),
}


def off_page_words(text: str) -> list[str]:
    return [f"{found.group()} ({why}; use {word})" for pattern, (why, word) in OFF_PAGE.items()
            for found in re.finditer(pattern, text)]


def test_the_persian_pages_use_one_word_per_meaning():
    found = [f"{page.name} {cell['id']}: {word}" for page in PAGES
             for cell in json.loads(page.read_text())["cells"] if cell["cell_type"] == "markdown"
             for word in off_page_words("".join(cell["source"]))]
    assert not found, found


def test_the_figures_and_tables_print_persian_units_and_the_glossarys_words():
    labels = " ".join(pipeline.LABELS["fa"].values()) + " ".join(pipeline.TABLE_WORDS["fa"].values())
    assert not off_page_words(labels), off_page_words(labels)
    assert not re.search(r"\(ms\)|\bGB\b", labels), labels
    shown = pipeline.table(pd.Series({"model state of one stage of 8": 350.0}, name="GB").to_frame(), "fa")
    assert list(shown.columns) == ["گیگابایت"]
    assert pipeline.LABELS["fa"]["time"] == "زمان (میلی‌ثانیه)"


def test_a_word_off_the_page_is_found_and_the_cut_is_not():
    assert off_page_words("پیش از برش گرادیان و گام بهینه‌ساز") and off_page_words("مثل دستگاه بنچمارک")
    assert off_page_words("در هر گام برش انجام شد") and off_page_words("آن را پخش (broadcast) کند")
    assert off_page_words("آن را بازپخش (broadcast) کند") == []
    assert off_page_words("فقط فعال‌سازی‌های محل برش‌ها جابه‌جا می‌شوند") == []


def test_the_replicas_table_says_peak_memory_as_the_glossary_does():
    # «اوج» is a rate's peak (FLOP/s); a step's peak memory is the glossary's «بیشینهٔ حافظه».
    shown = pipeline.table(pd.DataFrame({"GB on stage 0 at the step's peak, at least": [213.4]}), "fa")
    assert list(shown.columns) == ["گیگابایت روی مرحلهٔ ۰ در بیشینهٔ حافظهٔ گام، دست‌کم"]


def test_the_costly_messages_table_names_its_extra_warmup_level_in_persian():
    # The second index level of lesson 79's costly-messages table is schedule_order's argument:
    # the Persian table says what it is and keeps the name the prose uses.
    index = pd.MultiIndex.from_tuples([("1f1b", 1)], names=["schedule", "extra_warmup"])
    shown = pipeline.table(pd.DataFrame({8: [0.3]}, index=index), "fa")
    assert list(shown.index.names) == ["زمان‌بندی", "گرم‌کردن اضافه (`extra_warmup`)"]


def test_the_bubble_legend_writes_each_formula_with_latin_digits_only():
    # "(P − 1)/(m + P − 1), P = 2": the 1s stay Latin inside the formula, so P's value does too;
    # a Persian ۲ beside a Latin 1 in one entry reads as two scripts of digits.
    figure = pipeline.bubble_figure({2: {1: 0.5, 4: 0.2}, 4: {1: 0.75, 4: 0.45}}, lang="fa",
                                    models={4: {1: 0.75, 4: 0.47}})
    figure.canvas.draw()
    entries = [text.get_text() for text in figure.axes[0].get_legend().get_texts()]
    assert len(entries) == 5 and all(re.search(r"P = [24]\u2069", entry) for entry in entries), entries
    assert not [entry for entry in entries if re.search("[۰-۹]", entry)], entries
    assert sum("(P − 1)/(m + P − 1)" in entry for entry in entries) == 2

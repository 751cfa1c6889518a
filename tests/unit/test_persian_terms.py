"""One term, one word: the Persian words the package, the explorers and the glossary print are the
glossary's, never a variant a reader would take for another term or another meaning.

Each entry of REJECTED is a word the Persian edition once used beside the glossary's (or a word
that reads as something else), with the word to use instead. The scan covers every Persian string
the reader meets: lesson_code (figures, tables, commands, errors, practice mode and its
templates), book/static's explorers and calculator, the glossary, the Persian pages of the book and
every Persian notebook (prose, code comments and stored outputs).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOT_A_LETTER_BEFORE = r"(?<![\u0600-\u06ff\u200c])"
REJECTED = {  # pattern: (what it was used for, the glossary's word)
    "تانسور": ("tensor", "تنسور"),
    "خط[ \u200c]?لوله": ("pipeline", "پایپلاین"),
    "نگهبان": ("guard", "محافظ"),
    NOT_A_LETTER_BEFORE + "خانه": ("time slot", "بازه (بازهٔ زمانی)"),
    "آمیخته": ("mixed precision", "ترکیبی (دقت ترکیبی)"),
    "برخاسته": ("an error raised", "رخ‌داده"),
    "هستهٔ Jupyter": ("kernel", "کرنل"),
    "یک ساعت": ("a clock (reads as one hour)", "زمان‌سنج"),
    "ساده \\(از راه": ("naive", "ساده‌لوحانه"),
    "اندازهٔ جهان": ("world size (a calque)", "تعداد رتبه‌ها"),
    "لایه‌گذاری": ("padding (reads as layering)", "پدینگ"),
    "پوشانده‌شده": ("masked (reads as wrapped: پوشاندن wraps a model)", "ماسک‌شده"),
    "بی‌صدا": ("silently (a calque)", "بی‌هیچ خطا یا هشداری"),
    "رتبه‌بندی": ("rank (reads as a ranking)", "رتبه"),
    "کد عملیاتی": ("production code (reads as opcode)", "پیاده‌سازی‌های عملیاتی"),
    "کاهش وزن": ("weight decay (reads as a reduction of the weights)", "واپاشی وزن"),
}
SOURCES = sorted([*(p for p in (ROOT / "lesson_code").rglob("*") if p.suffix in (".py", ".tmpl")),
                  *(ROOT / "book" / "static").glob("*.js"), *(ROOT / "book" / "fa").glob("*.md"),
                  *(ROOT / "notebooks" / "fa").glob("*.ipynb")])


def rejected_words(text: str) -> list[str]:
    """'word (for what; use: the glossary's word)' for each rejected word in `text`."""
    return [f"{found.group()} ({meaning}; use {word})" for pattern, (meaning, word) in REJECTED.items()
            for found in re.finditer(pattern, text)]


@pytest.mark.parametrize("path", SOURCES, ids=lambda path: str(path.relative_to(ROOT)))
def test_the_persian_words_are_the_glossarys(path):
    found = [f"line {number}: {word}" for number, line in enumerate(path.read_text().splitlines(), 1)
             for word in rejected_words(line)]
    assert not found, f"{path.relative_to(ROOT)}: {found}"


def test_a_rejected_word_is_found_and_a_word_that_contains_it_is_not():
    assert rejected_words("هر رتبه تانسور خودش را دارد") == ["تانسور (tensor; use تنسور)"]
    assert rejected_words("زمان (خانه‌ها: هر گذر رفت ۱)") == ["خانه (time slot; use بازه (بازهٔ زمانی))"]
    assert rejected_words("کتابخانه‌ای که بایت‌ها را جابه‌جا می‌کند") == []
    assert rejected_words("یک گام خط لوله") and rejected_words("خط‌لوله")
    assert rejected_words("رتبه‌بندی ۰") and not rejected_words("رتبهٔ ۰ و رتبه‌ها")

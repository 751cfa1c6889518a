"""Practice mode's Persian: every word Persian but code, Persian digits, the glossary's terms.

The words are read where they are written: the message tables, each lesson's titles and hints,
every `phrase(...)` / `Phrase(...)` of the package's source (prose built inside ranks: cases,
references, what a value is), and the Persian templates. A real Persian report is checked too,
line by line, outside its tracebacks. The terms are checked against book/fa/glossary.md.
"""

import ast
import re
import string
from pathlib import Path

import pytest

from persian_words import foreign_words, glossary_terms, is_persian
from lesson_code.practice import messages
from lesson_code.practice.lessons import LESSONS
from lesson_code.practice.messages import (FAILURES, HEADINGS, Phrase, distinct_numbers, listing,
                                           localized)
from lesson_code.practice.rank_checks import compare, tolerance
from lesson_code.practice.report import format_report
from lesson_code.practice.timing import Timing, timing_line

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "lesson_code" / "practice"
GLOSSARY = ROOT / "book" / "fa" / "glossary.md"

# Each term the messages use, as the glossary writes it (English -> Persian, checked against the
# glossary), with the variants that the glossary replaces and that crept into earlier messages.
TERMS = {
    "reduce-scatter": ("کاهش و پخش", ["پخش-کاهش", "پخش‌کاهش", "پخش کاهش"]),
    "all-gather": ("گردآوری همگانی", [r"گردآوری(?! همگانی|‌شده)"]),
    "all-reduce": ("کاهش همگانی", ["کاهش سراسری"]),
    "built-in": ("توکار", ["داخلی", "نسخه‌های آماده", r"آمادهٔ (torch|PyTorch)"]),
    "layout": ("چینش", ["چیدمان"]),
    "broadcast": ("بازپخش", [r"(?<!باز)(?<!کاهش و )پخش کنید", r"(?<!باز)پخش پارامتر"]),
    "flipped byte": ("بایت وارونه‌شده", [r"بایت وارونه(?!‌شده)"]),
    "collective": ("عملیات جمعی", ["عملیات گروهی"]),
    "wrapper": ("پوشاننده", ["پیچیدن", "می‌پیچد", "پیچیده‌شده"]),
}
# Words of the book that are no glossary entry: tensor is written تنسور (58 times in the Persian
# notebooks, against one تانسور), a seed بذر تصادفی (the notebooks' word), never "given a seed";
# padded is پدینگ‌شده, not the colloquial پدینگ‌خورده, and "a tensor of its own" is تنسوری جداگانه,
# not the calque از آنِ خودش. A check is وارسی, as the pages say (not بررسی, a review), and
# alternating rounds run به‌نوبت, with its half-space.
BOOK_WORDS = {"تنسور": ["تانسور"], "بذر تصادفی": ["بذر بدهید", "بذر دهید", r"بذر(?! تصادفی)"],
              "پدینگ‌شده": ["پدینگ[ ‌]?خورده"], "تنسوری جداگانه": ["از آنِ? خودش"],
              "وارسی": ["بررسی"], "به‌نوبت": ["به نوبت"]}
FORBIDDEN = [variant for _, variants in TERMS.values() for variant in variants] + [
    variant for variants in BOOK_WORDS.values() for variant in variants]


def _fields_removed(text: str) -> str:
    """A format string with each {field} (and {{ }}) taken out: fields are filled in later."""
    return "".join(literal for literal, *_ in string.Formatter().parse(text))


def _package_phrases() -> list[tuple[str, str]]:
    """(where, Persian text) of every phrase(en, fa) or Phrase(en, fa) written in the package."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("phrase", "Phrase")
                    and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)):
                found.append((f"{path.name}:{node.lineno}", node.args[1].value))
    return found


def persian_strings() -> list[tuple[str, str]]:
    """(where, text) of every Persian string practice mode prints."""
    found = [(f"HEADINGS[{key}]", text) for key, text in HEADINGS["fa"].items()]
    found += [(f"FAILURES[{key}]", text) for key, text in FAILURES["fa"].items()]
    for table in ("DIAGNOSES", "SKIPPED", "HANG_HINTS"):
        found += [(f"{table}[{key}]", value.fa) for key, value in getattr(messages, table).items()]
    for number, lesson in LESSONS.items():
        for check in lesson.checks:
            found += [(f"lesson {number} {check.key} title", check.title["fa"]),
                      (f"lesson {number} {check.key} hint", check.hint["fa"])]
    return found + _package_phrases()


def test_the_glossary_gives_the_terms_the_messages_use() -> None:
    glossary = glossary_terms(GLOSSARY)
    for english, (persian, _) in TERMS.items():
        assert glossary.get(english) == persian, english


def test_the_word_checker_finds_what_the_issue_found() -> None:
    # Fragments reported by a learner in earlier Persian reports; each must be caught.
    for line in ("torch.optim.Adam, one process, full batch", "کمتر از not below 0.25",
                 "یک ring (1 x (N-1) chunks)", "ZeroOptimizer.step on MiniGPT",
                 "رتبه‌های [0, 1]", "طول 1001", "پس از backward", "collectiveهای آماده"):
        assert foreign_words(line), line
    for line in ("dist.recv(recv, left, group=group)", "float32، op='avg'", "ZeRO-1 با N-1 گام",
                 "`python -m lesson_code.practice start 76`", "--timeout", "MiniGPT و DDP"):
        assert not foreign_words(line), line


@pytest.mark.parametrize("where, text", persian_strings(),
                         ids=[where for where, _ in persian_strings()])
def test_a_persian_message_has_no_english_word_no_latin_number_and_the_glossary_terms(
        where: str, text: str) -> None:
    words = _fields_removed(text)
    assert [foreign_words(line) for line in words.splitlines() if is_persian(line)
            if foreign_words(line)] == [], where
    assert [variant for variant in FORBIDDEN if re.search(variant, words)] == [], where


@pytest.mark.parametrize("number", sorted(LESSONS))
def test_a_persian_template_uses_the_glossary_terms(number: int) -> None:
    from lesson_code.practice.templates import template_path

    text = template_path(number, "fa").read_text(encoding="utf-8")
    assert [variant for variant in FORBIDDEN if re.search(variant, text)] == []
    latin_terms = [english for english in TERMS if english != "built-in"]
    prose = [line for line in text.splitlines() if is_persian(line)]
    assert [(term, line) for line in prose for term in latin_terms
            if re.search(rf"(?<![\w`]){term}(?![\w`])", re.sub(r"`[^`]*`", "", line))] == []


def test_the_english_and_persian_words_have_the_same_fields() -> None:
    def fields(text: str) -> set[str]:
        return {name for _, name, _, _ in string.Formatter().parse(text) if name}

    assert FAILURES["en"].keys() == FAILURES["fa"].keys()
    assert HEADINGS["en"].keys() == HEADINGS["fa"].keys()
    for table in (FAILURES, HEADINGS):
        for key in table["en"]:
            assert fields(table["en"][key]) == fields(table["fa"][key]), key
    for table in ("DIAGNOSES", "SKIPPED", "HANG_HINTS"):
        for key, value in getattr(messages, table).items():
            assert fields(value.en) == fields(value.fa), (table, key)
    for where, fa in _package_phrases():
        assert fa.count("{") == fa.count("}"), where


def test_numbers_lists_and_phrases_are_written_in_the_readers_language() -> None:
    assert localized([0, 1], "fa") == "[۰، ۱]" and localized([0, 1], "en") == "[0, 1]"
    assert listing([0, 1, 2]).text("fa") == "۰، ۱ و ۲"
    assert listing([3]).text("en") == "3"
    nested = Phrase("{inner}, length {n}", "{inner}، طول {n}",
                    {"inner": Phrase("all {n} ranks", "همهٔ {n} رتبه", {"n": 4}), "n": 1001})
    assert nested.text("fa") == "همهٔ ۴ رتبه، طول ۱۰۰۱"
    got, expected = distinct_numbers(1.2345678, 1.2345679)
    assert localized(got, "en") == "1.2345678" and localized(expected, "en") == "1.2345679"
    assert localized(got, "fa") == "۱٫۲۳۴۵۶۷۸"


def test_the_timing_line_gives_each_side_s_range_and_the_ratio_s_spread() -> None:
    timing = Timing(Phrase("ring_all_reduce", "ring_all_reduce"), 4,
                    (0.010, 0.012, 0.011), (0.011, 0.010, 0.020))
    english = timing_line(timing, "en")
    assert "yours 11 ms (10 to 12)" in english and "the course's 11 ms (10 to 20)" in english
    assert "0.55 to 1.2 times" in english and "median 0.91" in english
    persian = timing_line(timing, "fa")
    assert "۰٫۵۵ تا ۱٫۲ برابر" in persian and "(میانه ۰٫۹۱)" in persian
    assert foreign_words(persian) == []


def test_a_real_persian_report_reads_in_persian_outside_its_tracebacks() -> None:
    from lesson_code.practice.grading import CheckResult, Failure
    from lesson_code.practice.hangs import Frame, Hang

    checks = LESSONS["76"].checks
    hang = Hang({0: (Frame("_step", "mine.py", 20, True, "dist.recv(recv, left)"),
                     Frame("ring_all_reduce", "mine.py", 45, True))}, (1,), "left")
    results = [
        CheckResult(checks[0], 1, None, 1.0),
        CheckResult(checks[1], 2, Failure("timeout", {"case": messages.every_rank(2),
                                                      "ranks": listing([0]), "seconds": 60.0},
                                          hang=hang, hint=messages.HANG_HINTS["left"].with_fields(
                                              returned=listing([1]))), 60.0),
        CheckResult(checks[2], 3, Failure("mismatch", {
            "case": messages.every_rank(3), "rank": 2, "reference": "dist.all_reduce",
            "index": 17, "element_of": messages.phrase("the result, flattened", "نتیجهٔ تخت‌شده"),
            "got": 3.0, "expected": 1.0, "tolerance": tolerance(2.0, 1e-6)},
            diagnosis=messages.DIAGNOSES["times_n"].with_fields(n=3)),
            2.0),
        CheckResult(checks[3], 4, None, 0.0, messages.SKIPPED["hang_via"].with_fields(
            name="ring_reduce_scatter", function="_step", number=2)),
    ]
    report = format_report(76, "mine.py", results, "fa")
    assert "رتبه‌های ۱ پیش‌تر برگشته بودند" in report or "رتبه‌های ۱" in report
    for line in report.splitlines():
        if is_persian(line):
            assert foreign_words(line) == [], line


def test_a_persian_report_isolates_code_names_where_the_english_one_has_backticks() -> None:
    from lesson_code.practice.grading import CheckResult, Failure

    backticked = 0
    for lesson in LESSONS.values():
        results = [CheckResult(check, index + 1, Failure("missing", {"name": "f"}), 1.0)
                   for index, check in enumerate(lesson.checks)]
        persian = format_report(lesson.number, "mine.py", results, "fa")
        assert "`" not in persian, lesson.number
        backticked += "`" in format_report(lesson.number, "mine.py", results, "en")
    assert backticked  # the English reports keep their backticks
    hint = messages.plain("از قالب شروع کنید (`python -m lesson_code.practice start 76`)", "fa")
    assert hint == "از قالب شروع کنید (\u2066python -m lesson_code.practice start 76\u2069)"


def test_a_mismatch_names_the_element_in_plain_numbers_and_the_tolerance_it_broke() -> None:
    import torch

    from lesson_code.models import MLP
    from lesson_code.practice.lessons.ddp import FLAT_PARAMETERS
    from lesson_code.practice.lessons.ddp_support import parameter_at

    model = MLP()
    expected = torch.nn.utils.parameters_to_vector(model.parameters()).detach()
    got = expected.clone()
    got[64 * 32 + 64 + 5] += 1e-4  # layers.2.weight, row 0, column 5
    where = {"case": messages.every_rank(4), "case_index": 0, "rank": 1,
             "reference": "torch.optim.Adam", "element_of": parameter_at(model, FLAT_PARAMETERS)}
    failure = compare(got, expected, torch.full_like(expected, 1e-5, dtype=torch.float64), **where)
    english = messages.failure_sentence(failure.kind, failure.fields, "en")
    assert "at layers.2.weight[0, 5]: got " in english, english
    assert english.endswith("they differ by 0.0001, more than the 1e-05 allowed"), english
    persian = messages.failure_sentence(failure.kind, failure.fields, "fa")
    assert "در \u2066layers.2.weight[0, 5]\u2069" in persian, persian  # code, isolated
    # below 0.001, a power of ten, isolated left to right (lesson_code.language's rule)
    assert persian.endswith("اختلافشان \u2066۱۰⁻⁴\u2069 است، بیش از \u2066۱۰⁻⁵\u2069 که مجاز است"), persian
    assert foreign_words(persian) == [], persian
    exact = compare(got, expected, None, **where)
    assert messages.failure_sentence(exact.kind, exact.fields, "en").endswith(
        "; they must be exactly equal")
    assert messages.failure_sentence(exact.kind, exact.fields, "fa").endswith(
        "؛ این دو باید دقیقاً برابر باشند")
    got[0] = float("nan")  # outside every bound, though NaN > bound is False
    assert compare(got, expected, torch.full_like(expected, 1.0, dtype=torch.float64),
                   **where).fields["index"] == 0

"""The sample practice reports in the lessons' "Your turn" sections are what practice mode prints.

Each lesson shows the command `python -m lesson_code.practice check NN my_x.py` and, below it, the
report a complete solution gets. That report is rebuilt here from practice mode itself
(`report.format_report` on every check of the lesson passing, in the edition's language): the
title, each check's line and the summary must be the sample's lines exactly. The timing line
holds one run's numbers, so it is compared with practice mode's sentence with its numbers left
open.
"""

from __future__ import annotations

import json
import re
import string
from pathlib import Path

import pytest

from lesson_code.practice import report
from lesson_code.practice.grading import CheckResult
from lesson_code.practice.lessons import lesson
from lesson_code.practice.messages import HEADINGS

pytestmark = pytest.mark.book

ROOT = Path(__file__).resolve().parents[2]
COMMAND = re.compile(r"python -m lesson_code\.practice check (\S+) (\S+)")
SAMPLE = re.compile(r"```text\n(.*?)\n```", re.DOTALL)
LESSONS = ("76", "76a", "77", "78", "78a", "78b", "79", "80", "81")  # every lesson with a sample


def _samples() -> list[tuple[str, str, str, str, str]]:
    """(notebook, language, lesson, file, sample report) for every notebook with a sample."""
    found = []
    for path in sorted(ROOT.glob("notebooks/*/*.ipynb")):
        lang = path.parent.name
        for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
            text = "".join(cell["source"])
            command, sample = COMMAND.search(text), SAMPLE.search(text)
            if (cell["cell_type"] == "markdown" and command and sample
                    and command[1] in LESSONS):
                found.append((f"{lang}/{path.name}", lang, command[1], command[2], sample[1]))
    return found


def _timing_pattern(lang: str) -> re.Pattern:
    """Practice mode's timing sentence in `lang`, any number in place of each field."""
    template = HEADINGS[lang]["timing"]
    parts = []
    for literal, field, _, _ in string.Formatter().parse(template):
        parts.append(re.escape(literal))
        if field is not None:
            parts.append(".+?")
    return re.compile("".join(parts))


SAMPLES = _samples()


def test_every_lesson_with_practice_shows_a_sample_in_both_editions():
    shown = {(lang, number) for _, lang, number, _, _ in SAMPLES}
    assert shown, "no sample report found"
    for _, lang, number, _, _ in SAMPLES:
        assert {("en", number), ("fa", number)} <= shown, (lang, number)


@pytest.mark.parametrize("notebook, lang, number, file_name, sample", SAMPLES,
                         ids=[sample[0] for sample in SAMPLES])
def test_the_sample_report_is_what_practice_mode_prints(notebook, lang, number, file_name,
                                                         sample):
    checks = lesson(number).checks
    results = [CheckResult(check=check, number=index, failure=None, seconds=0.0)
               for index, check in enumerate(checks, start=1)]
    as_typed = int(number) if number.isdigit() else number  # "78a" stays a page's name
    expected = report.format_report(as_typed, file_name, results, lang).split("\n")
    lines = sample.split("\n")
    timing = [line for line in lines if _timing_pattern(lang).fullmatch(line)]
    shown = [line for line in lines if line not in timing]
    # The sample shows the timing line, and the blank line before it, where the report puts it.
    if timing:
        assert lines[-3:-1] == [timing[0], ""] and lines[-4] == "", notebook
        shown = shown[:-2] + shown[-1:]
    assert shown == expected, f"{notebook}: the sample differs from what practice mode prints"

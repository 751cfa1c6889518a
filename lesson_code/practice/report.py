"""The report of a practice check, in the learner's language: one row per check, then details.

Each row says passed or failed, the first failing case and a hint; below the table come the
traceback or output of each failed check (what the learner needs to find the bug), then the
timing of the learner's code against the course's, when the lesson measures one.
"""

from __future__ import annotations

import textwrap

from lesson_code.practice.grading import CheckResult
from lesson_code.practice.messages import failure_sentence, heading, localized

LINE_WIDTH = 92


def format_report(lesson: int, path: str, results: list[CheckResult], lang: str,
                  timing: str | None = None) -> str:
    """The whole report as text: title, table of checks, details of failures, timing, summary."""
    lines = [heading("title", lang, lesson=lesson, path=path), ""]
    lines += _table(results, lang)
    shown = set()
    for result in results:
        if result.failure is not None and result.failure.details not in shown | {""}:
            shown.add(result.failure.details)
            lines += ["", heading("details", lang, title=result.check.title[lang]),
                      textwrap.indent(result.failure.details, "    ")]
    if timing:
        lines += ["", timing]
    failed = sum(not result.passed for result in results)
    lines += ["", heading("summary_fail", lang, failed=failed, total=len(results)) if failed
              else heading("summary_pass", lang, total=len(results))]
    return "\n".join(lines)


def _table(results: list[CheckResult], lang: str) -> list[str]:
    """One block per check: `1. [passed] title`, then the failing case and the hint, indented."""
    lines = []
    for number, result in enumerate(results, start=1):
        verdict = heading("passed" if result.passed else "failed", lang)
        lines.append(f"{localized(number, lang)}. [{verdict}] {result.check.title[lang]}")
        if result.failure is not None:
            sentence = failure_sentence(result.failure.kind, result.failure.fields, lang)
            lines += _labelled(heading("first_failure", lang), sentence)
            lines += _labelled(heading("hint", lang), result.check.hint[lang])
    return lines


def _labelled(label: str, text: str) -> list[str]:
    """`label: text`, wrapped to the terminal's usual width and indented under its check."""
    return ["    " + line for line in textwrap.wrap(f"{label}: {text}", LINE_WIDTH)]

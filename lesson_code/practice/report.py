"""The report of a practice check, in the learner's language: one row per check, then details.

Each row says passed, failed or not run. A failed row gives the first failing case (with what it
most likely means), for a hang where each rank was waiting in the learner's file, and a hint; a
check not run says why, and after a failed first check (the file does not import, or is not this
lesson's) one line stands for all the rest. Below the table come the traceback or output of
each failed check (what the learner needs to find the bug, shown once however many checks it
failed), then the timing of the learner's code against the course's, when it was measured.
"""

from __future__ import annotations

import textwrap

from lesson_code.practice.grading import CheckResult
from lesson_code.practice.hangs import Hang, learner_frames
from lesson_code.practice.messages import (LIST_SEPARATOR, failure_sentence, heading,
                                           lesson_name, listing, localized, plain)

LINE_WIDTH = 92


# What starts a check's line: in Persian a right-to-left mark (U+200F, invisible), so that the
# line, which begins with its number, reads right to left wherever it is shown. The first strong
# letter already decides that, but Chromium (the book, JupyterLab) lays out a line that begins
# with a digit after a blank or left-to-right line as if it ran left to right.
LINE_START = {"en": "", "fa": "\u200f"}


def format_report(lesson: int | str, path: str, results: list[CheckResult], lang: str,
                  timing: str | None = None, only: bool = False) -> str:
    """The whole report as text: title, table of checks, details of failures, timing, summary.

    `only`: the learner asked for one check (`--only`), and the summary speaks of it alone.
    """
    lines = [heading("title", lang, lesson=lesson_name(lesson), path=path), ""]
    lines += _table(results, lang)
    shown = set()
    for result in results:
        if result.failure is not None and result.failure.details not in shown | {""}:
            shown.add(result.failure.details)
            lines += ["", heading("details", lang, title=plain(result.check.title[lang], lang)),
                      textwrap.indent(result.failure.details, "    ")]
    if timing:
        lines += ["", timing]
    return "\n".join(lines + ["", _summary(results, lang, only)])


def _summary(results: list[CheckResult], lang: str, only: bool) -> str:
    failed = sum(result.failure is not None for result in results)
    skipped = sum(result.skipped is not None for result in results)
    if only and len(results) == 1:
        key = "summary_one_pass" if results[0].passed else "summary_one_fail"
        return heading(key, lang, number=results[0].number)
    if skipped:
        return heading("summary_fail_skipped", lang, failed=failed, total=len(results),
                       skipped=skipped)
    if failed:
        return heading("summary_fail", lang, failed=failed, total=len(results))
    return heading("summary_pass", lang, total=len(results))


def _table(results: list[CheckResult], lang: str) -> list[str]:
    """One block per check: `1. [passed] title`, then the failing case and the hint, indented."""
    lines = []
    for index, result in enumerate(results):
        if result.skipped is not None and index and results[index - 1].check.gate:
            rest = results[index:]  # the gate failed: one line stands for every check after it
            lines += _labelled("", heading("gate_skipped", lang, first=rest[0].number,
                                           last=rest[-1].number, reason=result.skipped))
            break
        status = "passed" if result.passed else "skipped" if result.skipped else "failed"
        lines.append(f"{LINE_START[lang]}{localized(result.number, lang)}. [{heading(status, lang)}] "
                     f"{plain(result.check.title[lang], lang)}")
        if result.skipped is not None:
            lines += _labelled(heading("why", lang), result.skipped.text(lang))
        if result.failure is not None:
            failure = result.failure
            lines += _labelled(heading("first_failure", lang), failure_sentence(
                failure.kind, failure.fields, lang, failure.diagnosis))
            if failure.hang is not None:
                lines += _waiting(failure.hang, lang)
            hint = (failure.hint.text(lang) if failure.hint
                    else plain(result.check.hint[lang], lang))
            lines += _labelled(heading("hint", lang), hint)
    return lines


def _waiting(hang: Hang, lang: str) -> list[str]:
    """Where each stuck rank waited: its innermost line of the learner's file, with the source,
    and the learner's calls that led there; ranks stuck alike share one entry."""
    alike: dict[tuple, list[int]] = {}
    for rank, frames in sorted(hang.stuck.items()):
        alike.setdefault(frames, []).append(rank)
    lines = ["    " + heading("waiting", lang)]
    for frames, ranks in alike.items():
        label = heading("waiting_ranks" if len(ranks) == 1 else "waiting_ranks_many", lang,
                        ranks=listing(ranks))
        mine = learner_frames(frames)
        if mine:
            first = mine[0]
            lines.append(f"      {label}: " + heading(
                "waiting_at" if first.source else "waiting_at_no_source", lang, line=first.line,
                file=first.file, function=first.function, source=first.source))
            if len(mine) > 1:
                calls = LIST_SEPARATOR[lang].join(
                    heading("call_at", lang, function=frame.function, line=frame.line)
                    for frame in mine[1:])
                lines.append("        " + heading("called_from", lang, calls=calls))
        elif frames:
            calls = " < ".join(f"{frame.function} ({frame.file}:{frame.line})" for frame in frames)
            lines.append(f"      {label}: " + heading("outside_file", lang, calls=calls))
        else:
            lines.append(f"      {label}: " + heading("no_stack", lang))
    return lines


def _labelled(label: str, text: str) -> list[str]:
    """`label: text` (or `text` alone), wrapped to the terminal's usual width and indented."""
    return ["    " + line for line in textwrap.wrap(f"{label}: {text}" if label else text,
                                                    LINE_WIDTH)]

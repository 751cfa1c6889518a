"""The graded lessons of practice mode: lesson number -> its `grading.Lesson`.

One module per lesson holds its checks, the rank functions they run and its timing; this
registry is the only place that lists them. Lesson 78's optional page, 78a, has one too. It puts the same first check before each lesson's
own (`rank_checks.names_check`): the file imports and defines the template's names, and is not
another lesson's file, which only the registry can tell.
"""

from __future__ import annotations

from dataclasses import replace

from lesson_code.practice.grading import Lesson
from lesson_code.practice.lessons import (capstone_resume, collectives, ddp, pipeline,
                                          sharded_checkpoint, zero, zero3)
from lesson_code.practice.rank_checks import names_check

_OWN = {str(module.LESSON.number): module.LESSON
        for module in (collectives, ddp, zero, zero3, pipeline, sharded_checkpoint,
                       capstone_resume)}

# Keyed by the lesson as typed on the command line: "78", or "78a" for lesson 78's optional page.
LESSONS: dict[str, Lesson] = {
    key: replace(own, checks=(names_check(own.number, own.names, {
        its.number: its.names for other, its in _OWN.items() if other != key}),) + own.checks)
    for key, own in _OWN.items()
}


def lesson(number: int | str) -> Lesson:
    """The practice of lesson `number` (78, "78" or "78a"); ValueError naming the lessons that
    have one."""
    if str(number) not in LESSONS:
        raise ValueError(f"lesson {number} has no practice: choose one of "
                         f"{', '.join(sorted(LESSONS))}")
    return LESSONS[str(number)]

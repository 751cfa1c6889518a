"""The graded lessons of practice mode: lesson number -> its `grading.Lesson`.

One module per lesson holds its checks, the rank functions they run and its timing; this
registry is the only place that lists them. It puts the same first check before each lesson's
own (`rank_checks.names_check`): the file imports and defines the template's names, and is not
another lesson's file, which only the registry can tell.
"""

from __future__ import annotations

from dataclasses import replace

from lesson_code.practice.grading import Lesson
from lesson_code.practice.lessons import (capstone_resume, collectives, ddp, pipeline,
                                          sharded_checkpoint, zero)
from lesson_code.practice.rank_checks import names_check

_OWN = {module.LESSON.number: module.LESSON
        for module in (collectives, ddp, zero, pipeline, sharded_checkpoint, capstone_resume)}

LESSONS: dict[int, Lesson] = {
    number: replace(own, checks=(names_check(number, own.names, {
        other: its.names for other, its in _OWN.items() if other != number}),) + own.checks)
    for number, own in _OWN.items()
}


def lesson(number: int) -> Lesson:
    """The practice of lesson `number`; ValueError naming the lessons that have one."""
    if number not in LESSONS:
        raise ValueError(f"lesson {number} has no practice: choose one of "
                         f"{', '.join(map(str, sorted(LESSONS)))}")
    return LESSONS[number]

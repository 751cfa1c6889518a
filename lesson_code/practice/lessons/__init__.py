"""The graded lessons of practice mode: lesson number -> its `grading.Lesson`.

One module per lesson holds its checks, the rank functions they run and its timing; this
registry is the only place that lists them.
"""

from __future__ import annotations

from lesson_code.practice.grading import Lesson
from lesson_code.practice.lessons import (capstone_resume, collectives, ddp, pipeline,
                                          sharded_checkpoint, zero)

LESSONS: dict[int, Lesson] = {
    module.LESSON.number: module.LESSON
    for module in (collectives, ddp, zero, pipeline, sharded_checkpoint, capstone_resume)
}


def lesson(number: int) -> Lesson:
    """The practice of lesson `number`; ValueError naming the lessons that have one."""
    if number not in LESSONS:
        raise ValueError(f"lesson {number} has no practice: choose one of "
                         f"{', '.join(map(str, sorted(LESSONS)))}")
    return LESSONS[number]

"""Lesson 81's grader: the course's run_rank passes, the template fails, each mistake fails its
check (a loss not averaged over ranks, a resume that rebuilds the optimizer or restarts the data)
and says what differs."""

from pathlib import Path

import pytest

from practice_helpers import (
    SOLUTIONS, assert_course_passes, assert_passes, assert_template_fails, grade, variant,
)
from lesson_code.practice.lessons import lesson

LEARNER = SOLUTIONS / "capstone_resume_learner.py"
CHECK_KEYS = [check.key for check in lesson(81).checks]

# The course's own implementation, as a learner's file.
COURSE_FILLED = 'from lesson_code.capstone import run_rank\n'
LOAD = "        step, position = extra[\"next_step\"], extra[\"data_position\"]\n"

MISTAKES = {  # name: (the check that catches it, replacements, failure kind, what it names)
    "renamed": ("names", [("def run_rank(", "def train_rank(")], "missing", None),
    "this rank's loss": ("losses", [("        loss = global_mean(local.detach())\n",
                                     "        loss = local.item()\n")], "mismatch", None),
    "fresh optimizer": ("resume", [(LOAD, LOAD + "        optimizer = ZeroOptimizer(model, "
                                    "world_size, rank, lr=config.lr)\n")], "resumed", "exp_avg"),
    "data from the start": ("resume", [(LOAD, "        step, position = extra[\"next_step\"], 0\n")],
                            "resumed", "steps and losses"),
}


def test_every_check_has_a_mistake_that_it_catches() -> None:
    assert {check for check, *_ in MISTAKES.values()} == set(CHECK_KEYS)


def test_the_course_implementation_passes_every_check(tmp_path: Path, capsys) -> None:
    assert_course_passes(81, COURSE_FILLED, tmp_path, capsys)


def test_a_learner_style_loop_passes_every_check() -> None:
    assert_passes(81, LEARNER)


def test_the_unfilled_template_fails_every_check_but_names_with_not_implemented(
        tmp_path: Path) -> None:
    assert_template_fails(81, tmp_path)


@pytest.mark.parametrize("mistake", list(MISTAKES))
def test_a_mistake_fails_its_check(mistake: str, tmp_path: Path) -> None:
    key, replacements, kind, named = MISTAKES[mistake]
    path = variant(LEARNER, replacements, tmp_path)
    failure = grade(81, path, keys=(key,))[key].failure
    assert failure is not None, f"the check {key!r} passed a file with the mistake {mistake!r}"
    assert failure.kind == kind, failure
    if named:
        assert named in failure.fields["what"], failure

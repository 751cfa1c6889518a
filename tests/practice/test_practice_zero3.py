"""Lesson 78a's grader: the course's ZeRO-3 gather and free pass, the template fails, each mistake
fails its check."""

from pathlib import Path

import pytest

from practice_helpers import (
    SOLUTIONS, assert_course_passes, assert_mistake_fails, assert_passes, assert_template_fails,
)
from lesson_code.practice.lessons import lesson

LEARNER = SOLUTIONS / "zero3_learner.py"
CHECK_KEYS = [check.key for check in lesson("78a").checks]

# The course's own pieces (lesson_code.zero3's gather, free and hooks, the ring all-gather of
# lesson 76) behind the exercise's names.
COURSE_FILLED = "from lesson_code.practice.lessons.zero3 import CourseUnit as ShardedUnit\n"

MISTAKES = {
    # The class named otherwise than in the template.
    "names": [("class ShardedUnit:", "class ShardedLayer:")],
    # The shard a slice of the buffer, not a clone: free() takes its storage away too.
    "shard": [("self.shard = self.full[start: start + self.shard_numel].clone()",
               "self.shard = self.full[start: start + self.shard_numel]")],
    # Each rank's chunk put in a zero buffer and all-reduced: the right values, twice the bytes.
    "gather": [("        dist.all_gather_single(self.full, self.shard, group=self.group)\n",
                "        self.full.zero_()\n"
                "        start = self.rank * self.shard_numel\n"
                "        self.full[start: start + self.shard_numel] = self.shard\n"
                "        dist.all_reduce(self.full, group=self.group)\n")],
    # No free after forward: every layer stays whole, as with reshard_after_forward=False.
    "forward": [("            self.free()\n            outputs", "            outputs")],
    # No gather before backward: autograd's saved views of the weights point at no bytes.
    "backward": [("                    tensor.register_hook(lambda grad: self.gather())\n",
                  "                    pass\n")],
}
EXPECTED_KIND = {"names": "missing", "shard": "value", "gather": "bytes", "forward": "value",
                 "backward": "raised"}


def test_every_check_has_a_mistake_that_it_catches() -> None:
    assert sorted(MISTAKES) == sorted(CHECK_KEYS) == sorted(EXPECTED_KIND)


def test_the_course_implementation_passes_every_check(tmp_path: Path, capsys) -> None:
    assert_course_passes("78a", COURSE_FILLED, tmp_path, capsys)


def test_a_learner_style_solution_passes_every_check() -> None:
    assert_passes("78a", LEARNER)


def test_the_unfilled_template_fails_with_not_implemented(tmp_path: Path) -> None:
    assert_template_fails("78a", tmp_path)


@pytest.mark.parametrize("key", CHECK_KEYS)
def test_a_mistake_fails_its_check(key: str, tmp_path: Path) -> None:
    assert_mistake_fails("78a", LEARNER, MISTAKES[key], key, EXPECTED_KIND[key], tmp_path)

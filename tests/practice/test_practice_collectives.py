"""Lesson 76's grader: the course's ring passes, the template fails, each mistake fails its check."""

from pathlib import Path

import pytest

from practice_helpers import (
    SOLUTIONS, assert_course_passes, assert_mistake_fails, assert_passes, assert_template_fails,
)
from lesson_code.practice.lessons import lesson

LEARNER = SOLUTIONS / "collectives_learner.py"
CHECK_KEYS = [check.key for check in lesson(76).checks]

# The course's own implementation, as a learner's file.
COURSE_FILLED = ('from lesson_code.collectives.ring import ring_all_gather, ring_all_reduce, '
                 'ring_reduce_scatter\n')

MISTAKES = {
    "names": [("def ring_all_gather(", "def all_gather(")],
    "all_reduce_sum": [("    flat = tensor.view(-1)\n", "    flat = tensor.clone().view(-1)\n"),
                       ("    _all_gather(chunks, rank, size, group, timeout_s)\n    return tensor\n",
                        "    _all_gather(chunks, rank, size, group, timeout_s)\n"
                        "    return flat.view_as(tensor)\n")],
    "all_reduce_avg": [("        own = own / size\n", "        own = own\n")],
    "reduce_scatter": [("torch.tensor_split(tensor.reshape(-1), size)",
                        "torch.chunk(tensor.reshape(-1), size)")],
    "all_gather": [("chunks[(rank - step - 1) % size], group", "chunks[(rank - step + 1) % size], group")],
    "bytes": [("def ring_all_reduce(tensor, op=\"sum\", *, group=None, timeout_s=DEFAULT_WAIT_S):\n",
               "def ring_all_reduce(tensor, op=\"sum\", *, group=None, timeout_s=DEFAULT_WAIT_S):\n"
               "    dist.all_reduce(tensor, group=group)\n"
               "    return tensor.div_(dist.get_world_size(group)) if op == \"avg\" else tensor\n\n\n"
               "def _ring_all_reduce(tensor, op=\"sum\", *, group=None, timeout_s=DEFAULT_WAIT_S):\n")],
}
EXPECTED_KIND = {"names": "missing", "all_reduce_sum": "not_in_place", "all_reduce_avg": "mismatch",
                 "reduce_scatter": "raised", "all_gather": "crashed", "bytes": "bytes"}


def test_every_check_has_a_mistake_that_it_catches() -> None:
    assert sorted(MISTAKES) == sorted(CHECK_KEYS) == sorted(EXPECTED_KIND)


def test_the_course_implementation_passes_every_check(tmp_path: Path, capsys) -> None:
    assert_course_passes(76, COURSE_FILLED, tmp_path, capsys)


def test_a_learner_style_ring_passes_every_check() -> None:
    assert_passes(76, LEARNER)


def test_the_unfilled_template_fails_with_not_implemented(tmp_path: Path) -> None:
    assert_template_fails(76, tmp_path, keys=("all_gather", "bytes"))


@pytest.mark.parametrize("key", CHECK_KEYS)
def test_a_mistake_fails_its_check(key: str, tmp_path: Path) -> None:
    assert_mistake_fails(76, LEARNER, MISTAKES[key], key, EXPECTED_KIND[key], tmp_path)

"""Lesson 77's grader: the course's DDP passes, the template fails, each mistake fails its check."""

from pathlib import Path

import pytest

from practice_helpers import (
    SOLUTIONS, assert_course_passes, assert_mistake_fails, assert_passes, assert_template_fails,
    grade, variant,
)
from lesson_code.practice.lessons import lesson

LEARNER = SOLUTIONS / "ddp_learner.py"
CHECK_KEYS = [check.key for check in lesson(77).checks]

# The course's wrappers, given a Communicator over the learner's group (built-in collectives).
COURSE_FILLED = '''from lesson_code import ddp
from lesson_code.collectives.comm import Communicator


def broadcast_parameters(module, src=0, group=None):
    ddp.broadcast_parameters(module, src, Communicator("builtin", group=group))


class NaiveDDP(ddp.NaiveDDP):
    def __init__(self, module, group=None):
        super().__init__(module, comm=Communicator("builtin", group=group))


class BucketedDDP(ddp.BucketedDDP):
    def __init__(self, module, bucket_cap_mb=25.0, group=None):
        super().__init__(module, bucket_cap_mb, comm=Communicator("builtin", group=group))
'''

MISTAKES = {
    # The class named otherwise than in the template.
    "names": [("class BucketedDDP(", "class BucketDDP(")],
    # The parameter is broadcast into a copy, which is then thrown away.
    "broadcast": [("dist.broadcast(param.data, src, group=group)",
                   "dist.broadcast(param.data.clone(), src, group=group)")],
    # The naive wrapper sums the gradients and forgets to divide.
    "average": [("        param.grad /= dist.get_world_size(self.group)\n", "")],
    # The bucket counters are not reset: only the first backward synchronises.
    "training": [("        self.pending = []\n        self.ready = [0] * len(self.buckets)\n",
                  "        self.pending = []\n")],
    # A bucket is closed only once it has passed the cap, so buckets exceed it.
    "buckets": [("            if current and size + nbytes > cap:\n"
                 "                self.buckets.append(current)\n"
                 "                current, size = [], 0\n"
                 "            current.append(param)\n"
                 "            size += nbytes\n"
                 "        self.buckets.append(current)\n",
                 "            current.append(param)\n"
                 "            size += nbytes\n"
                 "            if size >= cap:\n"
                 "                self.buckets.append(current)\n"
                 "                current, size = [], 0\n"
                 "        if current:\n"
                 "            self.buckets.append(current)\n")],
    # Every bucket is reduced only once the last gradient of backward has arrived.
    "overlap": [("        if self.ready[index] == len(self.buckets[index]):\n"
                 "            bucket = self.buckets[index]\n"
                 "            flat = torch.cat([p.grad.reshape(-1) for p in bucket])\n"
                 "            work = dist.all_reduce(flat, group=self.group, async_op=True)\n"
                 "            self.pending.append((bucket, flat, work))\n",
                 "        if sum(self.ready) == len(self.bucket_of):\n"
                 "            for bucket in self.buckets:\n"
                 "                flat = torch.cat([p.grad.reshape(-1) for p in bucket])\n"
                 "                work = dist.all_reduce(flat, group=self.group, async_op=True)\n"
                 "                self.pending.append((bucket, flat, work))\n")],
}
EXPECTED_KIND = {"names": "missing", "broadcast": "mismatch", "average": "mismatch",
                 "training": "mismatch", "buckets": "value", "overlap": "value"}


def test_every_check_has_a_mistake_that_it_catches() -> None:
    assert sorted(MISTAKES) == sorted(CHECK_KEYS) == sorted(EXPECTED_KIND)


def test_the_course_implementation_passes_every_check(tmp_path: Path, capsys) -> None:
    assert_course_passes(77, COURSE_FILLED, tmp_path, capsys)


def test_a_learner_style_solution_passes_every_check() -> None:
    assert_passes(77, LEARNER)


def test_the_unfilled_template_fails_with_not_implemented(tmp_path: Path) -> None:
    assert_template_fails(77, tmp_path)


@pytest.mark.parametrize("key", CHECK_KEYS)
def test_a_mistake_fails_its_check(key: str, tmp_path: Path) -> None:
    assert_mistake_fails(77, LEARNER, MISTAKES[key], key, EXPECTED_KIND[key], tmp_path)


def test_gradients_summed_and_not_averaged_are_diagnosed(tmp_path: Path) -> None:
    failure = grade(77, variant(LEARNER, MISTAKES["average"], tmp_path),
                    keys=("average",))["average"].failure
    assert failure.diagnosis is not None and "exactly 3 times" in failure.diagnosis.text("en")
    assert failure.fields["element_of"].text("en").startswith(
        "the gradients, concatenated in parameter order, at ")

"""Lesson 77's grader: the course's DDP passes, the template fails, each mistake fails its check."""

from pathlib import Path

import pytest

from practice_helpers import SOLUTIONS, grade, variant
from lesson_code.practice.cli import main
from lesson_code.practice.lessons import lesson
from lesson_code.practice.templates import write_template

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
    path = tmp_path / "course_filled.py"
    path.write_text(COURSE_FILLED)
    assert main(["check", "77", str(path)]) == 0
    report = capsys.readouterr().out
    assert f"All {len(CHECK_KEYS)} checks passed." in report and "FAILED" not in report
    assert "the course's" in report  # the timing line, printed once every check passed


def test_a_learner_style_solution_passes_every_check() -> None:
    results = grade(77, LEARNER)
    assert {key: result.failure for key, result in results.items() if not result.passed} == {}


def test_the_unfilled_template_fails_with_not_implemented(tmp_path: Path) -> None:
    path = write_template(77, "en", tmp_path / "mine.py")
    results = grade(77, path)
    assert results["names"].passed
    for key in CHECK_KEYS[1:]:
        failure = results[key].failure
        assert failure.kind == "raised" and "NotImplementedError" in failure.fields["error"], key
        assert "mine.py" in failure.details


@pytest.mark.parametrize("key", CHECK_KEYS)
def test_a_mistake_fails_its_check(key: str, tmp_path: Path) -> None:
    path = variant(LEARNER, MISTAKES[key], tmp_path)
    failure = grade(77, path, keys=(key,))[key].failure
    assert failure is not None, f"the check {key!r} passed a file with its mistake"
    assert failure.kind == EXPECTED_KIND[key], failure

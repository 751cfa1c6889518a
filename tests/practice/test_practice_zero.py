"""Lesson 78's grader: the course's ZeRO-1 passes, the template fails, each mistake fails its
check."""

from pathlib import Path

import pytest

from practice_helpers import (
    SOLUTIONS, assert_course_passes, assert_mistake_fails, assert_passes, assert_template_fails,
)
from lesson_code.practice.lessons import lesson

LEARNER = SOLUTIONS / "zero_learner.py"
CHECK_KEYS = [check.key for check in lesson(78).checks]

# The course's optimizer, its collectives lesson 76's rings over the learner's group.
COURSE_FILLED = '''from lesson_code import zero
from lesson_code.collectives.comm import Communicator

flatten_params = zero.flatten_params
unflatten_into = zero.unflatten_into


class ZeroOptimizer(zero.ZeroOptimizer):
    def __init__(self, model, world_size, rank, lr, betas=(0.9, 0.999), eps=1e-8, group=None):
        super().__init__(model, world_size, rank, lr, betas, eps,
                         comm=Communicator("ring", group=group, algorithm="ring"))
'''

MISTAKES = {
    # The function named otherwise than in the template.
    "names": [("def unflatten_into(", "def unflatten(")],
    # torch's vector_to_parameters: the parameters become views of the vector, in its dtype.
    "flatten": [("    offset = 0\n"
                 "    with torch.no_grad():\n"
                 "        for param in module.parameters():\n"
                 "            param.copy_(flat[offset: offset + param.numel()].view_as(param))\n"
                 "            offset += param.numel()\n",
                 "    torch.nn.utils.vector_to_parameters(flat, module.parameters())\n")],
    # Adam without the bias correction of its first moment.
    "training": [("m_hat = self.exp_avg / (1 - beta1 ** self.step_count)",
                  "m_hat = self.exp_avg")],
    # The master copy kept in the model's dtype (bfloat16), not in float32.
    "bfloat16": [("torch.cat([flatten_params(model).float(), torch.zeros(self.padding)])",
                  "torch.cat([flatten_params(model), torch.zeros(self.padding, "
                  "dtype=self.params[0].dtype)])")],
    # The master shard a view of the whole padded vector: its storage stays whole.
    "memory": [("self.master = flat[start: start + self.shard_numel].clone()",
                "self.master = flat[start: start + self.shard_numel]")],
    # An all-reduce of the whole gradient, then a slice: half as much traffic again.
    "bytes": [("        shard = grads.new_empty(self.shard_numel)\n"
               "        dist.reduce_scatter_single(shard, grads, group=self.group)\n",
               "        dist.all_reduce(grads, group=self.group)\n"
               "        start = self.rank * self.shard_numel\n"
               "        shard = grads[start: start + self.shard_numel]\n")],
}
EXPECTED_KIND = {"names": "missing", "flatten": "mismatch", "training": "mismatch",
                 "bfloat16": "value", "memory": "value", "bytes": "bytes"}


def test_every_check_has_a_mistake_that_it_catches() -> None:
    assert sorted(MISTAKES) == sorted(CHECK_KEYS) == sorted(EXPECTED_KIND)


def test_the_course_implementation_passes_every_check(tmp_path: Path, capsys) -> None:
    assert_course_passes(78, COURSE_FILLED, tmp_path, capsys)


def test_a_learner_style_solution_passes_every_check() -> None:
    assert_passes(78, LEARNER)


def test_the_unfilled_template_fails_with_not_implemented(tmp_path: Path) -> None:
    assert_template_fails(78, tmp_path)


@pytest.mark.parametrize("key", CHECK_KEYS)
def test_a_mistake_fails_its_check(key: str, tmp_path: Path) -> None:
    assert_mistake_fails(78, LEARNER, MISTAKES[key], key, EXPECTED_KIND[key], tmp_path)

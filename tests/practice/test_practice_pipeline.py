"""Lesson 79's grader: the course's pipeline passes, the template fails, each mistake fails its check."""

from pathlib import Path

import pytest

from practice_helpers import (
    SOLUTIONS, assert_course_passes, assert_mistake_fails, assert_passes, assert_template_fails,
    grade, variant,
)
from lesson_code.practice.lessons import lesson

LEARNER = SOLUTIONS / "pipeline_learner.py"
CHECK_KEYS = [check.key for check in lesson(79).checks]

COURSE_FILLED = '''\
from lesson_code.pipeline import PipelineStage, schedule_order


def pipelined_step(layers, loss_fn, inputs, targets, micro_batches, schedule, activation_shape,
                   *, group=None, timeout_s=30.0):
    stage = PipelineStage(layers, group, loss_fn)
    return stage.train_step(inputs, targets, micro_batches, schedule).loss
'''

MISTAKES = {
    "names": [("def pipelined_step(", "def pipeline_step(")],
    # GPipe's backwards run last micro-batch first
    "schedule_gpipe": [('+ [("B", i) for i in range(m)]', '+ [("B", i) for i in reversed(range(m))]')],
    # one warm-up forward too many
    "schedule_1f1b": [("warmup = min(num_stages - stage - 1, m)", "warmup = min(num_stages - stage, m)")],
    # a stage outside 0..P-1 is not refused
    "schedule_errors": [('    if not 0 <= stage < num_stages:\n'
                         '        raise ValueError(f"stage {stage!r} is not in 0..{num_stages - 1}")\n',
                         "")],
    # each micro-batch's loss is not divided by m: gradients m times too large
    "gradients": [("out = loss_fn(out, ys[i]) / micro_batches", "out = loss_fn(out, ys[i])")],
    # the step always runs GPipe, whatever schedule it is given
    "order": [("order = schedule_order(schedule, stage,", 'order = schedule_order("gpipe", stage,')],
    # activations sent in float64 "to be safe": twice the bytes forward
    "bytes": [("send(out.detach(), stage + 1)", "send(out.detach().double(), stage + 1)"),
              ("receive(torch.float32, stage - 1).requires_grad_()",
               "receive(torch.float64, stage - 1).float().requires_grad_()")],
}
EXPECTED_KIND = {"names": "missing", "schedule_gpipe": "order", "schedule_1f1b": "value",
                 "schedule_errors": "not_raised", "gradients": "value", "order": "order",
                 "bytes": "bytes"}


def test_every_check_has_a_mistake_that_it_catches() -> None:
    assert sorted(MISTAKES) == sorted(CHECK_KEYS) == sorted(EXPECTED_KIND)


def test_the_course_implementation_passes_every_check(tmp_path: Path, capsys) -> None:
    assert_course_passes(79, COURSE_FILLED, tmp_path, capsys)


def test_a_learner_style_pipeline_passes_every_check() -> None:
    assert_passes(79, LEARNER)


def test_the_unfilled_template_fails_every_check_but_names(tmp_path: Path) -> None:
    assert_template_fails(79, tmp_path)


@pytest.mark.parametrize("key", CHECK_KEYS)
def test_a_mistake_fails_its_check(key: str, tmp_path: Path) -> None:
    assert_mistake_fails(79, LEARNER, MISTAKES[key], key, EXPECTED_KIND[key], tmp_path)


def test_gradients_zeroed_inside_the_step_fail_the_gradient_check(tmp_path: Path) -> None:
    # The loss of the last step is right; the gradients of two steps no longer add up.
    path = variant(LEARNER, [("    stored, sends, total = {}, [], 0.0\n",
                              "    layers.zero_grad()\n    stored, sends, total = {}, [], 0.0\n")],
                   tmp_path)
    failure = grade(79, path, keys=("gradients",))["gradients"].failure
    assert failure is not None and failure.kind == "mismatch", failure
    assert "2 steps without zero_grad" in failure.fields["case"].text("en")

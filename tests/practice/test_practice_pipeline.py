"""Lesson 79's grader: the course's pipeline passes, the template fails, each mistake fails its check."""

from pathlib import Path

import pytest

from practice_helpers import SOLUTIONS, grade, variant
from lesson_code.practice.cli import main
from lesson_code.practice.lessons import lesson
from lesson_code.practice.templates import write_template

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
    path = tmp_path / "course_filled.py"
    path.write_text(COURSE_FILLED)
    assert main(["check", "79", str(path)]) == 0
    report = capsys.readouterr().out
    assert f"All {len(CHECK_KEYS)} checks passed." in report and "FAILED" not in report
    assert "the course's" in report  # the timing line, printed once every check passed


def test_a_learner_style_pipeline_passes_every_check() -> None:
    results = grade(79, LEARNER)
    assert {key: result.failure for key, result in results.items() if not result.passed} == {}


def test_the_unfilled_template_fails_every_check_but_names(tmp_path: Path) -> None:
    path = write_template(79, "en", tmp_path / "mine.py")
    results = grade(79, path)
    assert results["names"].passed
    for key in CHECK_KEYS[1:]:
        failure = results[key].failure
        assert failure.kind == "raised" and "NotImplementedError" in failure.fields["error"], key
        assert "mine.py" in failure.details


@pytest.mark.parametrize("key", CHECK_KEYS)
def test_a_mistake_fails_its_check(key: str, tmp_path: Path) -> None:
    path = variant(LEARNER, MISTAKES[key], tmp_path)
    failure = grade(79, path, keys=(key,))[key].failure
    assert failure is not None, f"the check {key!r} passed a file with its mistake"
    assert failure.kind == EXPECTED_KIND[key], failure


def test_gradients_zeroed_inside_the_step_fail_the_gradient_check(tmp_path: Path) -> None:
    # The loss of the last step is right; the gradients of two steps no longer add up.
    path = variant(LEARNER, [("    stored, sends, total = {}, [], 0.0\n",
                              "    layers.zero_grad()\n    stored, sends, total = {}, [], 0.0\n")],
                   tmp_path)
    failure = grade(79, path, keys=("gradients",))["gradients"].failure
    assert failure is not None and failure.kind == "mismatch", failure
    assert "2 steps without zero_grad" in failure.fields["case"]

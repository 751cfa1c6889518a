"""Lesson 76's grader: the course's ring passes, the template fails, each mistake fails its check;
sub-groups, integers and the diagnoses of two common mistakes."""

from pathlib import Path

import pytest

from persian_words import foreign_words
from practice_helpers import (
    SOLUTIONS, assert_course_passes, assert_mistake_fails, assert_passes, assert_template_fails,
    grade, variant,
)
from lesson_code.practice.lessons import lesson
from lesson_code.practice.messages import DIAGNOSES, failure_sentence
from lesson_code.practice.templates import template_path

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
    "all_gather": [("chunks[(rank - step) % size], group", "chunks[(rank - step + 2) % size], group")],
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


def test_group_ranks_taken_for_global_ranks_fail_in_a_case_that_names_the_group(
        tmp_path: Path) -> None:
    # Right on every rank of the world, where a rank's number in the group is its global rank.
    path = variant(LEARNER, [(
        "    right = dist.get_global_rank(group, (rank + 1) % size) if group else (rank + 1) % size\n"
        "    left = dist.get_global_rank(group, (rank - 1) % size) if group else (rank - 1) % size\n",
        "    right = (rank + 1) % size\n    left = (rank - 1) % size\n")], tmp_path)
    failure = grade(76, path, keys=("all_reduce_sum",), timeout_s=30)["all_reduce_sum"].failure
    assert failure is not None
    case = failure.fields["case"].text("en")
    assert case.startswith("the group of ranks ") and " of 5 (rank " in case, case
    assert "is its rank" in case and "dist.get_global_rank" in lesson(76).checks[1].hint["en"]


def test_an_average_of_integers_must_raise_value_error_as_the_template_says(tmp_path: Path) -> None:
    path = variant(LEARNER, [('    if op == "avg" and not tensor.is_floating_point():\n'
                              '        raise ValueError(f"op=\'avg\' on {tensor.dtype} would '
                              'truncate")\n', "")], tmp_path)
    failure = grade(76, path, keys=("all_reduce_avg",))["all_reduce_avg"].failure
    assert failure.kind == "not_raised" and failure.fields["expected"] == "ValueError"
    assert "int64, op='avg'" in failure.fields["case"].text("en")
    assert "ValueError" in template_path(76, "en").read_text().split("op=\"avg\" on an integer")[1]


def test_a_sum_not_divided_is_diagnosed_as_n_times_too_big(tmp_path: Path) -> None:
    failure = grade(76, variant(LEARNER, MISTAKES["all_reduce_avg"], tmp_path),
                    keys=("all_reduce_avg",))["all_reduce_avg"].failure
    sentence = failure_sentence(failure.kind, failure.fields, "en", failure.diagnosis)
    assert "at element 0 of the result, flattened" in sentence
    assert "it is exactly 2 times the expected value everywhere" in sentence
    persian = failure_sentence(failure.kind, failure.fields, "fa", failure.diagnosis)
    assert "دقیقاً ۲ برابر" in persian and foreign_words(persian) == []


def test_the_rank_s_own_input_coming_back_is_diagnosed_as_nothing_of_the_others_in_it(
        tmp_path: Path) -> None:
    """The diagnosis says what the result shows, not a guess at the cause: here the messages did
    arrive, in a copy the learner's function never returned."""
    path = variant(LEARNER, [("    flat = tensor.view(-1)\n", "    flat = tensor.clone().view(-1)\n")],
                   tmp_path)
    failure = grade(76, path, keys=("all_reduce_sum",))["all_reduce_sum"].failure
    assert failure.kind == "mismatch" and failure.diagnosis == DIAGNOSES["own_input"]
    assert failure.diagnosis.text("en") == ("it is this rank's own input, unchanged: nothing "
                                            "that the other ranks sent is in it")


@pytest.mark.parametrize("lang", ["en", "fa"])
def test_the_template_numbers_the_ring_steps_as_the_lesson_does(lang: str) -> None:
    """Both docstrings give step k = 1 .. N - 1 and the chunks of ring_chunk_indices at that k."""
    import re

    from lesson_code.collectives.ring import ring_chunk_indices

    text = template_path(76, lang).read_text()
    for phase, function in [("reduce_scatter", "def ring_reduce_scatter("),
                            ("all_gather", "def ring_all_gather(")]:
        docstring = text.split(function)[1].split('"""')[1]
        assert "k = 1, ..., N - 1" in docstring and "step s" not in docstring
        send, receive = re.findall(r"\((r - k[^)]*)\) % N", docstring)
        for size in range(2, 6):
            for rank in range(size):
                for k in range(1, size):
                    formulas = (eval(send, {"r": rank, "k": k}) % size,
                                eval(receive, {"r": rank, "k": k}) % size)
                    assert formulas == ring_chunk_indices(phase, rank, k, size)

"""Helpers of the practice-mode tests: grade a file, and make a learner file with one mistake."""

from pathlib import Path

from persian_words import foreign_words
from lesson_code.practice.grading import CheckResult, run_checks
from lesson_code.practice.lessons import lesson
from lesson_code.practice.messages import failure_sentence

SOLUTIONS = Path(__file__).resolve().parent / "solutions"
TIMEOUT_S = 60.0


def grade(number: int, path: Path, keys: tuple[str, ...] | None = None,
          timeout_s: float = TIMEOUT_S) -> dict[str, CheckResult]:
    """Run lesson `number`'s checks (only `keys`, when given) on `path`: {key: result}."""
    checks = [check for check in lesson(number).checks if keys is None or check.key in keys]
    assert checks, f"lesson {number} has no check among {keys}"
    return {result.check.key: result for result in run_checks(checks, str(path), timeout_s)}


def variant(source: Path, replacements: list[tuple[str, str]], folder: Path) -> Path:
    """A copy of `source` in `folder` with each (old, new) replaced; each old must occur once."""
    text = source.read_text()
    for old, new in replacements:
        assert text.count(old) == 1, f"{old!r} occurs {text.count(old)} times in {source.name}"
        text = text.replace(old, new)
    path = folder / source.name
    path.write_text(text)
    return path


def assert_course_passes(number: int, text: str, folder: Path, capsys) -> None:
    """A file made of `text` (the course's own code) passes every check through the command line."""
    from lesson_code.practice.cli import main

    path = folder / "course_filled.py"
    path.write_text(text)
    assert main(["check", str(number), str(path)]) == 0
    report = capsys.readouterr().out
    assert f"All {len(lesson(number).checks)} checks passed." in report and "FAILED" not in report
    assert "the course's" in report  # the timing line, printed once every check passed


def assert_passes(number: int, path: Path) -> None:
    """Every check of lesson `number` passes on `path`."""
    results = grade(number, path)
    assert {key: result.failure for key, result in results.items() if not result.passed} == {}


def assert_template_fails(number: int, folder: Path, keys: tuple[str, ...] | None = None) -> None:
    """The unfilled template passes "names" and fails the other checks (`keys`) on its
    NotImplementedError, whose traceback points into the learner's file."""
    from lesson_code.practice.templates import write_template

    path = write_template(number, "en", folder / "mine.py")
    results = grade(number, path, keys=None if keys is None else ("names", *keys))
    assert results["names"].passed
    for key, result in results.items():
        if key != "names":
            failure = result.failure
            assert failure.kind == "raised" and "NotImplementedError" in failure.fields["error"], key
            assert "mine.py" in failure.details


def assert_mistake_fails(number: int, learner: Path, replacements: list[tuple[str, str]],
                         key: str, kind: str, folder: Path) -> None:
    """`learner` with `replacements` fails the check `key`, with a failure of `kind`, whose
    Persian sentence has no English word nor Latin number outside code. A sentence writes an
    index in plain numbers, and a mismatch says the tolerance it broke."""
    failure = grade(number, variant(learner, replacements, folder), keys=(key,))[key].failure
    assert failure is not None, f"the check {key!r} passed a file with its mistake"
    assert failure.kind == kind, failure
    english = failure_sentence(failure.kind, failure.fields, "en", failure.diagnosis)
    assert "{" not in english and "tensor(" not in english, english
    if kind == "mismatch":
        assert "allowed" in english or "must be exactly equal" in english, english
    persian = failure_sentence(failure.kind, failure.fields, "fa", failure.diagnosis)
    assert foreign_words(persian) == [], persian

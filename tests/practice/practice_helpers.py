"""Helpers of the practice-mode tests: grade a file, and make a learner file with one mistake."""

from pathlib import Path

from lesson_code.practice.grading import CheckResult, run_checks
from lesson_code.practice.lessons import lesson

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

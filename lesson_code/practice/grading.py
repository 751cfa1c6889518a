"""How a learner's file is graded: checks, their failures, and runs of ranks that import the file.

A check is one property the course's own implementation has (a sum equal to PyTorch's, bytes on the
wire of a ring, a checkpoint that survives a flipped byte...). It runs the learner's code on real
gloo ranks through `launch.spawn`, so a learner's function that raises, crashes or hangs ends the
run within `timeout_s` with its traceback (or, for a hang, where each rank waited), and no rank
process survives it.

Inside a rank, `load_learner(path)` imports the learner's file by path (a fresh process per run, so
an edited file is always re-read). A rank function reports a wrong result by returning a `Failure`
(the other ranks go on, so nobody waits on a rank that stopped); `first_failure` picks the first
case that failed on any rank. The parent turns errors of the run into the same `Failure` shape, so
that the report treats a wrong sum, an exception and a hang alike.

`run_checks` runs a lesson's checks in order, with two exceptions that keep the report short and
quick: when the gate (the first check: the file imports and defines the template's names) fails,
no later check runs, since each would fail the same way; and once the ranks hang in a learner's
function, a later check that calls it (`Check.needs`, followed through the learner's own helpers
by `callgraph`) is skipped with the reason, instead of waiting the whole timeout again.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable

from lesson_code import launch
from lesson_code.practice import hangs
from lesson_code.practice.callgraph import first_reached
from lesson_code.practice.messages import HANG_HINTS, SKIPPED, Phrase, listing

if TYPE_CHECKING:
    from lesson_code.practice.timing import Timing

DEFAULT_TIMEOUT_S = 60.0
TRACEBACK_LINES = 12
CASE_NOTE = "practice case: "  # how `rank_checks.during` tags an exception with its case


@dataclass(frozen=True)
class Failure:
    """Why a check failed: a message kind (see `messages.FAILURES`), its fields, and details.

    `kind` and `fields` make the sentence in the reader's language; `diagnosis` (what the
    failure most likely means) is appended to it; `hint`, when set, replaces the check's own
    hint (a hang's cause has its own); `hang` says where the ranks of a run that hung were
    waiting. `details` is text shown as is under the table (a traceback, the ranks' output).
    """

    kind: str
    fields: dict[str, Any] = field(default_factory=dict)
    details: str = ""
    diagnosis: Phrase | None = None
    hint: Phrase | None = None
    hang: hangs.Hang | None = None


class CheckFailed(Exception):
    """Raised by a check (in the parent process) to stop at its first failing case."""

    def __init__(self, failure: Failure):
        super().__init__(failure.kind)
        self.failure = failure


@dataclass(frozen=True)
class Check:
    """One graded property: a key, its title and hint per language, and the function that tests it.

    `run(path, timeout_s)` returns None when every case passes and raises CheckFailed at the first
    case that does not. `needs` names the template's functions or classes it calls; `gate` marks
    the check whose failure ends the grading (the file does not import, or is not this lesson's).
    """

    key: str
    title: dict[str, str]
    hint: dict[str, str]
    run: Callable[[str, float], None]
    needs: tuple[str, ...] = ()
    gate: bool = False


@dataclass(frozen=True)
class CheckResult:
    """What one check found: passed, the failure of its first failing case, or not run (`skipped`
    says why); its number in the lesson, and its seconds."""

    check: Check
    number: int
    failure: Failure | None
    seconds: float
    skipped: Phrase | None = None

    @property
    def passed(self) -> bool:
        return self.failure is None and self.skipped is None


@dataclass(frozen=True)
class Lesson:
    """What practice mode knows of one lesson: its file, the names the file defines, its checks.

    `timing(path, timeout_s)` measures the learner's code against the course's once every check
    has passed (None for a lesson that times nothing).
    """

    number: int | str  # "78a": lesson 78's optional page
    file_name: str
    names: tuple[str, ...]
    checks: tuple[Check, ...]
    timing: Callable[[str, float], Timing] | None = None


def load_learner(path: str | Path) -> ModuleType:
    """Import the learner's file at `path` as a module named `learner`, and return it.

    Called inside each rank. Raises FileNotFoundError when the file is gone, and whatever the
    file raises on import (a syntax error is the learner's to see, with its line).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no learner file at {str(path)!r}")
    spec = importlib.util.spec_from_file_location("learner", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["learner"] = module
    spec.loader.exec_module(module)
    return module


def first_failure(results: list[list[Failure]]) -> Failure | None:
    """The first failure any rank reported, in case order then rank order (None when all passed).

    `results[rank]` is the list of failures that rank found, one per failing case, in case order;
    each failure's fields carry `case_index`.
    """
    found = [failure for by_rank in results for failure in by_rank]
    return min(found, key=lambda failure: failure.fields.get("case_index", 0), default=None)


def run_ranks(rank_fn: Callable[..., Any], path: str, *args: Any, world_size: int,
              timeout_s: float, case: str | Phrase) -> list[Any]:
    """`launch.spawn(rank_fn, path, *args)` on gloo, with a raising, crashing or hanging run as CheckFailed.

    `path` is the learner's file, which every rank function takes first. `case` describes the run
    for the report; a rank that raised inside `rank_checks.during` names its own case instead.
    A raise carries the rank's traceback from the first frame in the learner's file on (the
    grader's own frames are not the learner's concern); a hang, where each rank waited.
    """
    try:
        return launch.spawn(rank_fn, path, *args, world_size=world_size, timeout_s=timeout_s,
                            backend="gloo")
    except launch.RankTimeoutError as error:
        hang = hangs.from_timeout(error.ranks, world_size, error.where, path)
        raise CheckFailed(Failure(
            "timeout", {"case": case, "ranks": listing(error.ranks), "seconds": timeout_s},
            _output(error.outputs), hint=hang_hint(hang), hang=hang))
    except launch.RankFailedError as error:
        noted, text = _case_note(error.rank_traceback)
        last = text.strip().splitlines()[-1] if text.strip() else ""
        hang = hangs.from_raised(error.rank, text, path)
        raise CheckFailed(Failure(  # the exception's message is in the traceback, under the table
            "raised", {"case": noted or case, "rank": error.rank, "error": last.split(":")[0]},
            _from_learner(text, path), hint=hang and hang_hint(hang), hang=hang))
    except launch.SpawnError as error:
        raise CheckFailed(Failure("crashed", {"case": case}, _last_lines(str(error))))


def hang_hint(hang: hangs.Hang) -> Phrase:
    """The hint of a hang's cause, in both languages."""
    return HANG_HINTS[hang.cause].with_fields(returned=listing(list(hang.returned)))


def fail_on_first(results: list[list[Failure]]) -> None:
    """Raise CheckFailed with the first failure of `results` (per rank lists); do nothing if none."""
    failure = first_failure(results)
    if failure is not None:
        raise CheckFailed(failure)


def run_checks(checks: list[Check], path: str, timeout_s: float,
               starting: Callable[[Check], None] | None = None,
               first_number: int = 1) -> list[CheckResult]:
    """Run the checks on the learner's file; return one result per check, in order.

    Each check stops at its first failing case, and the next check runs anyway, except after a
    failed gate (the rest are not run) and for a check that calls a learner's function the ranks
    hung in (not run, with the reason). `starting` is told of each check before it runs.
    """
    results: list[CheckResult] = []
    hung_in: dict[str, int] = {}  # learner's function -> number of the check that hung in it
    for number, check in enumerate(checks, start=first_number):
        skipped = _reason_to_skip(check, results, hung_in, path)
        if skipped is not None:
            results.append(CheckResult(check, number, None, 0.0, skipped))
            continue
        if starting is not None:
            starting(check)
        started = time.perf_counter()
        try:
            check.run(path, timeout_s)
            failure = None
        except CheckFailed as failed:
            failure = failed.failure
        if failure is not None and failure.hang is not None:
            for function in failure.hang.functions:
                hung_in.setdefault(function, number)
        results.append(CheckResult(check, number, failure, time.perf_counter() - started))
    return results


def _reason_to_skip(check: Check, results: list[CheckResult], hung_in: dict[str, int],
                    path: str) -> Phrase | None:
    """Why `check` is not run after `results`, or None to run it."""
    if any(result.check.gate and not result.passed for result in results):
        return SKIPPED["gate"]
    reached = first_reached(path, check.needs, set(hung_in)) if hung_in else None
    if reached is None:
        return None
    name, function = reached
    reason = SKIPPED["hang"] if name == function else SKIPPED["hang_via"]
    return reason.with_fields(name=name, function=function, number=hung_in[function])


def _case_note(traceback_text: str) -> tuple[Phrase | None, str]:
    """(the case a rank's `during` noted on its exception, the traceback without the note)."""
    noted, kept = None, []
    for line in traceback_text.splitlines():
        if line.startswith(CASE_NOTE):
            if noted is None:  # the innermost case was noted first
                texts = json.loads(line[len(CASE_NOTE):])
                noted = Phrase(*(re.sub(r"([{}])", r"\1\1", texts[lang]) for lang in ("en", "fa")))
        else:
            kept.append(line)
    return noted, "\n".join(kept)


def _output(outputs: dict[int, str]) -> str:
    """The last lines each stuck rank printed, under its number (code: shown as is)."""
    return "\n".join(f"--- rank {rank} ---\n{_last_lines(text)}"
                     for rank, text in sorted(outputs.items()) if text.strip())


def _from_learner(traceback_text: str, path: str) -> str:
    """The traceback's header and its frames from the first one in the learner's file on."""
    lines = traceback_text.strip().splitlines()
    marker = f'File "{path}"'
    starts = [index for index, line in enumerate(lines) if marker in line]
    if not starts:
        return _last_lines(traceback_text)
    return "\n".join(lines[:1] + lines[starts[0]:])


def _last_lines(text: str, count: int = TRACEBACK_LINES) -> str:
    """The last `count` lines of `text`: the end of a traceback is where the learner looks."""
    return "\n".join(text.strip().splitlines()[-count:])

"""How a learner's file is graded: checks, their failures, and runs of ranks that import the file.

A check is one property the course's own implementation has (a sum equal to PyTorch's, bytes on the
wire of a ring, a checkpoint that survives a flipped byte...). It runs the learner's code on real
gloo ranks through `launch.spawn`, so a learner's function that raises, crashes or hangs ends the
run within `timeout_s` with its traceback, and no rank process survives it.

Inside a rank, `load_learner(path)` imports the learner's file by path (a fresh process per run, so
an edited file is always re-read). A rank function reports a wrong result by returning a `Failure`
(the other ranks go on, so nobody waits on a rank that stopped); `first_failure` picks the first
case that failed on any rank. The parent turns errors of the run into the same `Failure` shape, so
that the report treats a wrong sum, an exception and a hang alike.
"""

from __future__ import annotations

import importlib.util
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

from lesson_code import launch

DEFAULT_TIMEOUT_S = 60.0
TRACEBACK_LINES = 12


@dataclass(frozen=True)
class Failure:
    """Why a check failed: a message kind (see `messages.FAILURES`), its fields, and details.

    `kind` and `fields` make the sentence in the reader's language; `details` is text shown as is
    under the table (a traceback, the ranks' last output).
    """

    kind: str
    fields: dict[str, Any] = field(default_factory=dict)
    details: str = ""


class CheckFailed(Exception):
    """Raised by a check (in the parent process) to stop at its first failing case."""

    def __init__(self, failure: Failure):
        super().__init__(failure.kind)
        self.failure = failure


@dataclass(frozen=True)
class Check:
    """One graded property: a key, its title and hint per language, and the function that tests it.

    `run(path, timeout_s)` returns None when every case passes and raises CheckFailed at the first
    case that does not.
    """

    key: str
    title: dict[str, str]
    hint: dict[str, str]
    run: Callable[[str, float], None]


@dataclass(frozen=True)
class CheckResult:
    """What one check found: passed, or the failure of its first failing case; and its seconds."""

    check: Check
    failure: Failure | None
    seconds: float

    @property
    def passed(self) -> bool:
        return self.failure is None


@dataclass(frozen=True)
class Timing:
    """The learner's code against the course's on the same task: median seconds of each."""

    what: str
    world_size: int
    trials: int
    yours_s: float
    course_s: float


@dataclass(frozen=True)
class Lesson:
    """What practice mode knows of one lesson: its file, the names the file defines, its checks.

    `timing(path, timeout_s)` measures the learner's code against the course's once every check
    has passed (None for a lesson that times nothing).
    """

    number: int
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


def learner_function(module: ModuleType, name: str) -> Callable[..., Any]:
    """`module.name`, or AttributeError naming the function the learner's file must define."""
    found = getattr(module, name, None)
    if not callable(found):
        raise AttributeError(f"the learner's file defines no function or class {name!r}: "
                             "keep the names of the template")
    return found


def first_failure(results: list[list[Failure]]) -> Failure | None:
    """The first failure any rank reported, in case order then rank order (None when all passed).

    `results[rank]` is the list of failures that rank found, one per failing case, in case order;
    each failure's fields carry `case` (its index).
    """
    found = [failure for by_rank in results for failure in by_rank]
    return min(found, key=lambda failure: failure.fields.get("case_index", 0), default=None)


def run_ranks(rank_fn: Callable[..., Any], path: str, *args: Any, world_size: int,
              timeout_s: float, case: str) -> list[Any]:
    """`launch.spawn(rank_fn, path, *args)` on gloo, with a raising, crashing or hanging run as CheckFailed.

    `path` is the learner's file, which every rank function takes first. `case` describes the run
    for the report (world size, inputs). The failure carries the failing rank's traceback from
    the first frame in the learner's file on (the grader's own frames are not the learner's
    concern), or the last lines of the ranks' output.
    """
    try:
        return launch.spawn(rank_fn, path, *args, world_size=world_size, timeout_s=timeout_s,
                            backend="gloo")
    except launch.RankTimeoutError as error:
        raise CheckFailed(Failure("timeout", {"case": case, "ranks": error.ranks,
                                              "seconds": timeout_s}, _last_lines(str(error))))
    except launch.RankFailedError as error:
        last = error.rank_traceback.strip().splitlines()[-1] if error.rank_traceback else ""
        raise CheckFailed(Failure("raised", {"case": case, "rank": error.rank, "error": last},
                                  _from_learner(error.rank_traceback, path)))
    except launch.SpawnError as error:
        raise CheckFailed(Failure("crashed", {"case": case}, _last_lines(str(error))))


def fail_on_first(results: list[list[Failure]]) -> None:
    """Raise CheckFailed with the first failure of `results` (per rank lists); do nothing if none."""
    failure = first_failure(results)
    if failure is not None:
        raise CheckFailed(failure)


def run_checks(checks: list[Check], path: str, timeout_s: float,
               starting: Callable[[Check], None] | None = None) -> list[CheckResult]:
    """Run every check on the learner's file; return one result per check, in order.

    Each check stops at its first failing case; the next check runs anyway, so the report shows
    every check's verdict. `starting` is told of each check before it runs (a progress line).
    """
    results = []
    for check in checks:
        if starting is not None:
            starting(check)
        started = time.perf_counter()
        try:
            check.run(path, timeout_s)
            failure = None
        except CheckFailed as failed:
            failure = failed.failure
        result = CheckResult(check, failure, time.perf_counter() - started)
        results.append(result)
    return results


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

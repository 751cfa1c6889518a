"""The errors `lesson_code.launch.spawn` raises when a run of ranks does not complete.

Each names the rank (or ranks) at fault and says what to check; `RankFailedError` carries the
rank's own traceback text, so a notebook shows where the rank failed, not only that it did. Each
also carries the last lines the rank printed (`output`: its stdout and stderr, which spawn
captures), so that they appear under the cell that failed, with the error.
Standard library only; `lesson_code.launch` re-exports them.
"""

from __future__ import annotations

import re
import signal
import sysconfig
import time
from pathlib import Path


class SpawnError(RuntimeError):
    """Base class of the errors `spawn` raises when a run of ranks does not complete."""


def _with_output(message: str, outputs: dict[int, str]) -> str:
    """`message` followed by the captured output of each rank that printed something."""
    for rank, text in sorted(outputs.items()):
        if text.strip():
            message += f"\n--- last output of rank {rank} ---\n{text.rstrip()}"
    return message


class RankFailedError(SpawnError):
    """A rank raised an exception; `rank` names it and `rank_traceback` is its traceback text."""

    def __init__(self, rank: int, world_size: int, rank_traceback: str, output: str = ""):
        self.rank = rank
        self.rank_traceback = rank_traceback
        self.output = output
        self.raised_at = time.monotonic()
        super().__init__(_with_output(
            f"rank {rank} of {world_size} raised; the other ranks were stopped.\n"
            f"--- traceback of rank {rank} ---\n{rank_traceback.rstrip()}", {rank: output}))


class RankCrashedError(SpawnError):
    """A rank process died without reporting (a signal such as SIGABRT, an exit without an
    exception, or a failed start); `started` says whether it had begun to run its function."""

    def __init__(self, rank: int, world_size: int, exitcode: int | None, output: str = "",
                 started: bool = False):
        self.rank = rank
        self.exitcode = exitcode
        self.output = output
        self.started = started
        if exitcode is not None and exitcode < 0:
            how = f"was killed by {_signal_name(-exitcode)}"
            hint = ("gloo aborts a process (SIGABRT) when ranks pass tensors of different shapes "
                    "to one collective: check that every rank calls the same collectives with "
                    "equal shapes" if exitcode == -signal.SIGABRT else
                    "check the rank's memory use and anything that may kill it")
        elif started:
            how = f"exited with code {exitcode} while running its function"
            hint = ("something it called ended the process without raising an exception "
                    "(os._exit, or a library that calls exit()): its output shows how far it got")
        else:
            how = f"exited with code {exitcode}"
            hint = ("it did not start the rank function: its stderr (printed by the process "
                    "before it could be captured) says why. A script that spawns ranks must do "
                    "so under `if __name__ == '__main__':`")
        super().__init__(_with_output(
            f"rank {rank} of {world_size} {how} before returning a result; the other ranks were "
            f"stopped. {hint[0].upper() + hint[1:]}.", {rank: output}))


class RankTimeoutError(SpawnError):
    """Some ranks were still running at the deadline; `ranks` lists them, and `where` gives,
    for each rank that answered the launcher's request for its stack, the calls it was waiting
    in (innermost first, as "function (file:line)")."""

    def __init__(self, ranks: list[int], world_size: int, timeout_s: float,
                 outputs: dict[int, str] | None = None,
                 where: dict[int, list[str]] | None = None):
        self.ranks = ranks
        self.outputs = outputs or {}
        self.where = where or {}
        message = (f"ranks {ranks} of {world_size} were still running after timeout_s={timeout_s:g} "
                   "s and were stopped.")
        if self.where:
            message += "\nWhere each was waiting (innermost call first):\n" + "\n".join(
                f"  rank {rank}: {' < '.join(calls) or '(no call of the package or yours)'}"
                for rank, calls in sorted(self.where.items()))
        message += "\n" + _diagnosis(ranks, world_size, self.where)
        super().__init__(_with_output(message, self.outputs))


def _diagnosis(ranks: list[int], world_size: int, where: dict[int, list[str]]) -> str:
    """What the calls the ranks waited in say about the cause of the hang, and no more."""
    if len(ranks) < world_size:
        return ("The other ranks had returned: a rank that never joins a collective blocks the "
                "others. Check that every rank calls the same collectives in the same order.")
    if len(where) < len(ranks):
        return ("Not every rank said where it was waiting, so the cause cannot be read from "
                "that: see what each printed; a rank that is only slow needs a larger timeout_s.")
    entered = {torch_call(calls) for calls in where.values()}
    if entered == {"send"}:
        return ("Every rank waits in a blocking dist.send, for a receive that no rank has "
                "posted: either each rank sends before it receives (post the send and the "
                "receive together, dist.isend and dist.irecv, then wait on both), or the ranks "
                "receive from other peers than the ones that send to them.")
    if entered == {"recv"}:
        return ("Every rank waits in a blocking dist.recv, for a message that no rank has sent: "
                "either each rank receives before it sends (post the send and the receive "
                "together, dist.isend and dist.irecv, then wait on both), or the ranks send to "
                "other peers than the ones that receive from them.")
    places = {tuple(call.split(" (")[0] for call in calls) for calls in where.values()}
    if len(places) > 1:
        return ("The ranks wait in different places: they called different collectives, one "
                "collective with different algorithms, or sends and receives whose peers do not "
                "match, and each waits for messages that the others never send. Every rank must "
                "make the same calls in the same order, with matching peers.")
    return ("Every rank waits in the same place: for a message that no rank has sent, or for a "
            "rank far slower than the others (then pass a larger timeout_s).")


def torch_call(calls: list[str]) -> str | None:
    """The torch.distributed function a rank waited in ("send", "all_reduce", ...) when
    `waiting_calls` found one, else None (a wait on a work handle, or no wait at all)."""
    found = re.match(r"(?P<function>\S+) \(torch/distributed/", calls[0]) if calls else None
    return found["function"] if found else None


STACK_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<function>\S+)')
RANK_BODY = "rank_main"  # the function of lesson_code.runtime.processes that calls the rank's fn


def waiting_calls(stacks: str, shown: int = 6) -> list[str]:
    """The calls a rank was waiting in, innermost first, from the stacks of its threads as
    `faulthandler` writes them: the thread that runs the rank's function, its frames above
    RANK_BODY, without the standard library's and installed packages' (torch's) but with this
    package's, each as "function (file:line)". When the innermost of those frames called into
    torch.distributed, the function it called comes first ("send
    (torch/distributed/distributed_c10d.py:2753)"): what the rank is blocked in.

    Every frame of a file outside the package (the learner's, a script's) is kept, however deep
    the package's own frames lie around it: a practice check reads the learner's line from here.
    Of the package's frames, only the `shown` innermost are kept (the rest are the grader's or
    the launcher's way down to the learner's code)."""
    package = Path(__file__).resolve().parents[1]  # lesson_code/
    hidden = sorted({Path(sysconfig.get_paths()[key]).resolve()
                     for key in ("stdlib", "purelib", "platlib")},
                    key=lambda folder: -len(folder.parts))  # site-packages before the stdlib
    for block in re.split(r"\n(?=\S)", stacks):
        frames = [m.groupdict() for m in map(STACK_FRAME.match, block.splitlines()) if m]
        names = [frame["function"] for frame in frames]
        if RANK_BODY not in names:
            continue
        calls, package_calls, entered = [], 0, None
        for frame in frames[:names.index(RANK_BODY)]:
            path = Path(frame["file"]).resolve()
            ours = package in path.parents
            folder = next((folder for folder in hidden if folder in path.parents), None)
            if not ours and folder is not None:
                inside = path.relative_to(folder)
                if not calls and inside.parts[:2] == ("torch", "distributed") \
                        and inside.name != "c10d_logger.py":  # its wrapper logs, it waits for nothing
                    entered = f"{frame['function']} ({inside.as_posix()}:{frame['line']})"
                continue
            if entered:  # the outermost torch.distributed frame under the first shown one
                calls.append(entered)
                entered = None
            if ours:
                package_calls += 1
                if package_calls > shown:
                    continue
            where = path.relative_to(package.parent) if ours else path.name
            calls.append(f"{frame['function']} ({where}:{frame['line']})")
        return calls
    return []


def _signal_name(number: int) -> str:
    """"SIGKILL" for 9; "signal 34" for a signal without a name (the real-time ones)."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"

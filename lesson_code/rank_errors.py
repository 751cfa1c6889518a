"""The errors `lesson_code.launch.spawn` raises when a run of ranks does not complete.

Each names the rank (or ranks) at fault and says what to check; `RankFailedError` carries the
rank's own traceback text, so a notebook shows where the rank failed, not only that it did. Each
also carries the last lines the rank printed (`output`: its stdout and stderr, which spawn
captures), so that they appear under the cell that failed, with the error.
Standard library only; `lesson_code.launch` re-exports them.
"""

from __future__ import annotations

import signal
import time


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
    """A rank process died without reporting (a signal such as SIGABRT, or a failed start)."""

    def __init__(self, rank: int, world_size: int, exitcode: int | None, output: str = ""):
        self.rank = rank
        self.exitcode = exitcode
        self.output = output
        if exitcode is not None and exitcode < 0:
            how = f"was killed by {_signal_name(-exitcode)}"
            hint = ("gloo aborts a process (SIGABRT) when ranks pass tensors of different shapes "
                    "to one collective: check that every rank calls the same collectives with "
                    "equal shapes" if exitcode == -signal.SIGABRT else
                    "check the rank's memory use and anything that may kill it")
        else:
            how = f"exited with code {exitcode}"
            hint = ("it did not start the rank function: its stderr (printed by the process "
                    "before it could be captured) says why. A script that spawns ranks must do "
                    "so under `if __name__ == '__main__':`")
        super().__init__(_with_output(
            f"rank {rank} of {world_size} {how} before returning a result; the other ranks were "
            f"stopped. {hint[0].upper() + hint[1:]}.", {rank: output}))


class RankTimeoutError(SpawnError):
    """Some ranks were still running at the deadline; `ranks` lists them."""

    def __init__(self, ranks: list[int], world_size: int, timeout_s: float,
                 outputs: dict[int, str] | None = None):
        self.ranks = ranks
        self.outputs = outputs or {}
        super().__init__(_with_output(
            f"ranks {ranks} of {world_size} were still running after timeout_s={timeout_s:g} s and "
            "were stopped. A rank that never joins a collective blocks the others: check that every "
            "rank calls the same collectives in the same order, or pass a larger timeout_s.",
            self.outputs))


def _signal_name(number: int) -> str:
    """"SIGKILL" for 9; "signal 34" for a signal without a name (the real-time ones)."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"

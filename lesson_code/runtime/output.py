"""What each rank prints, captured in a file per rank and shown to the caller (lessons 76-81).

A rank's stdout and stderr would otherwise go wherever the fork server's went: the terminal that
started Jupyter, not the notebook cell that launched the run. `spawn` redirects file descriptors 1
and 2 of every rank (so C++ messages from gloo are caught too) to `rank<r>.out` / `rank<r>.err`,
copies each new complete line to the caller's `sys.stdout` / `sys.stderr` while the run goes on,
and puts the last lines of a failing rank into the error it raises.
Standard library only; used by `lesson_code.runtime.processes`.
"""

from __future__ import annotations

import os
import sys
from collections import deque
from pathlib import Path

TAIL_LINES = 30  # lines of a failing rank's output that travel with the error


def redirect_rank_output(stdout_path: str, stderr_path: str) -> None:
    """In a rank: send file descriptors 1 and 2 (Python's and C++'s output) to the two files.

    Python's streams are flushed first and made line-buffered, so that what the rank prints
    reaches the caller while the run goes on, and is complete if the rank dies.
    """
    for stream, path, fd in ((sys.stdout, stdout_path, 1), (sys.stderr, stderr_path, 2)):
        if stream is not None:
            stream.flush()
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(target, fd)
        os.close(target)
        if stream is not None and hasattr(stream, "reconfigure"):
            stream.reconfigure(line_buffering=True)


def flush_rank_output() -> None:
    """In a rank: flush Python's streams before reporting, so the caller has every line."""
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            stream.flush()


class RankOutput:
    """The caller's side: files of every rank's output in `folder`, forwarded and tailed.

    `paths(rank)` are the two files a rank writes; `forward()` copies the complete lines written
    since the last call to sys.stdout / sys.stderr (rank after rank); `tail(rank)` is the end of
    a rank's output for an error message.
    """

    def __init__(self, folder: str, world_size: int):
        self._files = [(os.path.join(folder, f"rank{rank}.out"),
                        os.path.join(folder, f"rank{rank}.err")) for rank in range(world_size)]
        self._stacks = [os.path.join(folder, f"rank{rank}.stack") for rank in range(world_size)]
        self._offsets = {path: 0 for pair in self._files for path in pair}

    def paths(self, rank: int) -> tuple[str, str]:
        return self._files[rank]

    def stack_path(self, rank: int) -> str:
        """Where rank `rank` writes the stacks of its threads when the caller asks (a signal)."""
        return self._stacks[rank]

    def stacks(self, rank: int) -> str:
        """What rank `rank` wrote there (empty when it was never asked, or did not answer)."""
        return _read_text(self._stacks[rank])

    def forward(self, final: bool = False) -> None:
        """Write what the ranks printed since the last call to the caller's streams.

        Only complete lines, unless `final` (the ranks have stopped: a last partial line too).
        """
        for out_path, err_path in self._files:
            for path, stream in ((out_path, sys.stdout), (err_path, sys.stderr)):
                text = self._read_new(path, final)
                if text and stream is not None:
                    stream.write(text)
                    stream.flush()

    def tail(self, rank: int, lines: int = TAIL_LINES) -> str:
        """The last `lines` lines of rank `rank`'s stdout, then of its stderr (labelled)."""
        parts = []
        for label, path in zip(("stdout", "stderr"), self._files[rank]):
            text = _read_text(path)
            if text.strip():
                kept = deque(text.rstrip("\n").splitlines(), maxlen=lines)
                parts.append(f"[{label}]\n" + "\n".join(kept))
        return "\n".join(parts)

    def _read_new(self, path: str, final: bool) -> str:
        try:
            with open(path, "rb") as file:
                file.seek(self._offsets[path])
                data = file.read()
        except FileNotFoundError:  # the rank has not started yet
            return ""
        if not final:
            data = data[: data.rfind(b"\n") + 1]  # hold back a line still being written
        self._offsets[path] += len(data)
        return data.decode("utf-8", errors="replace")


def _read_text(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return ""

"""Why a run of ranks hung, told from where each stuck rank waited in the learner's file.

`launch.spawn` ends a run that outlives its timeout with `RankTimeoutError`, whose `where` gives,
for each rank still running, the calls it was waiting in (innermost first, "function
(file:line)"; the learner's file by its name). A learner's own bounded wait that gives up raises
gloo's "Timed out waiting ..." instead, with a traceback. Either way this module keeps the
frames, reads the source line each waits on, and names the likely cause:

- "left": some ranks had returned, so the others wait for messages that will never come;
- "in_send" / "in_recv": every rank waits in a blocking dist.send (or every rank in a blocking
  dist.recv), for a receive (a message) that no rank has posted (sent);
- "apart": the ranks wait on different lines of the learner's file;
- "deadlock": every rank waits on the same line for a message, in another call (a wait on a
  handle, a collective), or a rank's own bounded wait gave up;
- "busy": the ranks were in the learner's code but not communicating (a loop, or slow code);
- "unknown": no rank answered with a frame of the learner's file;
- "peer_gone": the rank reported was waiting in the learner's code when its peer stopped (gloo's
  "Connection closed by peer"). The launcher reports the first error to arrive, and when a
  rank's bounded wait gives up and exits, its peer's error often arrives first: this is then
  most likely a deadlock too, though the peer may also have raised.

`Hang.functions` are the learner's functions the ranks were stuck in, so that later checks
which call them can be skipped instead of waiting the whole timeout again.
"""

from __future__ import annotations

import io
import re
import tokenize
from dataclasses import dataclass
from pathlib import Path

from lesson_code.runtime.errors import torch_call

WHERE_CALL = re.compile(r"^(?P<function>.+) \((?P<file>.+):(?P<line>\d+)\)$")
TRACEBACK_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<function>\S+)')
GAVE_UP = re.compile(r"Timed out waiting|timed out", re.IGNORECASE)
PEER_GONE = re.compile(r"Connection closed by peer", re.IGNORECASE)
COMMUNICATING = re.compile(r"\b(i?send|i?recv|wait|barrier|batch_isend_irecv|all_reduce|"
                           r"reduce_scatter\w*|all_gather\w*|broadcast\w*|all_to_all\w*|"
                           r"reduce|gather|scatter)\b")


@dataclass(frozen=True)
class Frame:
    """One call a stuck rank was in: its function, file (as shown), line, and whether that file is
    the learner's; `source` is the learner's line without its comment ("" for other files)."""

    function: str
    file: str
    line: int
    learner: bool
    source: str = ""


@dataclass(frozen=True)
class Hang:
    """A run that did not finish: per stuck rank its frames (innermost first; empty when it did
    not answer), the ranks that had returned, and the cause (see the module docstring)."""

    stuck: dict[int, tuple[Frame, ...]]
    returned: tuple[int, ...]
    cause: str

    @property
    def functions(self) -> set[str]:
        """The learner's functions the ranks were waiting in (each rank's innermost one)."""
        return {frames[0].function for frames in map(learner_frames, self.stuck.values()) if frames}


def learner_frames(frames: tuple[Frame, ...]) -> tuple[Frame, ...]:
    """The frames of the learner's file, innermost first."""
    return tuple(frame for frame in frames if frame.learner)


def from_timeout(ranks: list[int], world_size: int, where: dict[int, list[str]],
                 path: str) -> Hang:
    """The hang of a run whose `ranks` were still running (`RankTimeoutError.ranks`, `.where`)."""
    name = Path(path).name
    stuck = {}
    for rank in ranks:
        frames = []
        for call in where.get(rank, []):
            found = WHERE_CALL.match(call)
            if found:
                learner = found["file"] == name
                line = int(found["line"])
                frames.append(Frame(found["function"], found["file"], line, learner,
                                    _source(path, line) if learner else ""))
        stuck[rank] = tuple(frames)
    returned = tuple(rank for rank in range(world_size) if rank not in ranks)
    entered = {torch_call(where.get(rank, [])) for rank in ranks}
    return Hang(stuck, returned, _cause(stuck, returned, entered))


def from_raised(rank: int, traceback_text: str, path: str) -> Hang | None:
    """The hang of a rank that gave up waiting (gloo's "Timed out waiting ..." in its last line)
    or whose peer stopped while it waited ("Connection closed by peer"), from the learner's
    frames of its traceback; None for any other error."""
    lines = traceback_text.strip().splitlines()
    gave_up = bool(lines) and GAVE_UP.search(lines[-1])
    if not lines or not (gave_up or PEER_GONE.search(lines[-1])):
        return None
    frames = []
    for match in filter(None, map(TRACEBACK_FRAME.match, lines)):
        learner = Path(match["file"]) == Path(path)
        line = int(match["line"])
        frames.append(Frame(match["function"], Path(match["file"]).name, line, learner,
                            _source(path, line) if learner else ""))
    stuck = {rank: tuple(reversed(frames))}  # a traceback lists the outermost call first
    if not learner_frames(stuck[rank]):
        return Hang(stuck, (), "unknown")
    return Hang(stuck, (), "deadlock" if gave_up else "peer_gone")


def _cause(stuck: dict[int, tuple[Frame, ...]], returned: tuple[int, ...],
           entered: set[str | None]) -> str:
    """The cause of a hang (see the module docstring); `entered` holds the torch.distributed
    function each stuck rank waited in (None for a rank in none)."""
    if returned:
        return "left"
    if entered in ({"send"}, {"recv"}):
        return "in_" + next(iter(entered))
    innermost = {rank: learner_frames(frames)[0] for rank, frames in stuck.items()
                 if learner_frames(frames)}
    if not innermost:
        return "unknown"
    if len({(frame.function, frame.line) for frame in innermost.values()}) > 1:
        return "apart"
    communicating = all(frames[0] is not innermost[rank]  # deeper: in the package's code
                        or COMMUNICATING.search(innermost[rank].source)
                        for rank, frames in stuck.items() if rank in innermost)
    return "deadlock" if communicating else "busy"


def _source(path: str, line: int) -> str:
    """Line `line` of the learner's file, stripped and without a trailing comment."""
    try:
        text = Path(path).read_text(encoding="utf-8").splitlines()[line - 1]
    except (OSError, IndexError, UnicodeDecodeError):
        return ""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text.strip() + "\n").readline))
        comments = [token for token in tokens if token.type == tokenize.COMMENT]
    except (tokenize.TokenError, SyntaxError):  # part of a longer statement: keep it whole
        comments = []
    code = text.strip()
    if comments:
        code = code[: comments[0].start[1]]
    return code.rstrip()

"""The errors `lesson_code.launch.spawn` raises when a run of ranks does not complete.

Each names the rank (or ranks) at fault and says what to check; `RankFailedError` carries the
rank's own traceback text, so a notebook shows where the rank failed, not only that it did. Each
also carries the last lines the rank printed (`output`: its stdout and stderr, which spawn
captures), so that they appear under the cell that failed, with the error.
The messages are English, as Python's are; each error also keeps its facts (rank, world size,
signal or exit code, the ranks still running) and `error.explain("fa")` says the same in
Persian from them, for the Persian edition to print.
Standard library only; `lesson_code.launch` re-exports them.
"""

from __future__ import annotations

import re
import signal
import sysconfig
import time
from pathlib import Path

from lesson_code import language


class SpawnError(RuntimeError):
    """Base class of the errors `spawn` raises when a run of ranks does not complete."""

    def explain(self, lang: str = "fa") -> str:
        """What happened, in `lang`, in one paragraph: the message's first paragraph in English
        (without the ranks' tracebacks and output); in Persian the same facts, from the error's
        attributes."""
        if language.check_language(lang) == "en":
            return str(self).split("\n")[0]
        return self._persian()

    def _persian(self) -> str:
        return str(self).split("\n")[0]


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
        self.world_size = world_size
        self.rank_traceback = rank_traceback
        self.output = output
        self.raised_at = time.monotonic()
        super().__init__(_with_output(
            f"rank {rank} of {world_size} raised; the other ranks were stopped.\n"
            f"--- traceback of rank {rank} ---\n{rank_traceback.rstrip()}", {rank: output}))

    def _persian(self) -> str:
        raised = self.rank_traceback.rstrip().splitlines()[-1:] or [""]
        name = raised[0].split(":")[0].strip()
        return language.fill("رتبهٔ {rank} از {world_size} رتبه خطای {name} داد و رتبه‌های دیگر "
                             "متوقف شدند؛ ردِ فراخوانی‌های آن رتبه تا جای خطا زیر پیام خطا آمده است.",
                             "fa", rank=self.rank, world_size=self.world_size,
                             name=language.isolated(name or "?"))


class RankCrashedError(SpawnError):
    """A rank process died without reporting (a signal such as SIGABRT, an exit without an
    exception, or a failed start); `started` says whether it had begun to run its function."""

    def __init__(self, rank: int, world_size: int, exitcode: int | None, output: str = "",
                 started: bool = False):
        self.rank = rank
        self.world_size = world_size
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

    def _persian(self) -> str:
        code = self.exitcode
        if code is not None and code < 0:
            how = "با سیگنال {signal} کشته شد"
            hint = ("gloo فرایندی را که رتبه‌هایش به یک عملیات جمعی تنسورهایی با شکل‌های متفاوت "
                    "بدهند با SIGABRT متوقف می‌کند: وارسی کنید که همهٔ رتبه‌ها همان عملیات جمعی را "
                    "با شکل‌های برابر فرا بخوانند" if code == -signal.SIGABRT else
                    "مصرف حافظهٔ این رتبه و هر چیزی را که ممکن است آن را بکشد وارسی کنید")
        elif self.started:
            how = "در میانهٔ اجرای تابعش با کد خروج {code} پایان یافت"
            hint = ("چیزی که فرا خواند فرایند را بی‌آنکه خطایی برخیزد پایان داد (`os._exit` یا "
                    "کتابخانه‌ای که `exit()` را فرا می‌خواند): خروجی‌اش نشان می‌دهد تا کجا پیش رفت")
        else:
            how = "با کد خروج {code} پایان یافت"
            hint = ("تابع رتبه را آغاز نکرد: خروجی خطای فرایندش (`stderr`) می‌گوید چرا. برنامه‌ای "
                    "که رتبه‌ها را راه می‌اندازد باید این کار را زیر "
                    "`if __name__ == '__main__':` بکند")
        return language.fill("رتبهٔ {rank} از {world_size} رتبه " + how + "، پیش از آنکه نتیجه‌ای "
                             "برگرداند؛ رتبه‌های دیگر متوقف شدند. " + hint + ".", "fa",
                             rank=self.rank, world_size=self.world_size, code=code,
                             signal=_signal_name(-code) if code is not None and code < 0 else "")


class RankTimeoutError(SpawnError):
    """Some ranks were still running at the deadline; `ranks` lists them, and `where` gives,
    for each rank that answered the launcher's request for its stack, the calls it was waiting
    in (innermost first, as "function (file:line)")."""

    def __init__(self, ranks: list[int], world_size: int, timeout_s: float,
                 outputs: dict[int, str] | None = None,
                 where: dict[int, list[str]] | None = None):
        self.ranks = ranks
        self.world_size = world_size
        self.timeout_s = timeout_s
        self.outputs = outputs or {}
        self.where = where or {}
        message = (f"ranks {ranks} of {world_size} were still running after timeout_s={timeout_s:g} "
                   "s and were stopped.")
        if self.where:
            message += "\nWhere each was waiting (innermost call first):\n" + "\n".join(
                f"  rank {rank}: {' < '.join(calls) or '(no call of the package or yours)'}"
                for rank, calls in sorted(self.where.items()))
        message += "\n" + DIAGNOSES[_cause(ranks, world_size, self.where)][0]
        super().__init__(_with_output(message, self.outputs))

    def _persian(self) -> str:
        return language.fill("رتبه‌های {ranks} از {world_size} رتبه پس از {seconds:g} ثانیه "
                             "(`timeout_s`) هنوز در حال اجرا بودند و متوقف شدند. ", "fa",
                             ranks=self.ranks, world_size=self.world_size, seconds=self.timeout_s) \
            + language.isolated_code(DIAGNOSES[_cause(self.ranks, self.world_size, self.where)][1])


def _cause(ranks: list[int], world_size: int, where: dict[int, list[str]]) -> str:
    """What the calls the ranks waited in say about the cause of the hang, and no more: a key of
    DIAGNOSES."""
    if len(ranks) < world_size:
        return "others_returned"
    if len(where) < len(ranks):
        return "not_every_rank_said"
    entered = {torch_call(calls) for calls in where.values()}
    if entered == {"send"}:
        return "all_in_send"
    if entered == {"recv"}:
        return "all_in_recv"
    places = {tuple(call.split(" (")[0] for call in calls) for calls in where.values()}
    return "different_places" if len(places) > 1 else "same_place"


# Each cause of a hang, said in English (the error's message) and in Persian (`explain`).
DIAGNOSES = {
    "others_returned": (
        "The other ranks had returned: a rank that never joins a collective blocks the others. "
        "Check that every rank calls the same collectives in the same order.",
        "رتبه‌های دیگر کارشان را تمام کرده بودند: رتبه‌ای که هرگز به یک عملیات جمعی نمی‌پیوندد "
        "بقیه را منتظر نگه می‌دارد. وارسی کنید که همهٔ رتبه‌ها همان عملیات جمعی را به همان ترتیب "
        "فرا بخوانند."),
    "not_every_rank_said": (
        "Not every rank said where it was waiting, so the cause cannot be read from that: see "
        "what each printed; a rank that is only slow needs a larger timeout_s.",
        "همهٔ رتبه‌ها نگفتند کجا منتظرند، پس علت را از آن نمی‌توان خواند: ببینید هر کدام چه چاپ "
        "کرده است؛ رتبه‌ای که فقط کند است `timeout_s` بزرگ‌تری لازم دارد."),
    "all_in_send": (
        "Every rank waits in a blocking dist.send, for a receive that no rank has posted: either "
        "each rank sends before it receives (post the send and the receive together, dist.isend "
        "and dist.irecv, then wait on both), or the ranks receive from other peers than the ones "
        "that send to them.",
        "همهٔ رتبه‌ها در یک `dist.send` مسدودکننده منتظر دریافتی‌اند که هیچ رتبه‌ای آن را آغاز "
        "نکرده است: یا هر رتبه پیش از دریافت می‌فرستد (ارسال و دریافت را با هم آغاز کنید، "
        "`dist.isend` و `dist.irecv`، و سپس منتظر هر دو بمانید)، یا رتبه‌ها از همتایانی جز آن‌ها که "
        "برایشان می‌فرستند دریافت می‌کنند."),
    "all_in_recv": (
        "Every rank waits in a blocking dist.recv, for a message that no rank has sent: either "
        "each rank receives before it sends (post the send and the receive together, dist.isend "
        "and dist.irecv, then wait on both), or the ranks send to other peers than the ones that "
        "receive from them.",
        "همهٔ رتبه‌ها در یک `dist.recv` مسدودکننده منتظر پیامی‌اند که هیچ رتبه‌ای نفرستاده است: یا "
        "هر رتبه پیش از ارسال دریافت می‌کند (ارسال و دریافت را با هم آغاز کنید، `dist.isend` و "
        "`dist.irecv`، و سپس منتظر هر دو بمانید)، یا رتبه‌ها برای همتایانی جز آن‌ها که از ایشان "
        "دریافت می‌کنند می‌فرستند."),
    "different_places": (
        "The ranks wait in different places: they called different collectives, one collective "
        "with different algorithms, or sends and receives whose peers do not match, and each "
        "waits for messages that the others never send. Every rank must make the same calls in "
        "the same order, with matching peers.",
        "رتبه‌ها در جاهای مختلفی منتظرند: عملیات جمعی متفاوتی را فرا خواندند، یک عملیات جمعی را "
        "با الگوریتم‌های متفاوت، یا ارسال‌ها و دریافت‌هایی که همتایانشان با هم جور نیستند، و هر "
        "کدام منتظر پیام‌هایی است که دیگران هرگز نمی‌فرستند. همهٔ رتبه‌ها باید همان فراخوانی‌ها را "
        "به همان ترتیب و با همتایان جور انجام دهند."),
    "same_place": (
        "Every rank waits in the same place: for a message that no rank has sent, or for a rank "
        "far slower than the others (then pass a larger timeout_s).",
        "همهٔ رتبه‌ها در یک جا منتظرند: برای پیامی که هیچ رتبه‌ای نفرستاده، یا برای رتبه‌ای بسیار "
        "کندتر از بقیه (در این صورت `timeout_s` بزرگ‌تری بدهید)."),
}


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

"""A learner's code that hangs: reported once within its timeout, with where each rank waited.

A deadlock (every rank posts a blocking receive before its send) is graded through the command
line, as a learner runs it, with a 30 s timeout: the report must come before twice that after
the hanging check starts (the hang is waited for once, not once per check), show each stuck rank's line, give the deadlock's
hint in Persian, and skip the later checks that would hang again. The rest is cheaper: a wait
that gives up (gloo's own timeout), a check that does not reach the hung function, and the pure
parts (call graph, causes).
"""

import subprocess
import sys
import time
from pathlib import Path

from persian_words import foreign_words, is_persian
from practice_helpers import SOLUTIONS, grade, variant
from lesson_code.practice.callgraph import first_reached
from lesson_code.practice.grading import hang_hint
from lesson_code.practice.hangs import from_raised, from_timeout

ROOT = Path(__file__).resolve().parents[2]
LEARNER = SOLUTIONS / "collectives_learner.py"
HANG_TIMEOUT_S = 30
POSTED_TOGETHER = ('''    works = [dist.isend(send.contiguous(), right, group=group),
             dist.irecv(recv, left, group=group)]
    for work in works:
        work.wait(timedelta(seconds=timeout_s))
''')
BLOCKING_RECEIVE_FIRST = ('''    dist.recv(recv, left, group=group)  # every rank waits here first
    dist.send(send.contiguous(), right, group=group)
''')


def test_a_deadlock_is_reported_once_within_its_timeout_with_stacks_and_a_persian_hint(
        tmp_path: Path) -> None:
    path = variant(LEARNER, [(POSTED_TOGETHER, BLOCKING_RECEIVE_FIRST)], tmp_path)
    report_file = tmp_path / "report.txt"
    with report_file.open("w") as stdout:
        command = subprocess.Popen(
            [sys.executable, "-m", "lesson_code.practice", "check", "76", str(path), "--lang", "fa",
             "--timeout", str(HANG_TIMEOUT_S)],
            stdout=stdout, stderr=subprocess.PIPE, text=True, cwd=ROOT)
        progress = []  # (when, line) of each line the command writes to stderr
        for text in command.stderr:
            progress.append((time.monotonic(), text))
        returncode = command.wait(timeout=6 * HANG_TIMEOUT_S)
    ended = time.monotonic()
    report, stderr = report_file.read_text(), "".join(text for _, text in progress)
    assert returncode == 1, stderr
    # Once: from the start of the check that hangs (the second), the report comes after one
    # timeout, not two. Timed from that check, not from the command's start, so a slow start-up
    # on a loaded machine (importing torch, the first check) does not count.
    hung_from = [when for when, text in progress if "در حال اجرای" in text][1]
    seconds = ended - hung_from
    assert seconds < 2 * HANG_TIMEOUT_S, f"the deadlock took {seconds:.0f} s to report"
    line = next(number for number, text in enumerate(path.read_text().splitlines(), 1)
                if "dist.recv(recv, left" in text)
    persian_line = str(line).translate(str.maketrans("0123456789", "۰۱۲۳۴۵۶۷۸۹"))
    assert (f"رتبه‌های ۰ و ۱: خط {persian_line} از {path.name}، در _step: "
            "dist.recv(recv, left, group=group)") in report
    assert "فراخوانده از _reduce_scatter" in report
    assert "بن‌بست" in report and "dist.isend" in report and "--timeout" not in report
    assert report.count("[اجرا نشد]") == 4 and "_step" in report.split("[اجرا نشد]")[1]
    assert stderr.count("در حال اجرای") == 2  # checks 1 and 2 ran; 3 to 6 did not
    for text in report.splitlines():
        if is_persian(text):
            assert foreign_words(text) == [], text
    print(f"\n{report}\n(reported in {seconds:.1f} s)")


def test_a_wait_that_gives_up_is_a_hang_too_and_later_checks_that_reach_it_are_skipped(
        tmp_path: Path) -> None:
    gives_up = ('''    dist.irecv(recv, left, group=group).wait(timedelta(seconds=2))
    dist.isend(send.contiguous(), right, group=group).wait(timedelta(seconds=timeout_s))
''')
    path = variant(LEARNER, [(POSTED_TOGETHER, gives_up)], tmp_path)
    started = time.monotonic()
    results = grade(76, path, timeout_s=30)
    assert time.monotonic() - started < 30
    failure = results["all_reduce_sum"].failure
    # The rank reported is the one whose wait gave up, or (a race) its peer, which saw it leave.
    assert failure.kind == "raised" and failure.hang is not None
    assert failure.hang.cause in ("deadlock", "peer_gone"), failure
    assert failure.hang.functions == {"_step"} and "dist.isend" in failure.hint.text("en")
    skipped = [key for key, result in results.items() if result.skipped is not None]
    assert skipped == ["all_reduce_avg", "reduce_scatter", "all_gather", "bytes"]
    assert "ring_reduce_scatter, which calls _step" in results["reduce_scatter"].skipped.text("en")


def test_a_check_that_does_not_reach_the_hung_function_still_runs(tmp_path: Path) -> None:
    inline = ('''    own = _reduce_scatter(chunks, rank, size, group, timeout_s) if size > 1 else chunks[0].clone()
    if op == "avg":''', '''    if size > 1:
        dist.recv(tensor, (rank - 1) % size)  # only ring_all_reduce hangs
    own = _reduce_scatter(chunks, rank, size, group, timeout_s) if size > 1 else chunks[0].clone()
    if op == "avg":''')
    path = variant(LEARNER, [inline], tmp_path)
    results = grade(76, path, timeout_s=5)
    assert results["all_reduce_sum"].failure.kind == "timeout"
    assert results["all_reduce_sum"].failure.hang.functions == {"ring_all_reduce"}
    assert results["all_reduce_avg"].skipped is not None
    assert results["reduce_scatter"].passed and results["all_gather"].passed
    assert results["bytes"].skipped is not None  # it calls ring_all_reduce too


def test_the_call_graph_follows_helpers_and_methods(tmp_path: Path) -> None:
    path = tmp_path / "mine.py"
    path.write_text("def _step(x):\n    return x\n\n"
                    "def _inner(x):\n    return _step(x)\n\n"
                    "def outer(x):\n    return _inner(x)\n\n"
                    "def alone(x):\n    return x + 1\n\n"
                    "class Optimizer:\n    def step(self):\n        self._reduce()\n\n"
                    "    def _reduce(self):\n        return _step(1)\n")
    assert first_reached(str(path), ("alone", "outer"), {"_step"}) == ("outer", "_step")
    assert first_reached(str(path), ("alone",), {"_step"}) is None
    assert first_reached(str(path), ("Optimizer",), {"_step"}) == ("Optimizer", "_step")
    (tmp_path / "broken.py").write_text("def (:\n")
    assert first_reached(str(tmp_path / "broken.py"), ("f",), {"f"}) == ("f", "f")


def test_the_cause_of_a_hang_is_read_from_where_the_ranks_wait(tmp_path: Path) -> None:
    path = tmp_path / "mine.py"
    path.write_text("import torch.distributed as dist\n\n"
                    "def f(t):\n"
                    "    dist.recv(t, 0)  # waits\n"
                    "    while True:\n"
                    "        pass\n"
                    "    dist.send(t, 1)\n")
    grader = "grade_all_reduce (lesson_code/practice/lessons/collectives.py:55)"

    def where(line: int) -> list[str]:
        return [f"f (mine.py:{line})", grader]

    same = from_timeout([0, 1], 2, {0: where(4), 1: where(4)}, str(path))
    assert same.cause == "deadlock" and same.stuck[0][0].source == "dist.recv(t, 0)"
    assert from_timeout([0, 1], 2, {0: where(4), 1: where(7)}, str(path)).cause == "apart"
    assert from_timeout([1], 2, {1: where(4)}, str(path)).cause == "left"
    assert from_timeout([0, 1], 2, {0: where(6), 1: where(6)}, str(path)).cause == "busy"
    assert from_timeout([0, 1], 2, {0: [grader], 1: [grader]}, str(path)).cause == "unknown"
    assert same.functions == {"f"}
    # The torch.distributed call each rank waits in, when the launcher found one, names the hint.
    send, recv = ("send (torch/distributed/distributed_c10d.py:2753)",
                  "recv (torch/distributed/distributed_c10d.py:2799)")
    both_send = from_timeout([0, 1], 2, {0: [send, *where(7)], 1: [send, *where(7)]}, str(path))
    assert both_send.cause == "in_send" and both_send.functions == {"f"}
    assert "blocking dist.send" in hang_hint(both_send).text("en")
    both_receive = from_timeout([0, 1], 2, {0: [recv, *where(4)], 1: [recv, *where(4)]}, str(path))
    assert both_receive.cause == "in_recv"
    assert "blocking dist.recv" in hang_hint(both_receive).text("en")
    mixed = from_timeout([0, 1], 2, {0: [send, *where(7)], 1: [recv, *where(4)]}, str(path))
    assert mixed.cause == "apart"

    def raised(last: str) -> str:
        return (f'Traceback (most recent call last):\n  File "{path}", line 4, in f\n'
                f"    dist.recv(t, 0)\n{last}")

    gave_up = from_raised(1, raised("RuntimeError: [..] Timed out waiting 2000ms for recv"), str(path))
    assert gave_up.cause == "deadlock" and gave_up.functions == {"f"}
    peer = from_raised(0, raised("RuntimeError: [..] Connection closed by peer [127.0.0.1]:1"),
                       str(path))
    assert peer.cause == "peer_gone" and peer.functions == {"f"}
    assert from_raised(0, raised("ValueError: bad"), str(path)) is None

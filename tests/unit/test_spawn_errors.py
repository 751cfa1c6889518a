"""What `launch.spawn`'s errors say about a run that did not complete, read from the stacks of the
ranks (as faulthandler writes them) and from what each rank reported, in one process.
"""

import sysconfig
from pathlib import Path

from lesson_code.practice.hangs import from_timeout
from lesson_code.runtime.errors import RankTimeoutError, waiting_calls

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "lesson_code"
TORCH = Path(sysconfig.get_paths()["purelib"]) / "torch"


def faulthandler_text(frames: list[tuple[Path, int, str]]) -> str:
    """The stacks of a rank's two threads as faulthandler writes them: the pipe watch, then the
    thread that runs the rank's function, `frames` innermost first, above rank_main."""
    watch = [(PACKAGE / "runtime" / "processes.py", 132, "_exit_when_closed")]
    body = frames + [(PACKAGE / "runtime" / "processes.py", 86, "rank_main"),
                     (Path("<string>"), 1, "<module>")]

    def block(title, stack):
        return "\n".join([title] + [f'  File "{path}", line {line} in {function}'
                                    for path, line, function in stack])
    return (block("Thread 0x00007f7f214806c0 (most recent call first):", watch) + "\n\n"
            + block("Current thread 0x00007f7f43a96b80 (most recent call first):", body) + "\n")


def test_the_learners_line_is_kept_below_any_depth_of_the_packages_frames(tmp_path):
    """A wait deep inside the package (ZeroOptimizer.step, through the ring collectives, seven
    frames of the package) still names the learner's line that called it, so a practice check
    can say where the learner's code waited, and skip the later checks that call it."""
    learner = tmp_path / "capstone_learner.py"
    learner.write_text("\n" * 59 + "        optimizer.step()  # waits here\n")
    package_frames = [
        (PACKAGE / "collectives" / "p2p.py", 70, "wait_all"),
        (PACKAGE / "collectives" / "ring.py", 120, "_ring_step"),
        (PACKAGE / "collectives" / "ring.py", 150, "ring_reduce_scatter"),
        (PACKAGE / "collectives" / "comm.py", 90, "reduce_scatter"),
        (PACKAGE / "zero.py", 221, "_reduce_gradient"),
        (PACKAGE / "zero.py", 150, "step"),
        (PACKAGE / "zero.py", 148, "step"),
    ]
    grader = [(PACKAGE / "practice" / "lessons" / "capstone_resume.py", 40, "train_rank"),
              (PACKAGE / "practice" / "rank_checks.py", 30, "run_guarded")]
    stacks = faulthandler_text(package_frames + [(learner, 60, "run_rank")] + grader)
    calls = waiting_calls(stacks)
    assert "run_rank (capstone_learner.py:60)" in calls, calls
    assert calls[0] == "wait_all (lesson_code/collectives/p2p.py:70)"  # innermost first
    assert len([call for call in calls if "lesson_code/" in call]) == 6  # the package's, bounded

    hang = from_timeout([0, 1], 2, {0: calls, 1: calls}, str(learner))
    assert hang.functions == {"run_rank"} and hang.cause != "unknown"
    assert hang.stuck[0][6].source == "optimizer.step()"


def test_the_torch_distributed_call_a_rank_waits_in_comes_first(tmp_path):
    """torch's own frames stay hidden, but the call the learner made into torch.distributed is
    named: it is what the rank is blocked in (not c10d's logging wrapper around it)."""
    learner = tmp_path / "ring.py"
    stacks = faulthandler_text([
        (TORCH / "distributed" / "distributed_c10d.py", 2753, "send"),
        (TORCH / "distributed" / "c10d_logger.py", 83, "wrapper"),
        (learner, 4, "exchange")])
    assert waiting_calls(stacks) == ["send (torch/distributed/distributed_c10d.py:2753)",
                                     "exchange (ring.py:4)"]
    computing = faulthandler_text([(TORCH / "nn" / "modules" / "linear.py", 125, "forward"),
                                   (learner, 9, "train")])
    assert waiting_calls(computing) == ["train (ring.py:9)"]


def test_the_hint_of_a_hang_says_what_the_calls_the_ranks_wait_in_show():
    def hint(where):  # both ranks were still running
        return str(RankTimeoutError([0, 1], 2, 3.0, where=where)).splitlines()[-1]

    send = ["send (torch/distributed/distributed_c10d.py:2753)", "exchange (ring.py:4)"]
    recv = ["recv (torch/distributed/distributed_c10d.py:2799)", "exchange (ring.py:5)"]
    both_send = hint({0: send, 1: send})
    assert both_send.startswith("Every rank waits in a blocking dist.send")
    assert "blocking dist.recv" not in both_send and "dist.isend" in both_send
    both_receive = hint({0: recv, 1: recv})
    assert both_receive.startswith("Every rank waits in a blocking dist.recv")
    assert "blocking dist.send" not in both_receive
    assert hint({0: send, 1: recv}).startswith("The ranks wait in different places")
    waiting = ["exchange (ring.py:7)"]  # on a handle's wait(): no torch.distributed frame
    same = hint({0: waiting, 1: waiting})
    assert same.startswith("Every rank waits in the same place") and "dist." not in same
    assert hint({0: send}).startswith("Not every rank said where it was waiting")

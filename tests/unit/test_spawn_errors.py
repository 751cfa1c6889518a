"""What `launch.spawn`'s errors say about a run that did not complete, read from the stacks of the
ranks (as faulthandler writes them) and from what each rank reported, in one process.
"""

import sysconfig
from pathlib import Path

from lesson_code.practice.hangs import from_timeout
from lesson_code.runtime.errors import waiting_calls

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
    stacks = faulthandler_text([(TORCH / "distributed" / "distributed_c10d.py", 2753, "recv")]
                               + package_frames + [(learner, 60, "run_rank")] + grader)
    calls = waiting_calls(stacks)
    assert "run_rank (capstone_learner.py:60)" in calls, calls
    assert calls[0] == "wait_all (lesson_code/collectives/p2p.py:70)"  # innermost first
    assert len([call for call in calls if "lesson_code/" in call]) == 6  # the package's, bounded

    hang = from_timeout([0, 1], 2, {0: calls, 1: calls}, str(learner))
    assert hang.functions == {"run_rank"} and hang.cause != "unknown"
    assert hang.stuck[0][6].source == "optimizer.step()"

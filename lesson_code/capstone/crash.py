"""A capstone run killed part-way and run again (lesson 81): what the crash costs, measured.

    result = crash_and_continue("/tmp/lesson81-crash", lang="fa")
    figures.crash_figure(result, lang="fa")       # lesson_code.plots.capstone

Two runs of `python -m lesson_code.capstone` on spawned ranks, each a subprocess that may run
at most `timeout_s` seconds (past it, the subprocess and every rank it started are killed and
the call raises TimeoutError, so a notebook cell never hangs), then one for comparison:

1. with `--kill-at-step`: the last rank kills itself (SIGKILL) after that step, the command
   exits with status 1, and the checkpoints saved before stay on disk;
2. the same command again, in the same folder: it continues from the newest checkpoint that
   verifies (the crash option fires only in a run that starts at step 0);
3. the same run never stopped: `train.run_rank` on ranks spawned from this process (the code
   path of the command's own ranks).

It returns each run's loss curve (its metrics.jsonl) and wall time, the step after which the
rank died and the step the second run resumed from (its run.json), and whether the continued
run ended bitwise where the uninterrupted one did: every loss, and every tensor of the two runs'
last checkpoints (each rank's shard and the weights), read back in this process.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from lesson_code import launch
from lesson_code.capstone.config import CapstoneConfig
from lesson_code.capstone.report import read_metrics
from lesson_code.capstone.resume import same_shard
from lesson_code.capstone.train import run_rank
from lesson_code.checkpoint.staging import step_folder
from lesson_code.harness.validate import require_positive, require_positive_int


@dataclass(frozen=True)
class CrashAndResume:
    """What `crash_and_continue` measured. Curves are metrics rows ({"step", "loss", ...}, and
    guard events if any): `killed` holds steps 1..crash_step, `continued` the whole continued
    run (the history its checkpoint held, then the steps it trained), `uninterrupted` all steps.
    `seconds` has the keys "killed" and "continued" (each command from process start to exit,
    its own checks included) and "uninterrupted" (the spawned ranks' run, from the call to
    their results). `report` is the resume checks the continued run printed, in the language
    asked for."""

    killed: list[dict]
    continued: list[dict]
    uninterrupted: list[dict]
    crash_step: int
    resume_step: int
    restarted_steps: int
    seconds: dict[str, float]
    same_losses: bool
    same_checkpoint: bool
    report: str

    def summary(self) -> dict:
        """What a lesson shows of it, by English label (`plots.capstone.table` translates).

        Not the seconds: each is a whole command (starting Python, importing torch, spawning the
        ranks, the run's own checks), not the cost of the crash, and on a loaded machine they vary
        more than the work they contain."""
        return {"killed after step": self.crash_step, "resumed from step": self.resume_step,
                "steps trained twice": self.restarted_steps,
                "same losses": self.same_losses, "same last checkpoint": self.same_checkpoint}


def crash_and_continue(folder: Path | str, *, world_size: int = 4, steps: int = 12,
                       checkpoint_every: int = 4, kill_at_step: int = 10,
                       kill_during_save: bool = False, lang: str = "en",
                       timeout_s: float = 300.0) -> CrashAndResume:
    """Kill a capstone run after `kill_at_step` (or, with `kill_during_save`, half-way through
    that step's save), run the same command again, and compare with a run that never stopped.

    Writes under `folder`: run/ (the killed and continued run) and uninterrupted/, each deleted
    first if it is there (a run left in it would be continued). Checkpoints
    are saved after every `checkpoint_every` steps and after the last. Raises ValueError when
    the kill comes before the first checkpoint (nothing to continue from) or is not a save step
    with `kill_during_save`, RuntimeError when a run does not end as it should (the first not
    killed, another failing; with its output), TimeoutError past `timeout_s` for one run.
    """
    for name, value in (("world_size", world_size), ("steps", steps),
                        ("checkpoint_every", checkpoint_every), ("kill_at_step", kill_at_step)):
        require_positive_int(name, value)
    require_positive("timeout_s", timeout_s, "the seconds one run may take, such as 300")
    if not checkpoint_every <= kill_at_step <= steps:
        raise ValueError(f"kill_at_step={kill_at_step} must lie from checkpoint_every="
                         f"{checkpoint_every} (the first checkpoint, to continue from) to "
                         f"steps={steps}")
    if kill_during_save and kill_at_step % checkpoint_every and kill_at_step != steps:
        raise ValueError(f"kill_during_save: no checkpoint is saved after step {kill_at_step}; "
                         f"pass a multiple of checkpoint_every={checkpoint_every}")
    folder = Path(folder)
    run, uninterrupted = folder / "run", folder / "uninterrupted"
    for old in (run, uninterrupted):
        shutil.rmtree(old, ignore_errors=True)
    settings = ["--world-size", str(world_size), "--steps", str(steps), "--checkpoint-step",
                str(checkpoint_every), "--checkpoint-every", str(checkpoint_every), "--lang", lang]
    crash = ["--kill-at-step", str(kill_at_step), *(["--kill-during-save"] if kill_during_save else [])]
    seconds = {}
    code, out, err, seconds["killed"] = _capstone(["--out-dir", str(run), *settings, *crash], timeout_s)
    if code == 0:
        raise RuntimeError(f"the run with --kill-at-step {kill_at_step} was not killed:\n{out[-2000:]}")
    killed = read_metrics(run / "metrics.jsonl")
    code, out, err, seconds["continued"] = _capstone(["--out-dir", str(run), *settings, *crash], timeout_s)
    _check_finished("the run started again", code, out, err)
    report = out.rstrip().rsplit("\n\n", 1)[-1]
    started = _summary(run)["started"]
    config = CapstoneConfig(out_dir=str(uninterrupted), world_size=world_size, steps=steps,
                            checkpoint_step=checkpoint_every, checkpoint_every=checkpoint_every)
    start = time.perf_counter()
    launch.spawn(run_rank, config, world_size=world_size, timeout_s=timeout_s)
    seconds["uninterrupted"] = time.perf_counter() - start
    continued, straight = read_metrics(run / "metrics.jsonl"), read_metrics(uninterrupted / "metrics.jsonl")
    resume_step = started["from_step"]
    return CrashAndResume(
        killed=killed, continued=continued, uninterrupted=straight, crash_step=kill_at_step,
        resume_step=resume_step, restarted_steps=kill_at_step - resume_step, seconds=seconds,
        same_losses=_curve(continued) == _curve(straight) and bool(_curve(straight)),
        same_checkpoint=same_tensors(step_folder(run / "checkpoints", steps),
                                     step_folder(uninterrupted / "checkpoints", steps), world_size),
        report=report)


def same_tensors(a: Path, b: Path, world_size: int) -> bool:
    """Do two checkpoints of `world_size` ranks hold equal tensors, every rank's shard and the
    replicated weights? One process, no group; every file is verified as it is read."""
    return all(same_shard(a, b, rank, world_size) for rank in range(world_size))


def _curve(rows: list[dict]) -> list[tuple[int, float]]:
    return [(row["step"], row["loss"]) for row in rows if "event" not in row]


def _summary(out_dir: Path) -> dict:
    return json.loads((out_dir / "run.json").read_text(encoding="utf-8"))


def _check_finished(what: str, code: int, out: str, err: str) -> None:
    if code != 0:
        raise RuntimeError(f"{what} exited with status {code}:\n{out[-2000:]}\n{err[-3000:]}")


def _capstone(arguments: list[str], timeout_s: float) -> tuple[int, str, str, float]:
    """Run `python -m lesson_code.capstone arguments`: (exit status, stdout, stderr, seconds).

    The command leads a process group of its own, with its fork server and ranks in it; past
    `timeout_s`, or if this call is interrupted, the whole group is killed.
    """
    environment = dict(os.environ, TORCH_CPP_LOG_LEVEL="ERROR")
    environment.pop("RANK", None)  # never a torchrun worker's copy: the command spawns its ranks
    environment.pop("WORLD_SIZE", None)
    start = time.perf_counter()
    process = subprocess.Popen([sys.executable, "-m", "lesson_code.capstone", *arguments],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=environment, start_new_session=True)
    try:
        out, err = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise TimeoutError(f"python -m lesson_code.capstone {' '.join(arguments)} ran past "
                           f"{timeout_s} s; it and its ranks were stopped") from None
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
    return process.returncode, out, err, time.perf_counter() - start

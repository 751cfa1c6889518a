"""Practice for lesson 81: the capstone's rank function with its resume, written by the learner.

The learner writes `run_rank(rank, world_size, config, start_from=None)` with the signature of
`lesson_code.capstone.train.run_rank`, from the course's building blocks (MiniGPT, the corpus,
`broadcast_parameters`, `ZeroOptimizer`, `save_zero` / `load_zero`): build, resume from
`start_from` if given (weights, optimizer shard, step, data position), train, save after
`config.checkpoint_step`, and return the records, parameters, final state and checkpoints. The
grading run is short (6 steps, a checkpoint after step 3, the tiny MiniGPT) over a corpus long
enough that every step reads another batch, so a resume at the wrong data position shows.

- losses: on 2 and 4 ranks, each step's loss is the course's `run_rank`'s (same rank, same
  config, same threads) within `LOSS_TOLERANCE`, and the final parameters are within
  `PARAMS_RELATIVE` of the course's (relative to how far training moved them);
- resume: on 3 ranks (ZeRO pads the flat vector), the learner's run resumed from its own step-3
  checkpoint ends bit for bit where the learner's uninterrupted run ends
  (`capstone.train.compare_resumed`): steps, losses, parameters, master shard, both Adam
  moments, Adam's step count, the RNG state. Exactness is right here because both runs take the
  learner's one code path on one world size.
"""

from __future__ import annotations

import dataclasses
import itertools
import shutil
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

from lesson_code.capstone import CapstoneConfig, MiniGPT
from lesson_code.capstone import run_rank as course_run_rank
from lesson_code.capstone.train import COMPARED, compare_resumed
from lesson_code.experiment import flat_parameters
from lesson_code.harness.timing import slowest_rank
from lesson_code.practice.grading import (Check, CheckFailed, Failure, Lesson, fail_on_first,
                                          load_learner, run_ranks)
from lesson_code.practice.messages import Phrase, every_rank, phrase
from lesson_code.practice.rank_checks import compare, during
from lesson_code.practice.timing import Timing

NAMES = ("run_rank",)
STEPS, CHECKPOINT_STEP = 6, 3
LOSS_WORLD_SIZES = (2, 4)
RESUME_WORLD_SIZE = 3
# Another correct loop may sum a step's loss or gradients in another order (the mean over
# ranks, micro-batches): the course's own tests allow 1e-5 on each loss for that
# (tests/dist/test_capstone.py, accumulation), and 1e-2 on the final parameters' distance
# relative to how far training moved them (tests/dist/tolerances.py: correct runs measured at
# most 1.3e-4, a wrong gradient 1.3 or more).
LOSS_TOLERANCE = 1e-5
PARAMS_RELATIVE = 1e-2
TIMED_TRIALS = 3
RESULT_KEYS = ("records", "params", "final_state", "checkpoints")


def grading_config(world_size: int, out_dir: str) -> CapstoneConfig:
    """The graded run: 6 steps, a checkpoint after step 3, a distinct batch at every step."""
    return CapstoneConfig(steps=STEPS, checkpoint_step=CHECKPOINT_STEP, world_size=world_size,
                          out_dir=out_dir, corpus_batches=STEPS)


def result_failures(result, *, case: Phrase, rank: int) -> list[Failure]:
    """A Failure when `result` lacks what the graders read (the keys of RESULT_KEYS, records with
    "step" and "loss", a final_state with every key of COMPARED); [] when it has it all."""
    expected = None
    if not isinstance(result, dict) or not set(RESULT_KEYS) <= set(result):
        got, expected = (sorted(result) if isinstance(result, dict) else type(result).__name__,
                         phrase("a dict with the keys {keys}", "دیکشنری‌ای با کلیدهای `{keys}`",
                                keys=", ".join(map(repr, RESULT_KEYS))))
    elif not all(isinstance(row, dict) and {"step", "loss"} <= set(row)
                 for row in result["records"]):
        got, expected = (phrase("rows of result['records'] without 'step' or 'loss'",
                                "سطرهایی از `result['records']` بی `'step'` یا `'loss'`"),
                         '[{"step": 1, "loss": 4.4}, ...]')
    elif not (isinstance(result["final_state"], dict)
              and set(COMPARED) <= set(result["final_state"])):
        got, expected = (sorted(result["final_state"]) if isinstance(result["final_state"], dict)
                         else type(result["final_state"]).__name__,
                         phrase("a final_state with the keys {keys}",
                                "یک `final_state` با کلیدهای `{keys}`",
                                keys=", ".join(map(repr, COMPARED))))
    elif not isinstance(result["params"], torch.Tensor):
        got, expected = type(result["params"]).__name__, "flat_parameters(model)"
    elif not isinstance(result["checkpoints"], dict):
        got, expected = (type(result["checkpoints"]).__name__,
                         phrase("a dict from step to folder", "دیکشنری‌ای از گام به پوشه"))
    if expected is None:
        return []
    return [Failure("value", {"case": case, "case_index": 0, "rank": rank,
                              "what": "run_rank(...)", "got": got, "expected": expected})]


def _everyone_ok(failures: list[Failure]) -> bool:
    """Collective: True when no rank found a failure (so that all go on, or all stop, together)."""
    flags = [None] * dist.get_world_size()
    dist.all_gather_object(flags, not failures)
    return all(flags)


def grade_losses(rank: int, world_size: int, path: str, out_dir: str) -> list[Failure]:
    """Rank function: the learner's run against the course's run_rank, in this same rank."""
    learner = load_learner(path)
    config = grading_config(world_size, f"{out_dir}/course")
    case = phrase("all {n} ranks, {steps} steps", "همهٔ {n} رتبه، {steps} گام", n=world_size,
                  steps=STEPS)
    torch.manual_seed(config.seed)  # rank 0's initial model, which the broadcast gives every rank
    start = flat_parameters(MiniGPT(config.gpt))
    with during(case):
        yours = learner.run_rank(rank, world_size,
                                 dataclasses.replace(config, out_dir=f"{out_dir}/yours"))
    course = course_run_rank(rank, world_size, config)  # seeds itself, as the learner's must
    failures = result_failures(yours, case=case, rank=rank)
    if failures:
        return failures
    steps = [row["step"] for row in yours["records"]]
    if steps != list(range(1, STEPS + 1)):
        return [Failure("value", {"case": case, "case_index": 0, "rank": rank,
                                  "what": "[row['step'] for row in result['records']]",
                                  "got": steps, "expected": list(range(1, STEPS + 1))})]
    expected = torch.tensor([row["loss"] for row in course["records"]], dtype=torch.float64)
    got = torch.tensor([float(row["loss"]) for row in yours["records"]], dtype=torch.float64)
    found = compare(got, expected, torch.full_like(expected, LOSS_TOLERANCE), case=case,
                    case_index=1, rank=rank, reference=phrase("the course's run_rank",
                                                              "`run_rank` درس"),
                    element_of=phrase("the losses, one per step from step 1",
                                      "زیان‌ها، یکی برای هر گام از گام ۱"))
    if found:
        return [found]
    reference = course["params"].cpu()
    moved = (reference - start).norm()
    distance = ((yours["params"].detach().double().cpu() - reference).norm() / moved).item()
    if not distance <= PARAMS_RELATIVE:
        return [Failure("value", {"case": case, "case_index": 2, "rank": rank,
                                  "what": "|params - course| / |course - start|",
                                  "got": distance,
                                  "expected": phrase("at most {bound}", "حداکثر {bound}",
                                                     bound=PARAMS_RELATIVE)})]
    return []


def _kept(result: dict) -> dict:
    """What `compare_resumed` reads of a run's result, by value (tensors on the CPU)."""
    state = {key: result["final_state"][key] for key in COMPARED}
    return {"records": [{"step": row["step"], "loss": row["loss"]} for row in result["records"]],
            "final_state": {key: value.detach().cpu() if isinstance(value, torch.Tensor) else value
                            for key, value in state.items()}}


def run_and_resume(rank: int, world_size: int, path: str, out_dir: str) -> dict:
    """Rank function: the learner's run, then the learner's resume from its step-3 checkpoint.

    Returns {"failures": [...]} and, when both runs returned what the graders read, this rank's
    "straight" and "resumed" results. Each run writes under its own folder.
    """
    learner = load_learner(path)
    config = grading_config(world_size, f"{out_dir}/straight")
    case = phrase("{call} on all {n} ranks", "`{call}` روی همهٔ {n} رتبه", call="run_rank(config)",
                  n=world_size)
    with during(case):
        straight = learner.run_rank(rank, world_size, config)
    failures = result_failures(straight, case=case, rank=rank)
    folder = None if failures else straight["checkpoints"].get(CHECKPOINT_STEP)
    if not failures and folder is None:
        failures = [Failure("no_checkpoint", {"case": case, "step": CHECKPOINT_STEP})]
    if not _everyone_ok(failures):
        return {"failures": failures}
    dist.barrier()  # every rank has finished the first run before any resumes
    again = dataclasses.replace(config, out_dir=f"{out_dir}/resumed")
    case = phrase("{call} on all {n} ranks", "`{call}` روی همهٔ {n} رتبه", n=world_size,
                  call=f"run_rank(config, start_from='{Path(folder).name}')")
    with during(case):
        resumed = learner.run_rank(rank, world_size, again, str(folder))
    failures = result_failures(resumed, case=case, rank=rank)
    if failures:
        return {"failures": failures}
    return {"failures": [], "straight": _kept(straight), "resumed": _kept(resumed)}


def _scratch() -> str:
    return tempfile.mkdtemp(prefix="practice_capstone_")



def _losses_check(path: str, timeout_s: float) -> None:
    for world_size in LOSS_WORLD_SIZES:
        out_dir = _scratch()
        try:
            fail_on_first(run_ranks(grade_losses, path, out_dir, world_size=world_size,
                                    timeout_s=timeout_s, case=every_rank(world_size)))
        finally:
            shutil.rmtree(out_dir, ignore_errors=True)


def _resume_check(path: str, timeout_s: float) -> None:
    out_dir = _scratch()
    try:
        results = run_ranks(run_and_resume, path, out_dir, world_size=RESUME_WORLD_SIZE,
                            timeout_s=timeout_s, case=every_rank(RESUME_WORLD_SIZE))
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    fail_on_first([result["failures"] for result in results])
    verdicts = compare_resumed([r["straight"] for r in results], [r["resumed"] for r in results])
    differing = [name for name, same in verdicts.items() if not same]
    if differing:
        raise CheckFailed(Failure("resumed", {
            "case": phrase("all {n} ranks, {steps} steps", "همهٔ {n} رتبه، {steps} گام",
                           n=RESUME_WORLD_SIZE, steps=STEPS),
            "step": CHECKPOINT_STEP, "what": ", ".join(map(repr, differing))}))


def time_runs(rank: int, world_size: int, path: str,
              out_dir: str) -> tuple[list[float], list[float]]:
    """Rank function: (learner's, course's) slowest-rank seconds of one graded run, per trial.

    Each trial times the learner's run and then the course's, after one of each to warm up, so
    that a machine busy with something else slows both alike. A whole run is long enough to
    time once per trial. Every run writes under a folder of its own.
    """
    learner = load_learner(path)
    runs = itertools.count()
    samples: dict[str, list[float]] = {"yours": [], "course": []}
    for trial in range(TIMED_TRIALS + 1):
        for name, run_rank in (("yours", learner.run_rank), ("course", course_run_rank)):
            config = grading_config(world_size, str(Path(out_dir) / str(next(runs))))
            dist.barrier()
            started = time.perf_counter()
            run_rank(rank, world_size, config)
            if trial:  # trial 0 warms up
                samples[name].append(time.perf_counter() - started)
    return ([slowest_rank(seconds) for seconds in samples["yours"]],
            [slowest_rank(seconds) for seconds in samples["course"]])


def timing(path: str, timeout_s: float) -> Timing:
    """The learner's 6-step run against the course's run_rank, on 2 ranks."""
    out_dir = _scratch()
    try:
        yours, course = run_ranks(time_runs, path, out_dir, world_size=2, timeout_s=timeout_s,
                                  case="timing")[0]
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    return Timing(phrase("run_rank, MiniGPT, {steps} steps", "`run_rank`، `MiniGPT`، {steps} گام",
                         steps=STEPS), 2, tuple(yours), tuple(course))


CHECKS = (
    Check("losses",
          {"en": "each step's loss and the final parameters match the course's run_rank",
           "fa": "زیان هر گام و پارامترهای پایانی با `run_rank` درس یکی است"},
          {"en": "seed with torch.manual_seed(config.seed + rank) before MiniGPT, broadcast rank "
                 "0's parameters, zero_grad every step, and record global_mean(loss): the mean "
                 "over ranks, not this rank's loss",
           "fa": "پیش از ساختن MiniGPT بذر تصادفی را با `torch.manual_seed(config.seed + rank)` "
                 "تعیین کنید، پارامترهای رتبهٔ ۰ را بازپخش کنید، در هر گام `zero_grad` کنید و "
                 "`global_mean(loss)` یعنی میانگین روی رتبه‌ها را ثبت کنید، نه زیان همین رتبه را"},
          _losses_check, needs=NAMES),
    Check("resume",
          {"en": "resumed from step 3's checkpoint, the run ends bit for bit as if it never "
                 "stopped",
           "fa": "اجرای ادامه‌یافته از چکپوینت گام ۳ بیت‌به‌بیت مانند اجرای بی‌وقفه تمام "
                 "می‌شود"},
          {"en": "load_zero into the model and the optimizer you train with (not a fresh one), "
                 "and resume both the step and the data position that the checkpoint's extra holds",
           "fa": "با `load_zero` در همان مدل و بهینه‌سازی بارگذاری کنید که با آن آموزش می‌دهید (نه "
                 "بهینه‌سازی تازه)، و هم گام و هم جایگاه داده را از `extra` چکپوینت از سر بگیرید"},
          _resume_check, needs=NAMES),
)

LESSON = Lesson(81, "my_capstone.py", NAMES, CHECKS, timing)

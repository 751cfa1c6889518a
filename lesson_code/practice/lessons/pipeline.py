"""Practice for lesson 79: the learner's pipeline schedules and one pipelined training step.

The learner writes `schedule_order(schedule, stage, num_stages, micro_batches)` (the course's
signature, `lesson_code.pipeline`) and `pipelined_step(layers, loss_fn, inputs, targets,
micro_batches, schedule, activation_shape, *, group, timeout_s)`, the work of the course's
`PipelineStage.train_step` as one function. The schedule checks compare every stage's order with
the course's for 1 to 5 stages and 1 to 8 micro-batches (fewer micro-batches than stages
included) after checking its properties. The step's checks run 1 to 4 stages (sub-groups of
four gloo ranks) on the MLP and MiniGPT, both schedules, 1, 3 and 4 micro-batches, against the
unsplit model on the whole batch; they record the forwards and backwards each stage executes,
and count the bytes each stage sends.
"""

from __future__ import annotations

import torch

from lesson_code.models import loss_function
from lesson_code.pipeline import SCHEDULES, PipelineStage, schedule_order
from lesson_code.pipeline_lab import PipeRun, stage_module
from lesson_code.practice.grading import (Check, Failure, Lesson, fail_on_first, load_learner,
                                          run_ranks)
from lesson_code.practice.lessons.pipeline_support import (HEADER_BYTES, STAGE_COUNTS,
                                                           activation_shape, gradient_failures,
                                                           order_text, recorded_order,
                                                           schedule_problem, stage_groups,
                                                           stage_inputs)
from lesson_code.practice.messages import Phrase, every_rank, phrase
from lesson_code.practice.rank_checks import counted_sends, during
from lesson_code.practice.timing import Timing, paired_rounds

NAMES = ("schedule_order", "pipelined_step")
SCHEDULE_CASES = [(p, m, s) for p in range(1, 6) for m in range(1, 9) for s in range(p)]
# (arguments, the bad value the error must name)
BAD_ARGUMENTS = [(("interleaved", 0, 4, 2), "interleaved"), (("gpipe", 7, 4, 2), "7"),
                 (("1f1b", -1, 4, 2), "-1"), (("1f1b", 0, 0, 2), "0"),
                 (("gpipe", 0, 4, -3), "-3"), (("1f1b", 0, 4, 0), "0")]
MODEL_NAMES = {"mlp": "MLP", "gpt": "MiniGPT"}
MICRO_BATCHES = (1, 3, 4)
BATCH = 12  # divisible by every micro-batch count above


def _call(args: tuple) -> str:
    return "schedule_order(" + ", ".join(map(repr, args)) + ")"


def grade_schedule(rank: int, world_size: int, path: str, schedule: str) -> list[Failure]:
    """Rank function: the learner's order has the schedule's properties and is the course's."""
    learner = load_learner(path)
    for index, (p, m, s) in enumerate(SCHEDULE_CASES):
        case = _call((schedule, s, p, m))
        with during(case):
            got = learner.schedule_order(schedule, s, p, m)
        expected = schedule_order(schedule, s, p, m)
        problem = schedule_problem(got, schedule, s, p, m)
        if problem is not None:
            what, found, wanted = problem
            return [Failure("value", {"case": case, "case_index": index, "what": what,
                                      "got": found, "expected": wanted})]
        if [tuple(step) for step in got] != expected:
            return [Failure("order", {"case": case, "case_index": index, "stage": s,
                                      "got": order_text(got), "expected": order_text(expected)})]
    return []


def grade_errors(rank: int, world_size: int, path: str) -> list[Failure]:
    """Rank function: each bad argument raises ValueError naming the value (other errors rise)."""
    learner = load_learner(path)
    for index, (args, value) in enumerate(BAD_ARGUMENTS):
        where = {"case": _call(args), "case_index": index}
        try:
            returned = learner.schedule_order(*args)
        except ValueError as error:
            if value not in str(error):
                return [Failure("value", {**where, "got": repr(str(error)),
                                          "what": phrase("the ValueError's message",
                                                         "پیام ValueError"),
                                          "expected": phrase("a message naming {value}",
                                                             "پیامی که `{value}` را نام ببرد",
                                                             value=repr(value))})]
            continue
        return [Failure("not_raised", {**where, "got": repr(returned)[:60],
                                       "expected": "ValueError"})]
    return []


def _step_cases(model: str) -> list[tuple[int, PipeRun]]:
    """(stages, run) of the step checks, in the same order on every rank."""
    return [(p, PipeRun(model=model, schedule=schedule, micro_batches=m, batch_size=BATCH))
            for p in STAGE_COUNTS for schedule in SCHEDULES for m in MICRO_BATCHES]


def _case(stages: int, run: PipeRun, world_size: int) -> Phrase:
    if stages == world_size:
        ranks = every_rank(world_size)
    elif stages == 1:
        ranks = phrase("rank {zero} of {n}", "رتبهٔ {zero} از {n}", zero=0, n=world_size)
    else:
        ranks = phrase("ranks {zero} to {last} of {n}", "رتبه‌های {zero} تا {last} از {n}", zero=0,
                       last=stages - 1, n=world_size)
    return phrase("{model} on {stages} stages ({ranks}), schedule {schedule}, {sizes}",
                  "{model} روی {stages} مرحله ({ranks})، زمان‌بندی `{schedule}`، `{sizes}`",
                  model=MODEL_NAMES[run.model], stages=stages, ranks=ranks,
                  schedule=repr(run.schedule),
                  sizes=f"micro_batches={run.micro_batches}, batch={run.batch_size}")


def _learner_step(learner, module, run: PipeRun, group, step: int = 0):
    """Call the learner's pipelined_step on this stage's `module` for batch `step` of `run`."""
    x, y = run.batch(step)
    return learner.pipelined_step(module, loss_function(run.model), x, y, run.micro_batches,
                                  run.schedule, activation_shape(run), group=group)


def grade_gradients(rank: int, world_size: int, path: str) -> list[Failure]:
    """Rank function: loss and gradients of every stage equal the unsplit model's (1-4 stages)."""
    learner = load_learner(path)
    groups = stage_groups(world_size)
    cases = [(p, run, 1) for model in ("mlp", "gpt") for p, run in _step_cases(model)]
    cases.append((2, PipeRun(model="gpt", schedule="1f1b", micro_batches=4, batch_size=BATCH), 2))
    failures = []
    for index, (p, run, steps) in enumerate(cases):
        if rank >= p:
            continue
        case = _case(p, run, world_size)
        if steps > 1:
            case = phrase("{case}, {steps} steps without zero_grad",
                          "{case}، {steps} گام بی `zero_grad`", case=case, steps=steps)
        module, (start, _) = stage_module(run, rank, p)
        with during(case):
            losses = [_learner_step(learner, module, run, groups[p], step) for step in range(steps)]
        failures += gradient_failures(module, start, losses[-1], run, steps, rank == p - 1,
                                      case=case, case_index=index, rank=rank)[:1]
    return failures


def grade_order(rank: int, world_size: int, path: str) -> list[Failure]:
    """Rank function: each stage runs its forwards and backwards in the schedule's order."""
    learner = load_learner(path)
    groups = stage_groups(world_size)
    cases = [(p, PipeRun(model="mlp", schedule=schedule, micro_batches=m, batch_size=BATCH))
             for p in STAGE_COUNTS if p > 1 for schedule in SCHEDULES for m in (1, 3, 4, 6)]
    failures = []
    for index, (p, run) in enumerate(cases):
        if rank >= p:
            continue
        module, (start, _) = stage_module(run, rank, p)
        with during(_case(p, run, world_size)), recorded_order(module, stage_inputs(run, start)) as order:
            _learner_step(learner, module, run, groups[p])
        expected = schedule_order(run.schedule, rank, p, run.micro_batches)
        if order != expected:
            failures.append(Failure("order", {"case": _case(p, run, world_size), "case_index": index,
                                              "stage": rank, "got": order_text(order),
                                              "expected": order_text(expected)}))
    return failures


def grade_bytes(rank: int, world_size: int, path: str) -> list[Failure]:
    """Rank function: a stage sends its activations forward and its input gradients back, no more.

    Per micro-batch a stage may add a small header to each activation (the course's sends
    HEADER_BYTES describing the shape); anything else is extra traffic.
    """
    learner = load_learner(path)
    groups = stage_groups(world_size)
    cases = [(p, PipeRun(model="gpt", schedule="1f1b", micro_batches=m, batch_size=BATCH))
             for p in STAGE_COUNTS if p > 1 for m in (1, 4)]
    failures = []
    for index, (p, run) in enumerate(cases):
        if rank >= p:
            continue
        module, _ = stage_module(run, rank, p)
        with during(_case(p, run, world_size)), counted_sends() as counts:
            _learner_step(learner, module, run, groups[p])
        m, activation = run.micro_batches, torch.Size(activation_shape(run)).numel() * 4
        forwards, backwards = rank < p - 1, rank > 0
        low = m * activation * (forwards + backwards)
        high = low + m * HEADER_BYTES * forwards
        if not low <= counts["bytes"] <= high:
            failures.append(Failure("bytes", {
                "case": _case(p, run, world_size), "case_index": index, "rank": rank,
                "got": counts["bytes"],
                "expected": phrase("{low} to {high}", "{low} تا {high}", low=low, high=high)
                if high != low else low,
                "expected_what": phrase(
                    "stage {stage} of {p} ({m} activations forward, {m} input gradients back, "
                    "in float32)", "مرحلهٔ {stage} از {p} ({m} فعال‌سازی به جلو و {m} گرادیان "
                    "ورودی به عقب، با float32)", stage=rank, p=p, m=m)}))
    return failures


def _on_four_ranks(rank_fn, *args):
    """A check's run: `rank_fn` once on four ranks (its cases use sub-groups of 1 to 4 stages)."""
    def run(path: str, timeout_s: float) -> None:
        fail_on_first(run_ranks(rank_fn, path, *args, world_size=4, timeout_s=timeout_s,
                                case=phrase("{n} ranks, in sub-groups of 1 to 4 stages",
                                            "{n} رتبه، در زیرگروه‌هایی از {one} تا {n} مرحله",
                                            n=4, one=1)))
    return run


def _on_one_rank(rank_fn, *args):
    """A check's run: `rank_fn` on one rank (the schedules are pure functions)."""
    def run(path: str, timeout_s: float) -> None:
        fail_on_first(run_ranks(rank_fn, path, *args, world_size=1, timeout_s=timeout_s,
                                case=phrase("one rank", "یک رتبه")))
    return run


def time_step(rank: int, world_size: int, path: str) -> tuple[list[float], list[float]]:
    """Rank function: (learner's, course's) slowest-rank seconds of one 1F1B step, per round."""
    learner = load_learner(path)
    run = PipeRun(model="gpt", schedule="1f1b", micro_batches=4)
    x, y = run.batch(0)
    yours_module, course_module = (stage_module(run, rank, world_size)[0] for _ in range(2))
    course = PipelineStage(course_module, None, loss_function(run.model))
    return paired_rounds(lambda: _learner_step(learner, yours_module, run, None),
                         lambda: course.train_step(x, y, 4, "1f1b"))


def timing(path: str, timeout_s: float) -> Timing:
    """The learner's pipelined step against the course's PipelineStage, MiniGPT on 4 stages."""
    yours, course = run_ranks(time_step, path, world_size=4, timeout_s=timeout_s,
                              case="timing")[0]
    return Timing(phrase("pipelined_step, MiniGPT, schedule '1f1b', {m} micro-batches",
                         "`pipelined_step`، `MiniGPT`، زمان‌بندی `'1f1b'`، {m} میکرودسته", m=4),
                  4, tuple(yours), tuple(course))


CHECKS = (
    Check("schedule_gpipe",
          {"en": "schedule_order('gpipe', ...) is the course's order for 1-5 stages, 1-8 micro-batches",
           "fa": "`schedule_order('gpipe', ...)` برای ۱ تا ۵ مرحله و ۱ تا ۸ میکرودسته همان ترتیب درس است"},
          {"en": "GPipe: every forward F0..F(m-1), then every backward B0..B(m-1), on every stage",
           "fa": "GPipe: در هر مرحله نخست همهٔ گذرهای رفت `F0..F(m-1)` و سپس همهٔ گذرهای برگشت `B0..B(m-1)`"},
          _on_one_rank(grade_schedule, "gpipe"), needs=("schedule_order",)),
    Check("schedule_1f1b",
          {"en": "schedule_order('1f1b', ...) is the course's order, at most P - stage in flight",
           "fa": "`schedule_order('1f1b', ...)` همان ترتیب درس است و مرحلهٔ `s` حداکثر `P - s` "
                 "میکرودسته را هم‌زمان در جریان نگه می‌دارد"},
          {"en": "min(P - stage, m) warm-up forwards before the first backward, then B and F in turn, "
                 "then the remaining backwards; when m < P the warm-up is cut to m",
           "fa": "`min(P - stage, m)` گذر رفتِ گرم‌کردن پیش از نخستین گذر برگشت، سپس B و F "
                 "به‌نوبت، سپس گذرهای برگشتِ باقی‌مانده؛ وقتی `m < P` است گرم‌کردن به `m` کوتاه می‌شود"},
          _on_one_rank(grade_schedule, "1f1b"), needs=("schedule_order",)),
    Check("schedule_errors",
          {"en": "schedule_order raises ValueError naming a bad schedule, stage or count",
           "fa": "`schedule_order` برای زمان‌بندی، مرحله یا شمار نادرست ValueError با نام همان مقدار می‌دهد"},
          {"en": "check the schedule, num_stages >= 1, micro_batches >= 1 and 0 <= stage < num_stages "
                 "before building the order, and put the value in the message",
           "fa": "پیش از ساختن ترتیب، زمان‌بندی و `num_stages >= 1` و `micro_batches >= 1` و "
                 "`0 <= stage < num_stages` را بسنجید و خود مقدار را در پیام بیاورید"},
          _on_one_rank(grade_errors), needs=("schedule_order",)),
    Check("gradients",
          {"en": "pipelined_step on 1-4 stages: loss and gradients equal the unsplit model's",
           "fa": "`pipelined_step` روی ۱ تا ۴ مرحله: زیان و گرادیان‌ها با زیان و گرادیان‌های مدل "
                 "تقسیم‌نشده برابرند"},
          {"en": "divide each micro-batch's loss by micro_batches before its backward, return their "
                 "sum on the last stage, let gradients accumulate (no zero_grad), and find your "
                 "stage and neighbours in `group`",
           "fa": "زیان هر میکرودسته را پیش از گذر برگشت بر `micro_batches` تقسیم کنید، مجموعشان را در "
                 "مرحلهٔ آخر برگردانید، بگذارید گرادیان‌ها جمع شوند (بی `zero_grad`) و مرحله و "
                 "همسایه‌ها را از `group` بگیرید"},
          _on_four_ranks(grade_gradients), needs=("pipelined_step",)),
    Check("order",
          {"en": "each stage runs its forwards and backwards in the schedule's order",
           "fa": "هر مرحله گذرهای رفت و برگشتش را به ترتیب زمان‌بندی اجرا می‌کند"},
          {"en": "loop over schedule_order(schedule, stage, num_stages, micro_batches); call "
                 "layers(x) once per forward and backward once per micro-batch",
           "fa": "روی `schedule_order(schedule, stage, num_stages, micro_batches)` حلقه بزنید؛ "
                 "برای هر گذر رفت یک بار `layers(x)` و برای هر میکرودسته یک بار گذر برگشت "
                 "(`loss.backward()`)"},
          _on_four_ranks(grade_order), needs=("pipelined_step",)),
    Check("bytes",
          {"en": "each stage sends its activations forward and its input gradients back, no more",
           "fa": "هر مرحله فقط فعال‌سازی‌هایش را به جلو و گرادیان ورودی‌اش را به عقب می‌فرستد"},
          {"en": "send float32 tensors of activation_shape: the first stage sends no gradient, "
                 "the last no activation, and nothing else travels",
           "fa": "تنسورهای float32 به شکل `activation_shape` بفرستید: مرحلهٔ اول گرادیان و مرحلهٔ "
                 "آخر فعال‌سازی نمی‌فرستد و چیز دیگری جابه‌جا نمی‌شود"},
          _on_four_ranks(grade_bytes), needs=("pipelined_step",)),
)

LESSON = Lesson(79, "my_pipeline.py", NAMES, CHECKS, timing)

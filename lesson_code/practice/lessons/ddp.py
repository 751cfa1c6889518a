"""Practice for lesson 77: the learner's data-parallel wrappers, naive and bucketed.

The learner writes `broadcast_parameters(module, src, group)`, `NaiveDDP(module, group)` and
`BucketedDDP(module, bucket_cap_mb, group)` with torch.distributed's built-ins, to the course's
contract (`lesson_code.ddp`): wrapping copies rank `src`'s parameters everywhere, and when
`loss.backward()` returns every gradient holds the average over ranks. The checks build MLPs from
another seed on each rank, train them on world sizes 1 to 4 against one process on the full batch
and against torch's DistributedDataParallel (within the course's tolerances, `ddp_support`), and
watch the all-reduces of a backward: one per bucket of the course's sizes, the first started
while backward is still producing gradients.
"""

from __future__ import annotations

import copy
from dataclasses import replace

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from lesson_code.collectives_lab import summation_bound
from lesson_code.ddp import BucketedDDP as CourseBucketedDDP
from lesson_code.ddp import make_buckets
from lesson_code.ddp_lab import OPTIMIZERS, DDPRun, train_single_process
from lesson_code.experiment import flat_parameters
from lesson_code.models import build_model
from lesson_code.practice.grading import Check, Failure, Lesson, load_learner, run_ranks
from lesson_code.practice.lessons.ddp_support import (ADAM_BOUND, LOSS_BOUND, SGD_BOUND,
                                                      counted_collectives, over_world_sizes,
                                                      parameter_at, prefix_group_phrase,
                                                      prefix_groups, train_in_group,
                                                      value_failure, within)
from lesson_code.practice.messages import phrase
from lesson_code.practice.rank_checks import compare, during
from lesson_code.practice.timing import Timing, paired_rounds

NAMES = ("broadcast_parameters", "NaiveDDP", "BucketedDDP")
SEED = 3
STEPS = 4
CAP_MB = 0.01        # the MLP's gradients (27 KB) then span three buckets
CAPS_MB = (25.0, 0.01, 0.004)
# 12 samples split equally over 1, 2, 3 or 4 ranks: the mean of the slices' mean losses is the
# full batch's mean loss, so the averaged gradient is the one-process gradient.
RUN = DDPRun(model="mlp", steps=STEPS, batch_size=12, seed=SEED, bucket_cap_mb=CAP_MB)
WRAPPERS = {"naive": "NaiveDDP", "bucketed": "BucketedDDP"}
OPTIMIZER_NAMES = {"sgd": "SGD", "adam": "Adam"}
FLAT_PARAMETERS = phrase("the flat parameters", "پارامترهای تخت")


def _wrap(learner, kind: str, model, group=None):
    """The learner's wrapper `kind` ("naive" or "bucketed") around `model`, over `group`."""
    if kind == "naive":
        return learner.NaiveDDP(model) if group is None else learner.NaiveDDP(model, group=group)
    if group is None:
        return learner.BucketedDDP(model, bucket_cap_mb=CAP_MB)
    return learner.BucketedDDP(model, bucket_cap_mb=CAP_MB, group=group)


def grade_broadcast(rank: int, world_size: int, path: str) -> list[Failure]:
    """Rank function: after each way of wrapping, this rank holds the source rank's parameters."""
    learner = load_learner(path)
    last = world_size - 1
    cases = [("broadcast_parameters(model)", 0, lambda m: learner.broadcast_parameters(m)),
             (f"broadcast_parameters(model, src={last})", last,
              lambda m: learner.broadcast_parameters(m, src=last)),
             ("NaiveDDP(model)", 0, lambda m: _wrap(learner, "naive", m)),
             (f"BucketedDDP(model, bucket_cap_mb={CAP_MB})", 0,
              lambda m: _wrap(learner, "bucketed", m))]
    failures = []
    for index, (call, src, wrap) in enumerate(cases):
        model = build_model("mlp", SEED + rank)  # every rank starts elsewhere
        case = phrase("{call} on all {n} ranks", "`{call}` روی همهٔ {n} رتبه", call=call,
                      n=world_size)
        with during(case):
            wrap(model)
        expected = flat_parameters(build_model("mlp", SEED + src))
        found = within(flat_parameters(model), expected, None, rank=rank, case_index=index,
                       case=case, element_of=parameter_at(model, FLAT_PARAMETERS),
                       reference=phrase("rank {src}'s initial parameters",
                                        "پارامترهای آغازین رتبهٔ {src}", src=src))
        failures += [found] if found else []
    return failures


def grade_average(rank: int, world_size: int, path: str) -> list[Failure]:
    """Rank function: after one backward each gradient is the mean of the ranks' own gradients."""
    learner = load_learner(path)
    failures = []
    for index, kind in enumerate(("naive", "bucketed")):
        model = build_model("mlp", SEED)
        alone = copy.deepcopy(model)
        x, y = RUN.local_batch(0, rank, world_size)
        alone(x, y)[1].backward()
        own = torch.cat([p.grad.reshape(-1) for p in alone.parameters()])
        expected = own.clone()
        dist.all_reduce(expected)
        expected /= world_size
        # Two summation orders differ by summation_bound; dividing by N rounds once more.
        bound = (summation_bound(own, world_size) / world_size
                 + 2 * torch.finfo(own.dtype).eps * expected.double().abs())
        case = phrase("{wrapper}, all {n} ranks, one backward pass",
                      "{wrapper}، همهٔ {n} رتبه، یک گذر برگشت", wrapper=WRAPPERS[kind],
                      n=world_size)
        with during(case):
            wrapped = _wrap(learner, kind, model)
            wrapped(x, y)[1].backward()
        missing = [name for name, p in model.named_parameters() if p.grad is None]
        if missing:
            failures.append(value_failure(
                phrase("the gradient of {name}", "گرادیان `{name}`", name=missing[0]), None,
                phrase("a tensor", "یک تنسور"), case=case, case_index=index, rank=rank))
            continue
        got = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
        found = compare(got, expected, bound, case=case, case_index=index, rank=rank,
                        reference=phrase("the mean over ranks of each rank's own gradient",
                                         "میانگین گرادیان‌های خود رتبه‌ها"),
                        element_of=parameter_at(model, phrase(
                            "the gradients, concatenated in parameter order",
                            "گرادیان‌ها، پشت هم به ترتیب پارامترها")),
                        group_size=world_size)
        failures += [found] if found else []
    return failures


def train_wrapped(rank: int, world_size: int, group, wrap, run: DDPRun) -> dict:
    """Train `run` on this rank's slice with `wrap(model)`, from seed + rank, inside `group`."""
    model = build_model(run.model, run.seed + rank)
    wrapped = wrap(model)
    optimizer_class, lr = OPTIMIZERS[run.optimizer]
    losses = train_in_group(lambda step: wrapped(*run.local_batch(step, rank, world_size))[1],
                            optimizer_class(model.parameters(), lr=lr), run.steps, group)
    return {"params": flat_parameters(model), "losses": losses}


def grade_training(rank: int, world_size: int, path: str) -> list[Failure]:
    """Rank function: each wrapper, with SGD and Adam, trains as one process and as torch DDP,
    in groups of 1 to `world_size` ranks. The learner's runs come first, so that a wrapper that
    raises ends the check before the references are computed."""
    learner = load_learner(path)
    groups = prefix_groups(world_size)
    failures, index = [], 0
    for optimizer in ("sgd", "adam"):
        run = replace(RUN, optimizer=optimizer)
        results = {}  # (world size, wrapper) -> run, for the groups this rank belongs to
        for size, group in groups.items():
            if rank >= size:
                continue
            for kind in ("naive", "bucketed"):
                with during(_training_case(kind, optimizer, size, world_size)):
                    results[size, kind] = train_wrapped(
                        rank, size, group, lambda m: _wrap(learner, kind, m, group), run)
            results[size, "torch"] = train_wrapped(rank, size, group, lambda m: (
                DistributedDataParallel(m, process_group=group, bucket_cap_mb=CAP_MB)), run)
        single = train_single_process(run)  # every rank together, once the groups are done
        bound = SGD_BOUND if optimizer == "sgd" else ADAM_BOUND
        for size, group in groups.items():
            for kind in ("naive", "bucketed"):
                index += 1
                if rank >= size:
                    continue
                references = [
                    (phrase("one process on the full batch", "یک فرایند روی کل دسته"), single),
                    (phrase("torch's DistributedDataParallel", "DistributedDataParallel خود torch"),
                     results[size, "torch"])]
                failures += _training_failures(
                    results[size, kind], references, bound, group, rank=rank, case_index=index,
                    case=_training_case(kind, optimizer, size, world_size))
    return failures


def _training_case(kind: str, optimizer: str, size: int, world_size: int):
    return phrase("{group}, {wrapper} with {optimizer}, {steps} steps",
                  "{group}، {wrapper} با {optimizer}، {steps} گام",
                  group=prefix_group_phrase(size, world_size), wrapper=WRAPPERS[kind],
                  optimizer=OPTIMIZER_NAMES[optimizer], steps=STEPS)


def _training_failures(result: dict, references: list, bound: float, group, **where) -> list:
    """The first difference of a trained run: among ranks, then per reference losses and params."""
    gathered = [torch.empty_like(result["params"]) for _ in range(dist.get_world_size(group))]
    dist.all_gather(gathered, result["params"], group=group)
    locate = parameter_at(build_model("mlp", SEED), FLAT_PARAMETERS)
    found = [within(result["params"], gathered[0], None, element_of=locate, **where,
                    reference=phrase("rank {zero}'s parameters", "پارامترهای رتبهٔ {zero}", zero=0))]
    for name, reference in references:
        found += [within(torch.tensor(result["losses"]), torch.tensor(reference["losses"]),
                         LOSS_BOUND, reference=name, **where,
                         element_of=phrase("the losses, one per step from step 0",
                                           "زیان‌ها، یکی برای هر گام از گام ۰")),
                  within(result["params"], reference["params"], bound, reference=name,
                         element_of=locate, **where)]
    return [failure for failure in found if failure is not None][:1]


def _gradients_so_far(model):
    """A probe: how many of `model`'s parameters have a gradient yet."""
    return lambda: sum(p.grad is not None for p in model.parameters())


def _bucket_reduces(calls):
    """The all-reduces that carry gradients: a one-element one is a flag or a loss (the
    course's wrapper agrees on missing gradients with one), never a bucket."""
    return [call for call in calls if call.name == "all_reduce" and call.payload > call.itemsize]


def grade_buckets(rank: int, world_size: int, path: str) -> list[Failure]:
    """Rank function: one backward all-reduces one bucket per call, of the course's sizes."""
    learner = load_learner(path)
    failures = []
    x, y = RUN.local_batch(0, rank, world_size)
    for index, cap in enumerate(CAPS_MB):
        model = build_model("mlp", SEED)
        call = f"BucketedDDP(bucket_cap_mb={cap})"
        case = phrase("{call}, all {n} ranks", "`{call}`، همهٔ {n} رتبه", call=call, n=world_size)
        with during(case):
            wrapped = learner.BucketedDDP(model, bucket_cap_mb=cap)
            loss = wrapped(x, y)[1]
            with counted_collectives() as calls:
                loss.backward()
        got = [call.payload for call in _bucket_reduces(calls)]
        buckets = make_buckets(list(reversed(list(model.parameters()))), int(cap * 2 ** 20))
        expected = [b.flat.numel() * b.flat.element_size() for b in buckets]
        if got != expected:
            failures.append(value_failure(
                phrase("the bytes of each all-reduce of one backward pass, in order",
                       "بایت‌های هر کاهش همگانیِ یک گذر برگشت، به ترتیب"), got, expected,
                case=case, case_index=index, rank=rank))
    return failures


def grade_overlap(rank: int, world_size: int, path: str) -> list[Failure]:
    """Rank function: the first bucket's all-reduce starts before backward has every gradient."""
    learner = load_learner(path)
    model = build_model("mlp", SEED)
    case = phrase("{call}, all {n} ranks, one backward pass", "`{call}`، همهٔ {n} رتبه، یک گذر برگشت",
                  call=f"BucketedDDP(bucket_cap_mb={CAP_MB})", n=world_size)
    with during(case):
        wrapped = learner.BucketedDDP(model, bucket_cap_mb=CAP_MB)
        loss = wrapped(*RUN.local_batch(0, rank, world_size))[1]
        with counted_collectives(_gradients_so_far(model)) as calls:
            loss.backward()
    reduces = _bucket_reduces(calls)
    total = len(list(model.parameters()))
    if not reduces:
        return [value_failure(phrase("the number of all-reduces during the backward pass",
                                     "شمار کاهش‌های همگانی در حین گذر برگشت"), 0,
                              phrase("one per bucket", "یکی برای هر باکت"),
                              case=case, case_index=0, rank=rank)]
    if reduces[0].probe >= total:
        return [value_failure(
            phrase("the parameters with a gradient when the first all-reduce started",
                   "پارامترهای دارای گرادیان در لحظهٔ آغاز نخستین کاهش همگانی"),
            phrase("{count} of {total}", "{count} از {total}", count=reduces[0].probe, total=total),
            phrase("fewer than {total}", "کمتر از {total}", total=total),
            case=case, case_index=0, rank=rank)]
    return []


def time_step(rank: int, world_size: int, path: str) -> tuple[list[float], list[float]]:
    """Rank function: (learner's, course's) slowest-rank seconds of one bucketed step, per round."""
    learner = load_learner(path)
    run = replace(RUN, model="gpt", batch_size=16)
    batch = run.local_batch(0, rank, world_size)

    def training_step(make):
        model = build_model("gpt", SEED)
        wrapped = make(model)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

        def step():
            optimizer.zero_grad()
            wrapped(*batch)[1].backward()
            optimizer.step()
        return step

    return paired_rounds(
        training_step(lambda m: learner.BucketedDDP(m, bucket_cap_mb=CAP_MB)),
        training_step(lambda m: CourseBucketedDDP(m, bucket_cap_mb=CAP_MB, comm="builtin")))


def timing(path: str, timeout_s: float) -> Timing:
    """The learner's bucketed DDP step against the course's (built-in all-reduce), 4 ranks."""
    yours, course = run_ranks(time_step, path, world_size=4, timeout_s=timeout_s,
                              case="timing")[0]
    return Timing(phrase("a MiniGPT training step, {call}", "یک گام آموزش `MiniGPT`، `{call}`",
                         call=f"BucketedDDP(bucket_cap_mb={CAP_MB})"), 4, tuple(yours), tuple(course))


CHECKS = (
    Check("broadcast",
          {"en": "after wrapping, every rank holds the source rank's parameters",
           "fa": "پس از گذاشتن مدل در پوشاننده، همهٔ رتبه‌ها پارامترهای رتبهٔ مبدأ را دارند"},
          {"en": "broadcast every parameter from src (dist.broadcast) and write the result into "
                 "the parameter itself (param.data), not into a copy; both wrappers broadcast "
                 "in their constructor",
           "fa": "هر پارامتر را از رتبهٔ مبدأ (`src`) بازپخش کنید (`dist.broadcast`) و نتیجه را در "
                 "خود پارامتر (`param.data`) بنویسید، نه در یک رونوشت؛ هر دو پوشاننده در سازنده‌شان "
                 "بازپخش می‌کنند"},
          over_world_sizes(grade_broadcast, world_sizes=(3,)), needs=NAMES),
    Check("average",
          {"en": "after backward, each gradient is the mean of the ranks' gradients",
           "fa": "پس از گذر برگشت، هر گرادیان میانگین گرادیان‌های رتبه‌هاست"},
          {"en": "all-reduce sums: divide by the world size (gloo has no ReduceOp.AVG)",
           "fa": "کاهش همگانی جمع می‌زند: بر تعداد رتبه‌ها تقسیم کنید (gloo عملیات `ReduceOp.AVG` را "
                 "ندارد)"},
          over_world_sizes(grade_average, world_sizes=(3,)), needs=("NaiveDDP", "BucketedDDP")),
    Check("training",
          {"en": "both wrappers train as one process on the full batch and as torch DDP "
                 "(SGD and Adam, 1 to 4 ranks)",
           "fa": "هر دو کلاس مانند یک فرایند روی کل دسته و مانند DDP در PyTorch آموزش می‌دهند "
                 "(`SGD` و `Adam`، ۱ تا ۴ رتبه)"},
          {"en": "every backward must synchronise, not only the first: reset what your hooks "
                 "count (buckets, pending work) once the gradients are written back; pass "
                 "group= to every collective and divide by dist.get_world_size(group)",
           "fa": "هر گذر برگشت باید همگام شود، نه فقط اولی: آنچه قلاب‌ها می‌شمارند (باکت‌ها، "
                 "کارهای در جریان) را پس از نوشتن گرادیان‌ها بازنشانی کنید؛ `group=` را به هر "
                 "عملیات جمعی بدهید و بر `dist.get_world_size(group)` تقسیم کنید"},
          over_world_sizes(grade_training, world_sizes=(4,), groups=True),
          needs=("NaiveDDP", "BucketedDDP")),
    Check("buckets",
          {"en": "BucketedDDP all-reduces one bucket per call, of at most bucket_cap_mb each",
           "fa": "`BucketedDDP` در هر فراخوانی یک باکت به اندازهٔ حداکثر `bucket_cap_mb` را کاهش همگانی "
                 "می‌کند"},
          {"en": "take parameters in reverse order, start a new bucket when the next one would "
                 "pass the cap (a parameter larger than the cap gets its own), one dist.all_reduce "
                 "of each bucket's flat buffer",
           "fa": "پارامترها را به ترتیب وارونه بردارید، وقتی پارامتر بعدی از سقف می‌گذرد باکت تازه‌ای "
                 "بسازید (پارامتر بزرگ‌تر از سقف باکت خودش را دارد) و بافر تخت هر باکت را با یک "
                 "`dist.all_reduce` کاهش دهید"},
          over_world_sizes(grade_buckets, world_sizes=(2,)), needs=("BucketedDDP",)),
    Check("overlap",
          {"en": "a bucket's all-reduce starts during backward, as soon as the bucket is full",
           "fa": "کاهش همگانی هر باکت در حین گذر برگشت و به محض پر شدن باکت آغاز می‌شود"},
          {"en": "start it from the gradient hook (register_post_accumulate_grad_hook) with "
                 "async_op=True, and wait for the handles only when backward ends",
           "fa": "آن را از قلاب گرادیان (`register_post_accumulate_grad_hook`) با `async_op=True` "
                 "آغاز کنید و فقط در پایان گذر برگشت منتظر کارهای آن بمانید (`work.wait()`)"},
          over_world_sizes(grade_overlap, world_sizes=(2,)), needs=("BucketedDDP",)),
)

LESSON = Lesson(77, "my_ddp.py", NAMES, CHECKS, timing)

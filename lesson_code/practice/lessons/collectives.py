"""Practice for lesson 76: the learner's ring all-reduce, reduce-scatter and all-gather.

The learner writes the three ring collectives from `torch.distributed.isend` / `irecv`, with the
signatures of `lesson_code.collectives.ring` (the grader counts the bytes itself, so there is no
ledger argument). Each check runs them on 1 to 5 gloo ranks, on lengths 0, 1, 3 (fewer elements
than ranks) and 1001 (not divisible), in every dtype of the course, against torch.distributed's
built-ins: integers exactly, floats within the summation bound of `collectives_lab`. The bytes
check counts what each rank sends: a ring sends 2(N-1) chunks of about length/N for an
all-reduce, so a gather to one rank, or a call to the built-in, cannot pass it.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from lesson_code.collectives import ring
from lesson_code.collectives_lab import make_input, summation_bound
from lesson_code.experiment import DTYPES
from lesson_code.practice.grading import (Check, Failure, Lesson, Timing, fail_on_first,
                                          load_learner, run_ranks)
from lesson_code.practice.rank_checks import compare, counted_sends, names_check
from lesson_code.harness.timing import alternating_seconds

WORLD_SIZES = (1, 2, 3, 4, 5)
LENGTHS = (0, 1, 3, 1001)
NAMES = ("ring_all_reduce", "ring_reduce_scatter", "ring_all_gather")
TIMED_ELEMENTS = 1 << 18  # 1 MiB of float32


def _cases(dtype_names: tuple[str, ...]) -> list[tuple[int, str]]:
    """(length, dtype name) of every case a rank runs, in order."""
    return [(length, name) for length in LENGTHS for name in dtype_names]


def _case(world_size: int, length: int, dtype_name: str, op: str = "") -> str:
    return f"world_size={world_size} length={length} dtype={dtype_name}" + (f" op={op}" if op else "")


def grade_all_reduce(rank: int, world_size: int, path: str, op: str) -> list[Failure]:
    """Rank function: the learner's ring_all_reduce against dist.all_reduce, in place, every case."""
    learner = load_learner(path)
    names = tuple(DTYPES) if op == "sum" else ("float32", "float64", "bfloat16")
    failures = []
    for index, (length, name) in enumerate(_cases(names)):
        x = make_input(rank, length, name)
        expected, bound = x.clone(), summation_bound(x, world_size)
        dist.all_reduce(expected)
        if op == "avg":
            expected.div_(world_size)
            bound = bound / world_size + torch.finfo(x.dtype).eps * expected.double().abs()
        given = x.clone()
        returned = learner.ring_all_reduce(given, op)
        case = _case(world_size, length, name, op)
        found = compare(returned, expected, bound, case=case, case_index=index, rank=rank,
                        reference="dist.all_reduce")
        if found is None and length and not torch.equal(given, returned):
            found = Failure("not_in_place", {"case": case, "case_index": index, "rank": rank})
        failures += [found] if found else []
    return failures


def grade_reduce_scatter(rank: int, world_size: int, path: str) -> list[Failure]:
    """Rank function: the learner's ring_reduce_scatter returns its chunk of the built-in sum."""
    learner = load_learner(path)
    failures = []
    for index, (length, name) in enumerate(_cases(tuple(DTYPES))):
        x = make_input(rank, length, name)
        total, bound = x.clone(), summation_bound(x, world_size)
        dist.all_reduce(total)
        expected = torch.tensor_split(total, world_size)[rank]
        returned = learner.ring_reduce_scatter(x.clone(), "sum")
        found = compare(returned, expected, torch.tensor_split(bound, world_size)[rank],
                        case=_case(world_size, length, name), case_index=index, rank=rank,
                        reference="tensor_split(dist.all_reduce(x))[rank]")
        failures += [found] if found else []
    return failures


def grade_all_gather(rank: int, world_size: int, path: str) -> list[Failure]:
    """Rank function: the learner's ring_all_gather of tensor_split shards rebuilds the tensor."""
    learner = load_learner(path)
    failures = []
    for index, (length, name) in enumerate(_cases(tuple(DTYPES))):
        whole = make_input(0, length, name)  # the same tensor on every rank
        shards = torch.tensor_split(whole, world_size)
        returned = learner.ring_all_gather(shards[rank].clone(), [len(s) for s in shards])
        found = compare(returned, whole, None, case=_case(world_size, length, name),
                        case_index=index, rank=rank, reference="the gathered tensor")
        failures += [found] if found else []
    return failures


def grade_bytes(rank: int, world_size: int, path: str) -> list[Failure]:
    """Rank function: each collective sends what a ring sends, counted message by message."""
    learner = load_learner(path)
    length, itemsize = 1001, 4
    most, least = math.ceil(length / world_size), length // world_size
    x = make_input(rank, length, "float32")
    shards = torch.tensor_split(x, world_size)
    calls = {
        "ring_all_reduce": (lambda: learner.ring_all_reduce(x.clone(), "sum"), 2),
        "ring_reduce_scatter": (lambda: learner.ring_reduce_scatter(x.clone(), "sum"), 1),
        "ring_all_gather": (lambda: learner.ring_all_gather(shards[rank].clone(),
                                                           [len(s) for s in shards]), 1),
    }
    failures = []
    for index, (name, (call, phases)) in enumerate(calls.items()):
        with counted_sends() as counts:
            call()
        low, high = phases * (world_size - 1) * least * itemsize, phases * (world_size - 1) * most * itemsize
        if not low <= counts["bytes"] <= high:
            failures.append(Failure("bytes", {
                "case": f"{name} world_size={world_size} length={length} dtype=float32",
                "case_index": index, "rank": rank, "got": counts["bytes"],
                "expected": f"{low}-{high}" if low != high else low,
                "expected_what": f"a ring ({phases} x (N-1) chunks)"}))
    return failures


def _over_world_sizes(rank_fn, *args, world_sizes: tuple[int, ...] = WORLD_SIZES):
    """A check's run: `rank_fn` on each of `world_sizes`, stopping at the first failure."""
    def run(path: str, timeout_s: float) -> None:
        for world_size in world_sizes:
            fail_on_first(run_ranks(rank_fn, path, *args, world_size=world_size,
                                    timeout_s=timeout_s, case=f"world_size={world_size}"))
    return run


def time_all_reduce(rank: int, world_size: int, path: str) -> tuple[float, float]:
    """Rank function: (learner's, course's) slowest-rank median seconds of a 1 MiB all-reduce."""
    learner = load_learner(path)
    x = make_input(rank, TIMED_ELEMENTS, "float32")
    yours, course = alternating_seconds([lambda: learner.ring_all_reduce(x, "avg"),
                                         lambda: ring.ring_all_reduce(x, "avg")], trials=5)
    return yours, course


def timing(path: str, timeout_s: float) -> Timing:
    """The learner's ring all-reduce of 1 MiB against the course's, on 4 ranks."""
    yours, course = run_ranks(time_all_reduce, path, world_size=4, timeout_s=timeout_s,
                              case="timing")[0]
    return Timing("ring_all_reduce, 1 MiB float32", 4, 5, yours, course)


CHECKS = (
    names_check(NAMES),
    Check("all_reduce_sum",
          {"en": "ring_all_reduce(op='sum') equals dist.all_reduce, in place",
           "fa": "ring_all_reduce(op='sum') برابر dist.all_reduce است و در جا می‌نویسد"},
          {"en": "split with torch.tensor_split(tensor.view(-1), N): chunks may differ by one "
                 "element or be empty; N-1 reduce-scatter steps then N-1 all-gather steps",
           "fa": "با torch.tensor_split(tensor.view(-1), N) تکه کنید: تکه‌ها ممکن است یک عنصر "
                 "فرق کنند یا خالی باشند؛ N-1 گام پخش-کاهش و سپس N-1 گام گردآوری"},
          _over_world_sizes(grade_all_reduce, "sum")),
    Check("all_reduce_avg",
          {"en": "ring_all_reduce(op='avg') equals the built-in sum divided by N",
           "fa": "ring_all_reduce(op='avg') برابر مجموع داخلی تقسیم بر N است"},
          {"en": "divide once, by the world size, the reduced chunk you own (before the all-gather)",
           "fa": "تکهٔ کاهش‌یافتهٔ خودتان را یک بار بر اندازهٔ گروه تقسیم کنید (پیش از گردآوری)"},
          _over_world_sizes(grade_all_reduce, "avg")),
    Check("reduce_scatter",
          {"en": "ring_reduce_scatter returns this rank's chunk of the sum",
           "fa": "ring_reduce_scatter تکهٔ همین رتبه از مجموع را برمی‌گرداند"},
          {"en": "rank r ends with chunk r: at step s send chunk (r-s-1) mod N, receive (r-s-2) mod N",
           "fa": "رتبهٔ r باید با تکهٔ r تمام کند: در گام s تکهٔ (r-s-1) mod N را بفرستید و "
                 "(r-s-2) mod N را بگیرید"},
          _over_world_sizes(grade_reduce_scatter)),
    Check("all_gather",
          {"en": "ring_all_gather rebuilds the whole tensor on every rank",
           "fa": "ring_all_gather تانسور کامل را در همهٔ رتبه‌ها می‌سازد"},
          {"en": "shards may have different lengths (sizes[r]); forward the chunk you received last",
           "fa": "طول تکه‌ها ممکن است فرق کند (sizes[r])؛ تکه‌ای را که آخر گرفتید به جلو بفرستید"},
          _over_world_sizes(grade_all_gather)),
    Check("bytes",
          {"en": "bytes sent per rank are a ring's: 2(N-1) chunks for an all-reduce",
           "fa": "بایت‌های ارسالی هر رتبه همان حلقه است: 2(N-1) تکه برای all-reduce"},
          {"en": "send only chunks to the right neighbour, never the whole tensor, and do not call "
                 "the built-in collectives",
           "fa": "فقط تکه‌ها را به همسایهٔ راست بفرستید، نه کل تانسور را، و collectiveهای آمادهٔ "
                 "PyTorch را صدا نزنید"},
          _over_world_sizes(grade_bytes, world_sizes=WORLD_SIZES[1:])),
)

LESSON = Lesson(76, "my_collectives.py", NAMES, CHECKS, timing)

"""Practice for lesson 76: the learner's ring all-reduce, reduce-scatter and all-gather.

The learner writes the three ring collectives from `torch.distributed.isend` / `irecv`, with the
signatures of `lesson_code.collectives.ring` (the grader counts the bytes itself, so there is no
ledger argument). Each check runs them on 1 to 5 gloo ranks, on lengths 0, 1, 3 (fewer elements
than ranks) and 1001 (not divisible), in every dtype of the course, against torch.distributed's
built-ins: integers exactly, floats within the summation bound of `collectives_lab`. On 5 ranks
they also run on two sub-groups at once, ranks 0 and 2 and ranks 1, 3 and 4 (`group=`): there
a rank's number in its group is not its global rank, which is what isend and irecv take, so
code that confuses the two fails. op="avg" on int64 must raise ValueError, as the template says
(the course's ring refuses it: the average of integers would truncate). The bytes check counts
what each rank sends: a ring sends 2(N-1) chunks of about length/N for an all-reduce, so a
gather to one rank, or a call to the built-in, cannot pass it.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from lesson_code.collectives import ring
from lesson_code.collectives_lab import make_input
from lesson_code.experiment import DTYPES
from lesson_code.practice.grading import Check, Failure, Lesson, fail_on_first, load_learner, run_ranks
from lesson_code.practice.messages import Phrase, every_rank, listing, phrase
from lesson_code.practice.rank_checks import compare, counted_sends, during, tensor_kind
from lesson_code.practice.timing import Timing, paired_rounds

WORLD_SIZES = (1, 2, 3, 4, 5)
LENGTHS = (0, 1, 3, 1001)
FLOATS = ("float32", "float64", "bfloat16")
SUB_GROUPS = ((0, 2), (1, 3, 4))  # at world size 5, at once: group ranks are not global ranks
NAMES = ("ring_all_reduce", "ring_reduce_scatter", "ring_all_gather")
TIMED_ELEMENTS = 1 << 18  # 1 MiB of float32


def groups_of(rank: int, world_size: int) -> list[tuple[dist.ProcessGroup | None, tuple[int, ...]]]:
    """(group, its global ranks) of each group this rank grades in: every rank (group None),
    then, on as many ranks as SUB_GROUPS hold, the sub-group it belongs to.

    Collective: every rank creates every group, in the same order (torch requires it).
    """
    found = [(None, tuple(range(world_size)))]
    if world_size == sum(map(len, SUB_GROUPS)):
        for members in SUB_GROUPS:
            group = dist.new_group(list(members))
            if rank in members:
                found.append((group, members))
    return found


def group_phrase(rank: int, world_size: int, members: tuple[int, ...]) -> Phrase:
    """Which group a case runs in, and this rank's number in it when that is not its own."""
    if len(members) == world_size:
        return every_rank(world_size)
    return phrase("the group of ranks {members} of {n} (rank {rank} is its rank {own})",
                  "گروه رتبه‌های {members} از {n} رتبه (رتبهٔ {rank} در آن رتبهٔ {own} است)",
                  members=listing(list(members)), n=world_size, rank=rank,
                  own=members.index(rank))


def _case(where: Phrase, length: int, dtype_name: str, op: str | None = None) -> Phrase:
    if op is None:
        return phrase("{where}, length {length}, {dtype}", "{where}، طول {length}، {dtype}",
                      where=where, length=length, dtype=dtype_name)
    return phrase("{where}, length {length}, {dtype}, op={op}",
                  "{where}، طول {length}، {dtype}، `op={op}`",
                  where=where, length=length, dtype=dtype_name, op=repr(op))


def group_summation_bound(tensor: torch.Tensor, group) -> torch.Tensor:
    """`collectives_lab.summation_bound` over `group` (that one sums over every rank).

    Collective: every rank of `group`. Two orders of a sum of N terms differ by at most
    (N - 1) eps sum|x_i|; zero for integers, whose sums are exact.
    """
    if not tensor.is_floating_point():
        return torch.zeros(tensor.shape, dtype=torch.float64)
    absolute = tensor.abs().to(torch.float64)
    dist.all_reduce(absolute, group=group)
    return (dist.get_world_size(group) - 1) * torch.finfo(tensor.dtype).eps * absolute


def grade_all_reduce(rank: int, world_size: int, path: str, op: str) -> list[Failure]:
    """Rank function: the learner's ring_all_reduce against dist.all_reduce, in place, every case
    in every group; with op="avg", an int64 tensor must raise ValueError."""
    learner = load_learner(path)
    names = tuple(DTYPES) if op == "sum" else FLOATS
    failures, index = [], 0
    for group, members in groups_of(rank, world_size):
        where, size = group_phrase(rank, world_size, members), len(members)
        for length in LENGTHS:
            for name in names:
                index += 1
                x = make_input(rank, length, name)
                expected, bound = x.clone(), group_summation_bound(x, group)
                dist.all_reduce(expected, group=group)
                if op == "avg":
                    expected.div_(size)
                    bound = bound / size + torch.finfo(x.dtype).eps * expected.double().abs()
                given, case = x.clone(), _case(where, length, name, op)
                with during(case):
                    returned = learner.ring_all_reduce(given, op, group=group)
                found = compare(returned, expected, bound, case=case, case_index=index, rank=rank,
                                reference="dist.all_reduce", own=x,
                                group_size=size if op == "avg" else 1)
                if found is None and length and not torch.equal(given, returned):
                    found = Failure("not_in_place", {"case": case, "case_index": index, "rank": rank})
                failures += [found] if found else []
        if op == "avg":
            index += 1
            failures += _integer_average_refused(learner, rank, group, where, index)
    return failures


def _integer_average_refused(learner, rank: int, group, where: Phrase, index: int) -> list[Failure]:
    """[] when ring_all_reduce(int64 tensor, "avg") raises ValueError, else its Failure."""
    x, case = make_input(rank, LENGTHS[-1], "int64"), _case(where, LENGTHS[-1], "int64", "avg")
    with during(case):
        try:
            returned = learner.ring_all_reduce(x.clone(), "avg", group=group)
        except ValueError:
            return []
    got = tensor_kind(returned) if isinstance(returned, torch.Tensor) else type(returned).__name__
    return [Failure("not_raised", {"case": case, "case_index": index, "rank": rank,
                                   "got": got, "expected": "ValueError"})]


def grade_reduce_scatter(rank: int, world_size: int, path: str) -> list[Failure]:
    """Rank function: the learner's ring_reduce_scatter returns its chunk of the built-in sum."""
    learner = load_learner(path)
    failures, index = [], 0
    for group, members in groups_of(rank, world_size):
        where, size, own = group_phrase(rank, world_size, members), len(members), members.index(rank)
        for length in LENGTHS:
            for name in DTYPES:
                index += 1
                x = make_input(rank, length, name)
                total, bound = x.clone(), group_summation_bound(x, group)
                dist.all_reduce(total, group=group)
                case = _case(where, length, name)
                with during(case):
                    returned = learner.ring_reduce_scatter(x.clone(), "sum", group=group)
                found = compare(returned, torch.tensor_split(total, size)[own],
                                torch.tensor_split(bound, size)[own], case=case, case_index=index,
                                rank=rank, reference="tensor_split(dist.all_reduce(x), N)[r]",
                                element_of=phrase("the returned chunk", "تکهٔ برگشتی"),
                                own=torch.tensor_split(x, size)[own])
                failures += [found] if found else []
    return failures


def grade_all_gather(rank: int, world_size: int, path: str) -> list[Failure]:
    """Rank function: the learner's ring_all_gather of tensor_split shards rebuilds the tensor."""
    learner = load_learner(path)
    failures, index = [], 0
    for group, members in groups_of(rank, world_size):
        where, size, own = group_phrase(rank, world_size, members), len(members), members.index(rank)
        for length in LENGTHS:
            for name in DTYPES:
                index += 1
                whole = make_input(0, length, name)  # the same tensor on every rank
                shards = torch.tensor_split(whole, size)
                case = _case(where, length, name)
                with during(case):
                    returned = learner.ring_all_gather(shards[own].clone(),
                                                       [len(s) for s in shards], group=group)
                found = compare(returned, whole, None, case=case, case_index=index, rank=rank,
                                reference=phrase("the whole tensor", "تنسور کامل"),
                                element_of=phrase("the gathered tensor", "تنسور گردآوری‌شده"))
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
        case = phrase("{name}, all {n} ranks, length {length}, float32",
                      "`{name}`، همهٔ {n} رتبه، طول {length}، float32",
                      name=name, n=world_size, length=length)
        with during(case), counted_sends() as counts:
            call()
        chunks = phases * (world_size - 1)
        low, high = chunks * least * itemsize, chunks * most * itemsize
        if not low <= counts["bytes"] <= high:
            failures.append(Failure("bytes", {
                "case": case, "case_index": index, "rank": rank, "got": counts["bytes"],
                "expected": phrase("{low} to {high}", "{low} تا {high}", low=low, high=high)
                if low != high else low,
                "expected_what": phrase("a ring ({chunks} chunks)", "یک حلقه ({chunks} تکه)",
                                        chunks=chunks)}))
    return failures


def _over_world_sizes(rank_fn, *args, world_sizes: tuple[int, ...] = WORLD_SIZES,
                      sub_groups: bool = True):
    """A check's run: `rank_fn` on each of `world_sizes`, stopping at the first failure;
    `sub_groups`: the rank function grades in `groups_of` (which the run's case names)."""
    def run(path: str, timeout_s: float) -> None:
        for world_size in world_sizes:
            case = every_rank(world_size)
            if sub_groups and world_size == sum(map(len, SUB_GROUPS)):
                case = phrase("{n} ranks, all together and then in the groups {a} and {b}",
                              "{n} رتبه، نخست همه با هم و سپس در گروه‌های {a} و {b}",
                              n=world_size, a=listing(list(SUB_GROUPS[0])),
                              b=listing(list(SUB_GROUPS[1])))
            fail_on_first(run_ranks(rank_fn, path, *args, world_size=world_size,
                                    timeout_s=timeout_s, case=case))
    return run


def time_all_reduce(rank: int, world_size: int, path: str) -> tuple[list[float], list[float]]:
    """Rank function: (learner's, course's) slowest-rank seconds of a 1 MiB all-reduce, per round."""
    learner = load_learner(path)
    x = make_input(rank, TIMED_ELEMENTS, "float32")
    return paired_rounds(lambda: learner.ring_all_reduce(x, "avg"),
                         lambda: ring.ring_all_reduce(x, "avg"))


def timing(path: str, timeout_s: float) -> Timing:
    """The learner's ring all-reduce of 1 MiB against the course's, on 4 ranks."""
    yours, course = run_ranks(time_all_reduce, path, world_size=4, timeout_s=timeout_s,
                              case="timing")[0]
    return Timing(phrase("ring_all_reduce of {size} MiB of float32",
                         "`ring_all_reduce` روی {size} MiB از float32", size=1),
                  4, tuple(yours), tuple(course))


CHECKS = (
    Check("all_reduce_sum",
          {"en": "ring_all_reduce(op='sum') equals dist.all_reduce, in place, in every group",
           "fa": "`ring_all_reduce(op='sum')` در هر گروه برابر `dist.all_reduce` است و درجا می‌نویسد"},
          {"en": "split with torch.tensor_split(tensor.view(-1), N): chunks may differ by one "
                 "element or be empty; N-1 reduce-scatter steps then N-1 all-gather steps. Pass "
                 "group= to every dist.isend and dist.irecv: their peers are global ranks, so "
                 "turn group rank r into dist.get_global_rank(group, r)",
           "fa": "با `torch.tensor_split(tensor.view(-1), N)` تکه کنید: تکه‌ها ممکن است یک عنصر "
                 "فرق کنند یا خالی باشند؛ N-1 گام کاهش و پخش و سپس N-1 گام گردآوری همگانی. "
                 "`group=` را به هر `dist.isend` و `dist.irecv` بدهید: همتای آن‌ها رتبهٔ سراسری است، "
                 "پس رتبهٔ r در گروه را با `dist.get_global_rank(group, r)` به رتبهٔ سراسری تبدیل "
                 "کنید"},
          _over_world_sizes(grade_all_reduce, "sum"), needs=("ring_all_reduce",)),
    Check("all_reduce_avg",
          {"en": "ring_all_reduce(op='avg') equals the built-in sum divided by N, and refuses "
                 "integers with ValueError",
           "fa": "`ring_all_reduce(op='avg')` برابر حاصل‌جمعِ توکار تقسیم بر N است و اعداد صحیح را با "
                 "ValueError رد می‌کند"},
          {"en": "divide once, by the group's size, the reduced chunk you own (before the "
                 "all-gather); raise ValueError for an integer tensor before sending anything",
           "fa": "تکهٔ کاهش‌یافتهٔ خودتان را یک بار بر اندازهٔ گروه تقسیم کنید (پیش از گردآوری "
                 "همگانی)؛ برای تنسور اعداد صحیح، پیش از فرستادن هر پیامی ValueError بدهید"},
          _over_world_sizes(grade_all_reduce, "avg"), needs=("ring_all_reduce",)),
    Check("reduce_scatter",
          {"en": "ring_reduce_scatter returns this rank's chunk of the sum, in every group",
           "fa": "`ring_reduce_scatter` در هر گروه تکهٔ همین رتبه از مجموع را برمی‌گرداند"},
          {"en": "group rank r ends with chunk r: at step s send chunk (r-s-1) % N, receive "
                 "chunk (r-s-2) % N",
           "fa": "رتبهٔ r در گروه باید با تکهٔ r تمام کند: در گام s تکهٔ `(r-s-1) % N` را بفرستید و "
                 "تکهٔ `(r-s-2) % N` را بگیرید"},
          _over_world_sizes(grade_reduce_scatter), needs=("ring_reduce_scatter",)),
    Check("all_gather",
          {"en": "ring_all_gather rebuilds the whole tensor on every rank of every group",
           "fa": "`ring_all_gather` تنسور کامل را در همهٔ رتبه‌های هر گروه می‌سازد"},
          {"en": "shards may have different lengths (sizes[r]); forward the chunk you received last",
           "fa": "طول تکه‌ها ممکن است فرق کند (`sizes[r]`)؛ تکه‌ای را که آخر گرفتید به جلو بفرستید"},
          _over_world_sizes(grade_all_gather), needs=("ring_all_gather",)),
    Check("bytes",
          {"en": "bytes sent per rank are a ring's: 2(N-1) chunks for an all-reduce",
           "fa": "بایت‌های ارسالی هر رتبه همان بایت‌های حلقه است: `2(N-1)` تکه برای کاهش همگانی"},
          {"en": "send only chunks to the right neighbour, never the whole tensor, and do not call "
                 "the built-in collectives",
           "fa": "فقط تکه‌ها را به همسایهٔ راست بفرستید، نه کل تنسور را، و عملیات جمعی توکار "
                 "را فرا نخوانید"},
          _over_world_sizes(grade_bytes, world_sizes=WORLD_SIZES[1:], sub_groups=False),
          needs=NAMES),
)

LESSON = Lesson(76, "my_collectives.py", NAMES, CHECKS, timing)

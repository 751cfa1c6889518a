"""Lesson 76's lab: rank functions that check and time the primitives of `lesson_code.collectives`.

The algorithms live in the `lesson_code.collectives` package (ring.py, p2p.py, ledger.py, comm.py,
cost_model.py); what the lesson runs with them is here: checks against torch.distributed, ledgers
of the bytes each rank moves, timings, and the ring all-reduce written plainly
(`plain_ring_all_reduce`) to set beside the package's. The notebook, the tests and the benchmark call these
through the launcher (a spawned rank cannot import a notebook). Each returns plain Python values,
so results cross process boundaries by value.

    from lesson_code import launch, collectives_lab
    launch.spawn(collectives_lab.compare_with_builtin, 1001, "float32", world_size=4)

    python -m lesson_code.collectives_lab          # every primitive against torch.distributed
    python -m lesson_code.collectives_lab --lang fa  # the same, reported in Persian
    torchrun --standalone --nproc-per-node=4 -m lesson_code.collectives_lab
"""

from __future__ import annotations

import math
import os
import re
import time
from datetime import timedelta
from functools import partial

import torch
import torch.distributed as dist

from lesson_code import collectives, language
from lesson_code.collectives import choose, cost_model, doubling
from lesson_code.collectives.comm import builtin_all_gather
from lesson_code.collectives.ledger import CommLedger
from lesson_code.runtime.devices import current_device
from lesson_code.experiment import DTYPES
from lesson_code.harness.timing import alternating_seconds, collective_seconds
from lesson_code.harness.validate import require_choice, require_positive
from lesson_code.practice.timing import paired_rounds


def describe_rank(rank: int, world_size: int) -> dict:
    """Who this rank is: its rank, the world size, its process id, backend and torch threads."""
    return {"rank": rank, "world_size": world_size, "pid": os.getpid(),
            "backend": dist.get_backend(), "threads": torch.get_num_threads()}


def plain_ring_all_reduce(tensor: torch.Tensor, timeout_s: float = 60.0) -> torch.Tensor:
    """The ring all-reduce (sum) in its plainest form, on a contiguous tensor; return it.

    Collective: call on every rank of the default group. The same schedule and additions as
    `collectives.ring_all_reduce`, without its ledger, pieces, NCCL batching or checks.
    """
    rank, N, wait = dist.get_rank(), dist.get_world_size(), timedelta(seconds=timeout_s)
    chunks = torch.tensor_split(tensor.view(-1), N)  # views: the sums land in `tensor`

    def ring_step(send: torch.Tensor, recv: torch.Tensor) -> None:
        receiving = dist.irecv(recv, src=(rank - 1) % N)  # from the left neighbour
        sending = dist.isend(send, dst=(rank + 1) % N)  # to the right neighbour
        receiving.wait(wait)
        sending.wait(wait)

    for k in range(1, N):  # reduce-scatter: pass partial sums right, add our own copy
        received = torch.empty_like(chunks[(rank - k - 1) % N])
        ring_step(chunks[(rank - k) % N], received)
        chunks[(rank - k - 1) % N].add_(received)
    for k in range(1, N):  # all-gather: pass the complete chunks right, keep them
        ring_step(chunks[(rank - k + 1) % N], chunks[(rank - k) % N])
    return tensor


def compare_plain_ring(rank: int, world_size: int, length: int, seed: int = 0) -> bool:
    """Whether `plain_ring_all_reduce` and `collectives.ring_all_reduce` give the same bits on
    this rank's float32 input of `length` values. Collective: call on every rank."""
    tensor = make_input(rank, length, "float32", seed)
    return torch.equal(plain_ring_all_reduce(tensor.clone()),
                       collectives.ring_all_reduce(tensor.clone()))


def posted_naive_all_reduce(tensor: torch.Tensor, timeout_s: float = 60.0) -> torch.Tensor:
    """The naive all-reduce (sum), with rank 0 posting its N - 1 receives at once; return `tensor`.

    Collective: call on every rank of the default group, with contiguous tensors of one shape.
    The same messages as `collectives.naive_all_reduce` and the same additions in the same order,
    so the same bits; only rank 0 no longer waits for one message before it posts the next.
    """
    rank, N, wait = dist.get_rank(), dist.get_world_size(), timedelta(seconds=timeout_s)
    if rank != 0:
        dist.isend(tensor, dst=0).wait(wait)  # the send done: the buffer may take the sum
        dist.irecv(tensor, src=0).wait(wait)
        return tensor
    incoming = [torch.empty_like(tensor) for _ in range(1, N)]
    receiving = [dist.irecv(buffer, src=source) for source, buffer in enumerate(incoming, 1)]
    for buffer, work in zip(incoming, receiving):  # in rank order, as the naive scheme adds
        work.wait(wait)
        tensor.add_(buffer)
    sending = [dist.isend(tensor, dst=destination) for destination in range(1, N)]
    for work in sending:
        work.wait(wait)
    return tensor


def compare_posted_naive(rank: int, world_size: int, nbytes: int, rounds: int = 9) -> dict:
    """`posted_naive_all_reduce` beside `collectives.naive_all_reduce` on float32 tensors of
    `nbytes` bytes: whether they give the same bits on this rank, and the slowest rank's seconds
    of one call of each, per round, timed in alternation as practice mode times (each side first
    in every other round). Collective: call on every rank. Keys: same_bits, naive, posted."""
    tensor = make_input(rank, nbytes // 4, "float32")
    same = torch.equal(posted_naive_all_reduce(tensor.clone()),
                       collectives.naive_all_reduce(tensor.clone()))
    posted, naive = paired_rounds(partial(posted_naive_all_reduce, tensor.clone()),
                                  partial(collectives.naive_all_reduce, tensor.clone()),
                                  rounds=rounds)
    return {"same_bits": same, "naive": naive, "posted": posted}


def reduce_scatter_length(rank: int, world_size: int, length: int) -> int:
    """Length of the chunk `ring_reduce_scatter` gives this rank for a `length`-element tensor.

    Collective: call on every rank.
    """
    return collectives.ring_reduce_scatter(torch.ones(length, device=current_device())).shape[0]


def broadcast_ledger(rank: int, world_size: int, src: int, numel: int) -> dict[str, int]:
    """This rank's traffic for one tree broadcast of `numel` float32 values from `src`.

    Collective: call on every rank.
    """
    ledger = CommLedger()
    collectives.broadcast(torch.zeros(numel, device=current_device()), src=src, ledger=ledger)
    return ledger.totals()["broadcast"]


def reduction_error(contributions: int, numel: int = 65536, seed: int = 0) -> dict[str, float]:
    """Relative error of a gradient sum over `contributions` ranks, added one at a time as a ring
    adds them: with the running sum kept in bfloat16; in float32 with the result rounded to
    bfloat16 once at the end (that rounding is then all the error); and in float32 throughout, as
    an fp32 reduction feeding an fp32 optimizer does. All against the exact (float64) sum of the
    same bfloat16 gradients.

    The gradients are uniform in [-1, 1), rounded to bfloat16: uniform draws and IEEE additions
    give the same bits on every machine. Error = ||sum - exact|| / ||exact||.
    """
    generator = torch.Generator().manual_seed(seed)
    grads = (2 * torch.rand(contributions, numel, generator=generator) - 1).to(torch.bfloat16)
    exact = grads.double().sum(0)
    in_bf16, in_fp32 = grads[0].clone(), grads[0].float()
    for grad in grads[1:]:
        in_bf16 += grad
        in_fp32 += grad.float()
    return {name: ((total.double() - exact).norm() / exact.norm()).item()
            for name, total in (("running sum in bfloat16", in_bf16),
                                ("float32, result rounded to bfloat16", in_fp32.to(torch.bfloat16)),
                                ("float32 throughout", in_fp32))}


def skip_a_collective(rank: int, world_size: int, timeout_s: float = 2.0) -> str:
    """What a hang looks like in this course: rank 1 never calls the all-reduce the others call.

    Collective: call on every rank (2 or more). Rank 1 sleeps instead, far longer than
    `timeout_s`, so the others wait for its messages until their bounded wait raises TimeoutError;
    `launch.spawn` then raises RankFailedError for the first rank that failed, with its
    traceback, and stops rank 1.
    """
    if rank == 1:
        time.sleep(60 * timeout_s)
        return "skipped"
    collectives.ring_all_reduce(torch.ones(8, device=current_device()), timeout_s=timeout_s)
    return "finished"


def short_message(rank: int, world_size: int, sent: int = 4, expected: int = 8) -> list[float] | None:
    """A message shorter than its receive: rank 1 sends `sent` ones where rank 0 expects `expected`.

    Collective: call on ranks 0 and 1 (a larger group leaves the others idle). Rank 0 fills its
    receive with -1 first and returns it as gloo left it: the first `sent` values received, the
    rest still -1, without an error. Rank 1 returns None.
    """
    if rank == 1:
        dist.send(torch.ones(sent), dst=0)
        return None
    if rank == 0:
        received = torch.full((expected,), -1.0)
        dist.recv(received, src=1)
        return received.tolist()
    return None


class HalvingRecorder:
    """Stands in for one rank's `Peers` in `doubling.reduce_scatter_by_halving`: records each
    exchange instead of sending it, so one process can follow every rank's steps.

    Given one element per chunk, the part sent is a view of chunks [offset, offset + numel) of
    the flat tensor; the chunks kept are the rest of the window, on the other side of them.
    `steps` maps "step 1", "step 2", ... to "partner: chunks kept" ("4: 0–3", or "1: 0").
    """

    def __init__(self, rank: int, world_size: int):
        self.rank, self.world_size = rank, world_size
        self.window, self.steps = (0, world_size), {}

    def exchange(self, send: torch.Tensor, to: int, recv: torch.Tensor, source: int) -> None:
        """`Peers.exchange`'s arguments: records `to` and the chunks kept; sends nothing."""
        start, end = send.storage_offset(), send.storage_offset() + send.numel()
        low, high = self.window
        low, high = (end, high) if start == low else (low, start)  # the half kept
        self.window = low, high
        kept = f"{low}–{high - 1}" if high - low > 1 else f"{low}"
        self.steps[f"step {len(self.steps) + 1}"] = f"{to}: {kept}"


def halving_steps(world_size: int) -> list[dict[str, str]]:
    """Each rank's partner and the chunks it keeps after each step of the reduce-scatter by
    halving on `world_size` ranks (a power of two): one {"step 1": "4: 0–3", ...} per rank.

    Lesson 76a's table of the halving. It runs the package's own
    `doubling.reduce_scatter_by_halving` once per rank, on one-element chunks and with a
    `HalvingRecorder` for peers, so the table shows what the listed code does, with no process
    group. Raises ValueError unless `world_size` is a power of two of at least 2.
    """
    if world_size < 2 or world_size & (world_size - 1):
        raise ValueError(f"world_size must be a power of two of at least 2, got {world_size}: "
                         "pass 2, 4, 8 or 16")
    rows = []
    for rank in range(world_size):
        peers = HalvingRecorder(rank, world_size)
        held = doubling.reduce_scatter_by_halving(doubling.PowerOfTwoGroup(peers),
                                                   torch.zeros(world_size),
                                                   list(range(world_size + 1)))
        assert held == (rank, rank + 1)  # rank r ends with chunk r
        rows.append(peers.steps)
    return rows


def make_input(rank: int, length: int, dtype_name: str, seed: int = 0) -> torch.Tensor:
    """Rank `rank`'s deterministic test tensor of `length` elements.

    Floats are 10·N(0, 1) (std 10), ints lie in +-100.

    Drawn on the CPU (the same numbers on every machine), then moved to this process's device.
    """
    require_choice("dtype", dtype_name, tuple(DTYPES))
    generator = torch.Generator().manual_seed(seed * 7919 + rank)
    if dtype_name == "int64":
        tensor = torch.randint(-100, 100, (length,), generator=generator)
    else:
        tensor = (10 * torch.randn(length, generator=generator, dtype=torch.float64)).to(DTYPES[dtype_name])
    return tensor.to(current_device())


def summation_bound(tensor: torch.Tensor, world_size: int) -> torch.Tensor:
    """Elementwise bound on |ring sum - built-in sum| for `tensor` this rank holds.

    Collective: call on every rank. N terms added one after another, in any order, differ from
    the exact sum by at most (N - 1) u sum|x_i|, with u = eps / 2 the unit roundoff (Rump, BIT 52,
    2012; Jeannerod and Rump, SIAM J. Matrix Anal. Appl. 34, 2013; Higham's classic bound,
    gamma_{N-1} = (N - 1) u / (1 - (N - 1) u), is slightly larger), so two orders differ from
    each other by at most (N - 1) eps sum|x_i|.
    Zero for integer tensors, whose sums are exact.
    """
    if not tensor.is_floating_point():
        return torch.zeros(tensor.shape, dtype=torch.float64, device=tensor.device)
    absolute = tensor.abs().to(torch.float64)
    dist.all_reduce(absolute)
    return (world_size - 1) * torch.finfo(tensor.dtype).eps * absolute


def compare_with_builtin(rank: int, world_size: int, length: int, dtype_name: str,
                         seed: int = 0) -> dict[str, dict[str, float]]:
    """Run every ring primitive and its torch.distributed counterpart on the same inputs.

    Collective: call on every rank. Returns, per primitive, the largest |ours - built-in| and the
    largest allowed by `summation_bound` (both 0 for integers, and for the data-moving primitives).
    """
    x = make_input(rank, length, dtype_name, seed)
    bound = summation_bound(x, world_size)
    builtin_sum = x.clone()
    dist.all_reduce(builtin_sum)
    results = {}

    ring_sum = collectives.ring_all_reduce(x.clone())
    results["all_reduce"] = _difference(ring_sum, builtin_sum, bound)
    own = torch.tensor_split(builtin_sum, world_size)[rank]
    results["reduce_scatter"] = _difference(collectives.ring_reduce_scatter(x), own,
                                            torch.tensor_split(bound, world_size)[rank])
    naive_sum = collectives.naive_all_reduce(x.clone())
    results["naive_all_reduce"] = _difference(naive_sum, builtin_sum, bound)

    shard = torch.tensor_split(x, world_size)[rank]
    results["all_gather"] = _difference(collectives.ring_all_gather(shard),
                                        _builtin_all_gather(shard, world_size), None)
    src = world_size - 1
    results["broadcast"] = _difference(collectives.broadcast(x.clone(), src=src),
                                       builtin_broadcast(x.clone(), src), None)
    return results


def compare_every_algorithm(rank: int, world_size: int, length: int,
                            dtype_name: str) -> dict[str, dict[str, float]]:
    """Every algorithm `auto` may choose, each collective, against torch.distributed's.

    Collective: call on every rank. Keys are "<algorithm> <collective>" (for instance "naive
    reduce_scatter"); values as `compare_with_builtin`'s. On a GPU machine this runs each
    algorithm's messages over NCCL, which pairs a message only when both ends post it alike.
    """
    x = make_input(rank, length, dtype_name)
    bound = summation_bound(x, world_size)
    builtin_sum = x.clone()
    dist.all_reduce(builtin_sum)
    shard = torch.tensor_split(x, world_size)[rank]
    builtin_gathered = _builtin_all_gather(shard, world_size)
    results = {}
    for name in choose.ALL_REDUCE:
        ours = collectives.all_reduce(x.clone(), algorithm=name)
        results[f"{name} all_reduce"] = _difference(ours, builtin_sum, bound)
    for name in choose.REDUCE_SCATTER:
        ours = collectives.reduce_scatter(x, algorithm=name)
        results[f"{name} reduce_scatter"] = _difference(
            ours, torch.tensor_split(builtin_sum, world_size)[rank],
            torch.tensor_split(bound, world_size)[rank])
    for name in choose.ALL_GATHER:
        ours = collectives.all_gather(shard, algorithm=name)
        results[f"{name} all_gather"] = _difference(ours, builtin_gathered, None)
    return results


def compare_all_dtypes(rank: int, world_size: int, length: int,
                       seed: int = 0) -> dict[str, dict[str, dict[str, float]]]:
    """`compare_with_builtin` for every dtype in DTYPES: {dtype: {primitive: difference}}.

    Collective: call on every rank.
    """
    return {name: compare_with_builtin(rank, world_size, length, name, seed) for name in DTYPES}


def _builtin_all_gather(shard: torch.Tensor, world_size: int) -> torch.Tensor:
    """torch.distributed's all-gather of shards of unequal length (their lengths gathered first)."""
    lengths = [torch.zeros(1, dtype=torch.int64, device=shard.device) for _ in range(world_size)]
    dist.all_gather(lengths, torch.tensor([shard.shape[0]], device=shard.device))
    return builtin_all_gather(shard, [int(n) for n in lengths])


def builtin_broadcast(tensor: torch.Tensor, src: int) -> torch.Tensor:
    """torch.distributed's broadcast from `src`, returning the tensor like the ring's."""
    dist.broadcast(tensor, src)
    return tensor


def _difference(ours: torch.Tensor, reference: torch.Tensor,
                bound: torch.Tensor | None) -> dict[str, float]:
    """Largest |ours - reference|, largest allowed (`bound`, or 0 when None), and whether within."""
    if ours.shape != reference.shape:
        raise AssertionError(f"shape {tuple(ours.shape)} differs from the built-in's "
                             f"{tuple(reference.shape)}")
    if ours.numel() == 0:
        return {"max_abs_diff": 0.0, "allowed": 0.0, "within": True}
    diff = (ours.to(torch.float64) - reference.to(torch.float64)).abs()
    allowed = bound if bound is not None else torch.zeros_like(diff)
    return {"max_abs_diff": diff.max().item(), "allowed": allowed.max().item(),
            "within": bool((diff <= allowed).all())}


def worst_differences(results: list[dict]) -> dict[str, dict[str, float]]:
    """{dtype: {primitive: largest |ours - built-in| over the ranks}} from `compare_all_dtypes`."""
    return {dtype: {op: max(rank_result[dtype][op]["max_abs_diff"] for rank_result in results)
                    for op in results[0][dtype]}
            for dtype in results[0]}


def failing_dtypes(results: list[dict]) -> list[str]:
    """The dtypes for which some rank's difference exceeds its bound, from `compare_all_dtypes`."""
    return [dtype for dtype in results[0]
            if not all(difference["within"] for rank_result in results
                       for difference in rank_result[dtype].values())]


def measure_ledgers(rank: int, world_size: int, numel: int,
                    dtype_name: str = "float32") -> dict[str, dict[str, int]]:
    """Call each primitive once on a `numel`-element tensor; return this rank's ledger totals.

    Collective: call on every rank. Keys: all_reduce, reduce_scatter, all_gather (shards of the
    same tensor, sizes known), broadcast (from rank 0), naive_all_reduce.
    """
    ledger = CommLedger()
    x = make_input(rank, numel, dtype_name)
    collectives.ring_all_reduce(x.clone(), ledger=ledger)
    shard = collectives.ring_reduce_scatter(x, ledger=ledger)
    sizes = [chunk.shape[0] for chunk in torch.tensor_split(x, world_size)]
    collectives.ring_all_gather(shard, sizes, ledger=ledger)
    collectives.broadcast(x.clone(), src=0, ledger=ledger)
    collectives.naive_all_reduce(x.clone(), ledger=ledger)
    return ledger.totals()


def _ring_ops(world_size: int) -> dict:
    """Each timed operation as (function of a prepared tensor, how to prepare it from the input)."""
    def shard_of(x):
        return torch.tensor_split(x, world_size)[dist.get_rank()].clone()

    def gather_builtin(shard):
        output = shard.new_empty(shard.shape[0] * world_size)
        dist.all_gather_single(output, shard)

    def scatter_builtin(x):
        dist.reduce_scatter_single(x.new_empty(x.shape[0] // world_size), x)

    def gather_with(all_gather):
        return lambda shard: all_gather(shard, [shard.shape[0]] * world_size)

    return {
        "ring all_reduce": (collectives.ring_all_reduce, torch.clone),
        "gloo all_reduce": (dist.all_reduce, torch.clone),
        "naive all_reduce": (collectives.naive_all_reduce, torch.clone),
        "recursive_doubling all_reduce": (collectives.recursive_doubling_all_reduce, torch.clone),
        "halving_doubling all_reduce": (collectives.halving_doubling_all_reduce, torch.clone),
        "direct all_reduce": (collectives.direct_all_reduce, torch.clone),
        "shared_memory all_reduce": (collectives.shared_memory_all_reduce, torch.clone),
        "auto all_reduce": (collectives.all_reduce, torch.clone),
        "ring reduce_scatter": (collectives.ring_reduce_scatter, torch.clone),
        "gloo reduce_scatter": (scatter_builtin, torch.clone),
        "direct reduce_scatter": (collectives.direct_reduce_scatter, torch.clone),
        "naive reduce_scatter": (collectives.naive_reduce_scatter, torch.clone),
        "auto reduce_scatter": (collectives.reduce_scatter, torch.clone),
        "ring all_gather": (gather_with(collectives.ring_all_gather), shard_of),
        "gloo all_gather": (gather_builtin, shard_of),
        "direct all_gather": (gather_with(collectives.direct_all_gather), shard_of),
        "naive all_gather": (gather_with(collectives.naive_all_gather), shard_of),
        "auto all_gather": (gather_with(collectives.all_gather), shard_of),
        "tree broadcast": (collectives.broadcast, torch.clone),
        "gloo broadcast": (lambda x: dist.broadcast(x, 0), torch.clone),
    }


TIMED_OPS = tuple(_ring_ops(2))  # the names time_primitives accepts (the same for every N)


def time_primitives(rank: int, world_size: int, sizes: list[int], trials: int = 5,
                    min_trial_s: float = 0.05, ops: list[str] | None = None,
                    alternate: bool = False) -> list[dict]:
    """Time ring and built-in collectives on float32 tensors of `sizes` bytes (full tensor).

    Collective: call on every rank. For each size and operation, a trial calls it `repeats` times
    back to back, `repeats` chosen so a trial lasts about `min_trial_s` and agreed on by all ranks
    (from the slowest rank's first call, so that every rank makes the same calls);
    `timing.collective_seconds` times `trials` trials, every rank starting each together. The
    reported time is the slowest rank's median: a collective ends when its last rank does.
    With `alternate`, the operations of one size are timed in turn, twice, each keeping its
    better round (`timing.alternating_seconds`): none gets the caches another warmed, which is
    how "auto" and gloo's built-in are compared. Returns rows {op, nbytes, seconds}. Raises
    ValueError for an unknown op name or a size that is not a multiple of 4 * world_size.
    """
    table = _ring_ops(world_size)
    chosen = ops or list(table)
    for op in chosen:
        require_choice("operation", op, tuple(table))
    require_positive("min_trial_s", min_trial_s, "the seconds one trial should last, such as 0.05")
    for nbytes in sizes:
        if nbytes % (4 * world_size):
            raise ValueError(f"size {nbytes} B is not a multiple of 4 * world_size = "
                             f"{4 * world_size}: pick sizes that split evenly")
    rows = []
    for nbytes in sizes:
        x = make_input(0, nbytes // 4, "float32")
        if alternate:  # every call's tensor at once, to time them in turn
            calls = [partial(table[op][0], table[op][1](x)) for op in chosen]
            times = alternating_seconds(calls, trials=trials, min_trial_s=min_trial_s)
        else:  # one tensor at a time: 64 MiB times every operation would not fit many machines
            times = [collective_seconds(partial(table[op][0], table[op][1](x)), trials=trials,
                                        min_trial_s=min_trial_s)[0] for op in chosen]
        rows += [{"op": op, "nbytes": nbytes, "seconds": seconds}
                 for op, seconds in zip(chosen, times)]
    return rows


def crossover_bytes(ring: cost_model.AlphaBeta, naive: cost_model.AlphaBeta,
                    world_size: int) -> float:
    """Tensor size (bytes) above which the fitted models predict the ring all-reduce faster than
    the naive one on `world_size` ranks: 0 when the ring is never slower, inf when never faster,
    and -x when the ring is faster only below x bytes (its fitted alpha the smaller, its cost per
    byte the higher).

    Both models send m = 2(N-1) messages in a row, so T_ring(n) < T_naive(n) when
    m (alpha_ring - alpha_naive) < n (b_naive beta_naive - b_ring beta_ring), with b the bytes per
    rank of a one-byte tensor (2(N-1) for the naive scheme, 2(N-1)/N for the ring).
    """
    latency_gap = (ring.alpha - naive.alpha) * cost_model.message_count("all_reduce", world_size)
    byte_gap = (cost_model.bytes_per_rank("naive_all_reduce", 1, world_size) * naive.beta
                - cost_model.bytes_per_rank("all_reduce", 1, world_size) * ring.beta)
    if byte_gap > 0:  # the ring's bytes are the cheaper: it wins above some size
        return max(latency_gap / byte_gap, 0.0)
    if latency_gap >= 0:  # no cheaper on either term: it wins at no size
        return math.inf
    # cheaper per message, no cheaper per byte: it wins at every size, or below -latency/-bytes
    return 0.0 if byte_gap == 0 else -latency_gap / byte_gap


# A timing run's sign of unreliability: a collective's time hardly falls as the tensor grows, so a
# size this much slower than a larger one shows noise of that order (lesson 76, exercise 5).
RELIABILITY_SLACK = 1.2


def slower_than_larger(seconds: dict[int, float], slack: float = RELIABILITY_SLACK) -> list[int]:
    """The sizes (bytes, ascending) whose time is over `slack` times the fastest time measured at
    that size or a larger one. `seconds` maps a tensor's bytes to its time.

    Lesson 76 reads no difference smaller than the largest such inversion from a run.
    """
    sizes = sorted(seconds)
    return [n for i, n in enumerate(sizes)
            if seconds[n] > slack * min(seconds[m] for m in sizes[i:])]


# What lesson 76 prints (the command's report, and lines of the notebook), in each edition;
# `say` fills them, with numbers by the Persian rule in Persian (`language.fill`).
SAY = {
    "en": {
        "title": "lesson 76: ring primitives against torch.distributed, {ranks} ranks, "
                 "{length} elements",
        "difference": "{op}={diff:.2g}", "outside": "  OUTSIDE THE BOUND",
        "equal": "all results equal the built-ins within the float summation bound",
        "mismatch": "mismatch for {failures}",
        "crossover": "model: ring faster above {kib:.0f} KiB",
        "crossover_never": "model: ring never faster (its fitted cost per byte is the higher)",
        "crossover_always": "model: ring faster at every size",
        "crossover_below": "model: ring faster below {kib:.0f} KiB",
        "crossover_below_size": "model: ring faster below {size}",
        "measured_faster": "measured: ring faster at {sizes} bytes",
        "measured_never": "measured: ring faster at no size", "then": "; ",
        "crossover_size": "model: ring faster above {size}",
        "measured_faster_size": "measured: ring faster at {sizes}", "sign_at_size": "{name} at {sizes}",
        "fit_agrees": "fit and run agree: each size's faster scheme is the one the fit predicts",
        "fit_disagrees": "fit and run disagree at {sizes}",
        "sign": "over {percent}% slower than a larger size: {found}",
        "sign_at": "{name} at {sizes} bytes", "sign_none": "none", "sign_join": "; ",
        "extrapolated": " (extrapolated: above the largest size timed)",
        "inversion": "largest inversion: {found}", "inversion_of": "{name} {ratio:.2f}x",
        "ahead": "faster by more than the largest inversion, {bound:.2f}x: {found}",
        "neither": "neither",
        "switches": "predicted switches (bytes, from, to): {switches}",
        "switch": "", "no_switch": "none: one algorithm is the fastest at every size of this range",
        "worst": "worst ratio of each: {worst}",
        "without": "without shared memory, from 4 MiB up: {low:.2f}x to {high:.2f}x",
        "agrees": "verdict: agrees with the book (naive at {low:,} bytes, shared memory at "
                  "{high:,}, each ahead by more than {bound:.2f}x)",
        "undecided": "verdict: undecided, rerun ({reasons})", "reasons_join": "; ",
        "undecided_load": "load: {load:.2f} on {cores} cores at the start",
        "load_high": "load {load:.2f} on {cores} cores at the start: these times describe a "
                     "loaded machine; compare with the stored run only below {cores}",
        "load_low": "load {load:.2f} on {cores} cores at the start: below the core count",
        "undecided_gap": "gap: within {bound:.2f}x at {sizes} bytes",
        "gaps_clear": "gaps: both over {bound:.2f}x",
        "differs": "verdict: differs from the book (the switch is not between {low:,} and "
                   "{high:,} bytes)",
        "hang": "rank {rank} of {ranks} gave up after {seconds:g} s in {op}: a message it waited "
                "for never came",
        "ratio_at": "{ratio:.2f}x at {nbytes:,} bytes",
        "direct_over_shared_memory": "direct over shared memory: {found}",
        "inversion_at": "largest inversion: {name} {ratio:.2f}x at {nbytes:,} bytes",
    },
    "fa": {
        "title": "درس ۷۶: عملیات حلقه‌ای در برابر torch.distributed، {ranks} رتبه، {length} عنصر",
        "difference": "{op} {diff:.2g}", "outside": "  بیرون از کران",
        "equal": "همهٔ نتیجه‌ها، در کران خطای جمع اعشاری، با عملیات توکار برابرند",
        "mismatch": "ناهمخوانی در {failures}",
        "crossover": "مدل: حلقه بالاتر از {kib:.0f} KiB سریع‌تر است",
        "crossover_never": "مدل: حلقه در هیچ اندازه‌ای سریع‌تر نیست (هزینهٔ برازش‌شدهٔ هر بایتش "
                           "بیشتر است)",
        "crossover_always": "مدل: حلقه در همهٔ اندازه‌ها سریع‌تر است",
        "crossover_below": "مدل: حلقه زیر {kib:.0f} KiB سریع‌تر است",
        "crossover_below_size": "مدل: حلقه زیر {size} سریع‌تر است",
        "measured_faster": "اندازه‌گیری: حلقه در {sizes} بایت سریع‌تر بود",
        "measured_never": "اندازه‌گیری: حلقه در هیچ اندازه‌ای سریع‌تر نبود", "then": "؛ ",
        "crossover_size": "مدل: حلقه بالاتر از {size} سریع‌تر است",
        "measured_faster_size": "اندازه‌گیری: حلقه در {sizes} سریع‌تر بود",
        "sign_at_size": "{name} در {sizes}",
        "fit_agrees": "برازش و اجرا با هم می‌خوانند: در هر اندازه همان روشی سریع‌تر بود که "
                      "برازش پیش‌بینی می‌کند",
        "fit_disagrees": "برازش و اجرا در {sizes} با هم نمی‌خوانند",
        "sign": "بیش از {percent}٪ کندتر از اندازه‌ای بزرگ‌تر: {found}",
        "sign_at": "{name} در {sizes} بایت", "sign_none": "هیچ",
        "sign_join": "؛ ",
        "extrapolated": " (برون‌یابی: بالاتر از بزرگ‌ترین اندازهٔ زمان‌گیری‌شده)",
        "inversion": "بزرگ‌ترین وارونگی: {found}", "inversion_of": "{name} {ratio:.2f} برابر",
        "ahead": "سریع‌تر با فاصله‌ای بیش از بزرگ‌ترین وارونگی، {bound:.2f} برابر: {found}",
        "neither": "هیچ‌یک",
        "switches": "نقطه‌های تغییر الگوریتم (پیش‌بینی‌شده): {switches}",
        "switch": "در {nbytes:,} بایت از {before} به {after}",
        "no_switch": "هیچ؛ در این بازه یک الگوریتم در همهٔ اندازه‌ها سریع‌ترین است",
        "worst": "بدترین نسبت هر کدام: {worst}",
        "without": "بدون حافظهٔ مشترک، از ۴ MiB به بالا: {low:.2f} تا {high:.2f} برابر",
        "agrees": "حکم: با کتاب هم‌خوان است (روش ساده‌لوحانه در {low:,} بایت و حافظهٔ مشترک در "
                  "{high:,} بایت، هر کدام بیش از {bound:.2f} برابر جلوتر)",
        "undecided": "حکم: نامعلوم، دوباره اجرا کنید ({reasons})", "reasons_join": "؛ ",
        "undecided_load": "بار: {load:.2f} روی {cores} هسته در آغاز",
        "load_high": "بار {load:.2f} روی {cores} هسته در آغاز: این زمان‌ها دستگاهی پربار را وصف "
                     "می‌کنند؛ فقط وقتی بار زیر {cores} است با اجرای ذخیره‌شده مقایسه کنید",
        "load_low": "بار {load:.2f} روی {cores} هسته در آغاز: کمتر از شمار هسته‌ها",
        "undecided_gap": "فاصله: نه بیش از {bound:.2f} برابر در {sizes} بایت",
        "gaps_clear": "فاصله‌ها: هر دو بیش از {bound:.2f} برابر",
        "differs": "حکم: با کتاب فرق دارد (نقطهٔ تغییر میان {low:,} و {high:,} بایت نیست)",
        "hang": "رتبهٔ {rank} از {ranks} رتبه پس از {seconds:g} ثانیه در {op} دست کشید: پیامی که "
                "منتظرش بود هرگز نرسید",
        "ratio_at": "{ratio:.2f} برابر در {nbytes:,} بایت",
        "direct_over_shared_memory": "نسبت زمانِ روش مستقیم به حافظهٔ مشترک: {found}",
        "inversion_at": "بزرگ‌ترین وارونگی: {name} {ratio:.2f} برابر در {nbytes:,} بایت",
    },
}
# The primitives and algorithms by their glossary words (book/fa/glossary.md).
WORDS = {"all_reduce": "کاهش همگانی", "reduce_scatter": "کاهش و پخش", "all_gather": "گردآوری همگانی",
         "broadcast": "بازپخش", "naive_all_reduce": "کاهش همگانی ساده‌لوحانه", "naive": "ساده‌لوحانه",
         "ring": "حلقه", "direct": "مستقیم", "shared_memory": "حافظهٔ مشترک",
         "recursive_doubling": "دوبرابرسازی بازگشتی", "halving_doubling": "نیم‌سازی و دوبرابرسازی"}


def say(key: str, lang: str, **values) -> str:
    """Line `key` of SAY in edition `lang`, filled with `values` (`language.fill`)."""
    return language.fill(SAY[language.check_language(lang)][key], lang, **values)


def crossover_line(crossover: float, faster_sizes: list[int], lang: str,
                   largest: int | None = None, readable: bool = False) -> str:
    """The crossover of `crossover_bytes` beside the sizes at which the ring was measured faster.

    An infinite crossover (the fit never favours the ring) reads "never", a zero one "every size",
    a negative one -x "faster below x", and no faster size "no size", rather than "inf KiB",
    "0 KiB", "-x KiB" or "[]"; Persian lists the
    sizes with its own comma and joins the last one with «و», as Persian prose does. A finite
    crossover above `largest` (the largest size timed, bytes) is marked as extrapolated.
    `readable=True` writes every size in KiB or MiB (`size_text`) instead of bytes.
    """
    if math.isinf(crossover):
        model = say("crossover_never", lang)
    elif crossover == 0:
        model = say("crossover_always", lang)
    else:
        below = "_below" if crossover < 0 else ""
        if readable:
            model = say(f"crossover{below}_size", lang, size=size_text(abs(crossover), lang))
        else:
            model = say(f"crossover{below}", lang, kib=abs(crossover) / 1024)
    if 0 < abs(crossover) < math.inf and largest is not None and abs(crossover) > largest:
        model += say("extrapolated", lang)
    if not faster_sizes:
        measured = say("measured_never", lang)
    elif readable:
        measured = say("measured_faster_size", lang, sizes=_size_texts(faster_sizes, lang))
    else:
        measured = say("measured_faster", lang, sizes=_sizes(faster_sizes, lang))
    return model + say("then", lang) + measured


def size_text(nbytes: float, lang: str) -> str:
    """A size in bytes as the lesson's prose writes it: "4 KiB", "16 MiB", "12.1 MiB" (a whole
    number of units without decimals, another with one), in `lang`'s digits."""
    for unit, scale in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if nbytes >= scale:
            value = nbytes / scale
            return f"{language.number(value, lang, '.0f' if value == int(value) else '.1f')} {unit}"
    return f"{language.number(nbytes, lang, '.0f')} {'بایت' if lang == 'fa' else 'B'}"


def _size_texts(sizes: list[int], lang: str) -> str:
    """A non-empty list of sizes in `size_text`'s units, joined as `lang`'s prose joins a list."""
    return language.series([size_text(n, lang) for n in sizes], lang)


def _sizes(sizes: list[int], lang: str):
    """A non-empty list of sizes as `lang` prints it: the list itself in English; in Persian,
    each grouped in thousands as the other byte counts («۶۵٬۵۳۶»), with its own comma and the
    last one joined with «و», as Persian prose does."""
    if lang != "fa":
        return sizes
    return language.series([language.number(n, "fa", ",") for n in sizes], "fa")


def sign_line(found: dict[str, list[int]], lang: str, slack: float = RELIABILITY_SLACK,
              readable: bool = False) -> str:
    """`slower_than_larger`'s sizes of each timed operation ({name: [bytes, ...]}) as a line of
    `lang`; the names are printed as given (pass them in the page's language), and a name with no
    size is left out. `readable=True` writes the sizes in KiB or MiB (`size_text`) instead of bytes."""
    return say("sign", lang, percent=round(100 * (slack - 1)),
               found=_groups_text(found, lang, readable))


def largest_inversion(seconds: dict[int, float]) -> float:
    """The largest ratio of a size's time to the least time of a larger size (1.0 when no time
    exceeds a larger size's). `seconds` maps a tensor's bytes to its time.

    A collective's time hardly falls as its tensor grows, so a ratio this large is the run's
    noise: lesson 76 orders two schemes at a size only when their ratio is further from 1.
    """
    sizes = sorted(seconds)
    return max([1.0] + [seconds[n] / min(seconds[m] for m in sizes[i + 1:])
                        for i, n in enumerate(sizes[:-1])])


def inversion_line(inversions: dict[str, float], lang: str) -> str:
    """`largest_inversion` of each timed operation ({name: ratio}) as a line of `lang`; the
    names are printed as given (pass them in the page's language)."""
    found = say("sign_join", lang).join(say("inversion_of", lang, name=name, ratio=ratio)
                                        for name, ratio in inversions.items())
    return say("inversion", lang, found=found)


def _groups_text(groups: dict[str, list[int]], lang: str, readable: bool) -> str:
    """"<name> at <sizes>" for each group that has a size, joined; the groups with no size are
    left out, and "none" stands for them all when every group is empty."""
    parts = [_sizes_of(name, sizes, lang, readable) for name, sizes in groups.items() if sizes]
    return say("sign_join", lang).join(parts) if parts else say("sign_none", lang)


def _sizes_of(name: str, sizes: list[int], lang: str, readable: bool) -> str:
    """"<name> at <sizes>" of the lesson's lines, for a non-empty list of sizes."""
    if readable:
        return say("sign_at_size", lang, name=name, sizes=_size_texts(sizes, lang))
    return say("sign_at", lang, name=name, sizes=_sizes(sizes, lang))


def ahead_line(ring: dict[int, float], naive: dict[int, float], bound: float, lang: str,
               readable: bool = False) -> str:
    """The sizes at which the ring or the naive all-reduce was faster by more than `bound` (the
    run's largest inversion), and those at which neither was, as a line of `lang`; a group with
    no size is left out.

    `ring` and `naive` map a tensor's bytes to its time, at the same sizes; `readable=True`
    writes the sizes in KiB or MiB (`size_text`) instead of bytes.
    """
    ratios = {n: ring[n] / naive[n] for n in sorted(ring)}
    ring_name, naive_name = ("حلقه", "روش ساده‌لوحانه") if lang == "fa" else ("ring", "naive")
    groups = {ring_name: [n for n, q in ratios.items() if q < 1 / bound],
              naive_name: [n for n, q in ratios.items() if q > bound],
              say("neither", lang): [n for n, q in ratios.items() if 1 / bound <= q <= bound]}
    return say("ahead", lang, bound=bound, found=_groups_text(groups, lang, readable))


def fit_agreement_line(crossover: float, faster_sizes: list[int], sizes: list[int],
                       lang: str) -> str:
    """Whether a run and the fit made from it order the ring and the naive all-reduce alike at
    every size timed: the fit (`crossover_bytes`) makes the ring faster at the sizes above
    `crossover` (below -`crossover` when it is negative); the run made it faster at
    `faster_sizes`. Names the sizes where they differ."""
    predicted = {n for n in sizes if (n < -crossover if crossover < 0 else n > crossover)}
    differing = sorted(predicted.symmetric_difference(faster_sizes))
    if not differing:
        return say("fit_agrees", lang)
    return say("fit_disagrees", lang, sizes=_size_texts(differing, lang))


def hang_line(rank_traceback: str, lang: str) -> str:
    """The bounded wait's TimeoutError that ends `rank_traceback` (`Peers`), as a line of `lang`:
    which rank gave up, after how many seconds, in which collective.

    Raises ValueError when the traceback holds no such error (the rank failed otherwise).
    """
    found = re.search(r"TimeoutError: rank (\d+) of (\d+) waited (\S+) s in (\w+)", rank_traceback)
    if found is None:
        raise ValueError("the traceback holds no TimeoutError of a bounded wait (rank r of N waited "
                         f"... s in ...); it ends: {rank_traceback.strip().splitlines()[-1:]}")
    rank, ranks, seconds, op = found.groups()
    return say("hang", lang, rank=int(rank), ranks=int(ranks), seconds=float(seconds),
               op=op if lang == "en" else WORDS.get(op, op))


def switches_line(switches: list[tuple[int, str, str]], lang: str) -> str:
    """`choose.predicted_switches`' (bytes, from, to) as a line of `lang`; with no switch, a
    word that says so rather than an empty list."""
    if not switches:
        return say("switches", lang, switches=say("no_switch", lang))
    if lang == "en":
        return say("switches", lang, switches=switches)
    words = WORDS | {"naive": "روش ساده‌لوحانه"}  # the adjective alone does not name a method
    return say("switches", lang, switches="؛ ".join(
        say("switch", lang, nbytes=nbytes, before=words.get(before, before),
            after=words.get(after, after)) for nbytes, before, after in switches))


def load_line(load: float, cores: int, lang: str) -> str:
    """The load average read before a timing run, as a line of `lang`: at or above the core count
    it warns that the times describe that load, and are not to be compared with the stored run."""
    return say("load_high" if load >= cores else "load_low", lang, load=load, cores=cores)


def switch_verdict(rows: list[dict], bound: float, load: float, cores: int, lang: str) -> str:
    """Whether exercise 5's run agrees with the book's one switch, from the naive all-reduce to
    shared memory, as a line of `lang`.

    `rows` are {algorithm, nbytes, seconds} of both algorithms at three or more sizes. The run
    agrees when the naive all-reduce wins the smallest size and shared memory the largest, each
    by more than `bound` (the stored table's largest inversion); it is undecided when either gap
    is within `bound` or the load average at the start reached the core count, and then says
    which of the two applied (both, or the load with both gaps over `bound`); else it differs.
    """
    times = {(row["algorithm"], row["nbytes"]): row["seconds"] for row in rows}
    sizes = sorted({nbytes for _, nbytes in times})
    low, high = sizes[0], sizes[-1]
    shm_over_naive = {n: times["shared_memory", n] / times["naive", n] for n in (low, high)}
    values = {"low": low, "high": high, "bound": bound}
    close = [n for n, ratio in shm_over_naive.items() if 1 / bound <= ratio <= bound]
    if load >= cores or close:
        reasons = [say("undecided_load", lang, load=load, cores=cores)] if load >= cores else []
        if close:
            sizes = (" و " if lang == "fa" else " and ").join(
                language.number(n, lang, ",") for n in close)
            reasons.append(say("undecided_gap", lang, bound=bound, sizes=sizes))
        else:
            reasons.append(say("gaps_clear", lang, bound=bound))
        return say("undecided", lang, reasons=say("reasons_join", lang).join(reasons))
    if shm_over_naive[low] > bound and shm_over_naive[high] < 1 / bound:
        return say("agrees", lang, **values)
    return say("differs", lang, **values)


def worst_line(worst: dict[str, float], lang: str) -> str:
    """The worst ratio of each collective ({"all_reduce": 0.78, ...}) as a line of `lang`."""
    if lang == "en":
        return say("worst", lang, worst=worst)
    return say("worst", lang, worst=language.listed(
        (f"{WORDS.get(name, name)} {language.number(ratio, 'fa')}" for name, ratio in worst.items()),
        "fa"))


def ratios_line(key: str, ratios: dict[int, float], lang: str) -> str:
    """Line `key` of SAY (one time over another, such as "direct_over_shared_memory") with its
    ratio at each size ({bytes: ratio}), as a line of `lang`: "1.89x at 4,194,304 bytes"."""
    found = say("sign_join", lang).join(say("ratio_at", lang, ratio=ratio, nbytes=nbytes)
                                        for nbytes, ratio in ratios.items())
    return say(key, lang, found=found)


def inversion_at_line(algorithm: str, ratio: float, nbytes: int, lang: str) -> str:
    """The largest inversion of a stored table: `algorithm`'s time at `nbytes` over the least
    time of a larger size, as a line of `lang` with the algorithm by its glossary word."""
    name = algorithm if lang == "en" else (WORDS | {"naive": "روش ساده‌لوحانه"}).get(algorithm,
                                                                                       algorithm)
    return say("inversion_at", lang, name=name, ratio=ratio, nbytes=nbytes)


def main(argv: list[str] | None = None) -> int:
    """Check every primitive against torch.distributed on N ranks and print one line per dtype."""
    import argparse

    from lesson_code import launch
    from lesson_code.harness import cli_args

    parser = argparse.ArgumentParser(prog="python -m lesson_code.collectives_lab",
                                     description=main.__doc__)
    parser.add_argument("--world-size", type=cli_args.positive_int, default=4, help="ranks to "
                        "spawn (ignored under torchrun, which decides)")
    parser.add_argument("--length", type=cli_args.positive_int, default=1001,
                        help="elements per tensor")
    cli_args.add_language(parser)
    args = parser.parse_args(argv)
    results = launch.run(compare_all_dtypes, args.length,
                         world_size=args.world_size)
    if not launch.is_reporting_process():
        return 0
    failures, lang = failing_dtypes(results), args.lang
    print(say("title", lang, ranks=len(results), length=args.length))
    words = WORDS if lang == "fa" else {}
    for dtype, worst in worst_differences(results).items():
        print(f"  {dtype:9s} " + ("  " if lang == "en" else "، ").join(
            say("difference", lang, op=words.get(op, op), diff=diff) for op, diff in worst.items())
              + (say("outside", lang) if dtype in failures else ""))
    print(say("equal", lang) if not failures else say("mismatch", lang, failures=failures))
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())

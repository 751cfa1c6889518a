"""One switch between lesson 76's ring collectives and torch.distributed's built-ins (lessons 77-81).

DDP and ZeRO talk to the other ranks through a `Communicator`: `Communicator("ring")` uses the
point-to-point collectives of `lesson_code.collectives` and counts every byte in a ledger (its
all-reduce is `collectives.all_reduce`: the algorithm "auto" picks for the size, or the one named
by `algorithm=`, such as "ring");
`Communicator("builtin")` calls gloo's or NCCL's own collectives (faster on real hardware, but what
they put on the wire is not counted). Both give the same results, within float summation order.

    comm = Communicator("ring", ledger=CommLedger())
    handle = comm.all_reduce_async(bucket, op="avg")   # returns at once
    ...                                                # keep computing
    handle.wait()                                      # bounded by timeout_s

Collectives: every method is called on every rank, in the same order. Asynchronous ring
all-reduces run, in the order they were started, on one background thread per communicator.
A reduction that fails or times out leaves its messages half exchanged, so the communicator then
refuses every later call (RuntimeError) rather than let them receive each other's messages. A
reduction whose wait timed out may keep its thread blocked until the ring's own timeout; the
thread is a daemon, so the process can still end at once (see `RingThread`).
The rings themselves are checked by `python -m lesson_code.collectives_lab` (lesson 76). Lessons
77 and 78 run a Communicator: `python -m lesson_code.ddp_lab`, `python -m lesson_code.zero_lab`.
"""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future
from datetime import timedelta
from functools import partial
from typing import Callable

import torch
import torch.distributed as dist

from lesson_code.collectives import choose, ring
from lesson_code.collectives.ledger import CommLedger
from lesson_code.collectives.p2p import DEFAULT_WAIT_S
from lesson_code.harness.validate import require_choice

KINDS = ("ring", "builtin")


class PendingReduce:
    """Handle of an asynchronous all-reduce; `wait()` blocks (bounded) until the tensor is reduced."""

    def __init__(self, wait: Callable[[float], None]):
        self._wait = wait
        self.done = False

    def wait(self, timeout_s: float = DEFAULT_WAIT_S) -> None:
        """Block until the reduction finished; raise TimeoutError after `timeout_s`."""
        if not self.done:
            self._wait(timeout_s)
            self.done = True


class RingThread:
    """One daemon thread that runs a communicator's asynchronous calls in the order submitted.

    Not a ThreadPoolExecutor: Python joins its threads when the interpreter exits, and a ring
    all-reduce whose wait timed out stays blocked in a receive until the ring's own timeout
    (120 s by default), so a process under torchrun that ended on the TimeoutError would hang
    that long before exiting. Nothing needs that reduction any more (its caller gave up, and the
    communicator refuses every later call), so a daemon thread, which the exit abandons, loses
    nothing. Aborting the process group would end the wait too, but the group is the caller's,
    used after this communicator by whatever reports the error and tears the run down.
    """

    def __init__(self):
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._run, name="ring", daemon=True).start()

    def submit(self, fn: Callable[..., object], *args) -> Future:
        """Queue `fn(*args)`; a Future of its result."""
        future: Future = Future()
        self._calls.put((future, fn, args))
        return future

    def shutdown(self, wait: bool, cancel_queued: bool = False) -> None:
        """Stop once the queued calls ran (`wait`: block until then), or cancel them first."""
        while cancel_queued:
            try:
                queued = self._calls.get_nowait()
            except queue.Empty:
                break
            queued[0].cancel()
        done: Future = Future()
        self._calls.put((done, None, ()))  # the stop: the thread's last item
        if wait:
            done.result()

    def _run(self) -> None:
        while True:
            future, fn, args = self._calls.get()
            if fn is None:
                future.set_result(None)
                return
            if future.set_running_or_notify_cancel():  # False: cancelled while queued
                try:
                    future.set_result(fn(*args))
                except BaseException as error:  # noqa: BLE001 - the caller's wait raises it
                    future.set_exception(error)


class Communicator:
    """all_reduce, reduce_scatter, all_gather and broadcast from rings or from torch.distributed.

    `events` lists (op, nbytes, start, end) in time.perf_counter() seconds for every ring call when
    `record_events` is True (lesson 77 draws its overlap timeline from them).
    Raises ValueError for an unknown kind or reduction op, and RuntimeError for any call after a
    reduction failed or timed out (the communicator is then broken: end the run and start anew).
    """

    def __init__(self, kind: str = "ring", ledger: CommLedger | None = None, *, group=None,
                 timeout_s: float = DEFAULT_WAIT_S, record_events: bool = False,
                 algorithm: str = "auto", costs: choose.AlgorithmCosts | None = None):
        require_choice("communicator kind", kind, KINDS)
        require_choice("algorithm", algorithm, choose.CHOICES)
        self.kind, self.ledger, self.group, self.timeout_s = kind, ledger, group, timeout_s
        self.algorithm, self.costs = algorithm, costs  # how kind "ring" all-reduces
        self.record_events = record_events
        self.events: list[tuple[str, int, float, float]] = []
        self._thread: RingThread | None = None
        self._broken: str | None = None  # why this communicator may no longer be used

    @property
    def world_size(self) -> int:
        """Ranks in this communicator's group."""
        return dist.get_world_size(self.group)

    @property
    def rank(self) -> int:
        """This rank's place in the group."""
        return dist.get_rank(self.group)

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """Reduce `tensor` in place over all ranks ("sum" or "avg"); return it."""
        self._check_call(op)
        if self.kind == "ring":
            return self._ring("all_reduce", partial(choose.all_reduce, algorithm=self.algorithm,
                                                    costs=self.costs), tensor, op)
        dist.all_reduce(tensor, group=self.group)
        return tensor.div_(self.world_size) if op == "avg" else tensor

    def all_reduce_async(self, tensor: torch.Tensor, op: str = "sum") -> PendingReduce:
        """Start reducing `tensor` in place and return at once; call `.wait()` before reading it."""
        self._check_call(op)
        nbytes = tensor.numel() * tensor.element_size()
        if self.kind == "ring":
            if self._thread is None:
                self._thread = RingThread()
            future = self._thread.submit(self.all_reduce, tensor, op)
            return self._pending(lambda timeout_s: future.result(timeout=timeout_s), nbytes)
        work = dist.all_reduce(tensor, group=self.group, async_op=True)

        def finish(timeout_s: float) -> None:
            work.wait(timedelta(seconds=timeout_s))
            if op == "avg":
                tensor.div_(self.world_size)
        return self._pending(finish, nbytes)

    def reduce_scatter(self, tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """This rank's chunk `torch.tensor_split(reduced, N)[rank]` of the reduction of `tensor`."""
        self._check_call(op)
        if self.kind == "ring":
            return self._ring("reduce_scatter", ring.ring_reduce_scatter, tensor, op)
        n = self.world_size
        if tensor.shape[0] % n == 0:
            output = tensor.new_empty((tensor.shape[0] // n, *tensor.shape[1:]))
            dist.reduce_scatter_single(output, tensor.contiguous(), group=self.group)
        else:  # chunks of unequal length: the built-in needs equal ones, so reduce everything
            reduced = tensor.clone()
            dist.all_reduce(reduced, group=self.group)
            output = torch.tensor_split(reduced, n)[self.rank].clone()
        return output.div_(n) if op == "avg" else output

    def all_gather(self, shard: torch.Tensor, sizes: list[int]) -> torch.Tensor:
        """Concatenation along dim 0 of every rank's shard; `sizes[r]` is rank r's length."""
        self._check_call()
        if self.kind == "ring":
            return self._ring("all_gather", ring.ring_all_gather, shard, sizes)
        return builtin_all_gather(shard, sizes, self.group)

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
        """Copy rank `src`'s `tensor` into `tensor` on every rank; return it."""
        self._check_call()
        if self.kind == "ring":
            return self._ring("broadcast", ring.broadcast, tensor, src)
        dist.broadcast(tensor, dist.get_global_rank(self.group, src) if self.group else src,
                       group=self.group)
        return tensor

    def close(self) -> None:
        """Stop the background thread (pending reductions finish first)."""
        if self._thread is not None:
            self._thread.shutdown(wait=True)
            self._thread = None

    def _check_call(self, op: str = "sum") -> None:
        """Raise before any message is sent: for an unknown op, or once the communicator broke."""
        if self._broken is not None:
            raise RuntimeError(
                f"this {self.kind} communicator can no longer be used: {self._broken}. Its "
                "messages may still be in flight and would be received by a later collective in "
                "place of its own, so every later call is refused. End the run on every rank and "
                f"start a new one (with timeout_s above {self.timeout_s:g} s if ranks were slow)"
            )
        require_choice("reduction op", op, ring.OPS)

    def _break(self, reason: str) -> None:
        """Mark the communicator unusable and drop the reductions queued behind the failed one."""
        if self._broken is None:
            self._broken = reason
        if self._thread is not None:
            self._thread.shutdown(wait=False, cancel_queued=True)  # the running one cannot stop
            self._thread = None

    def _pending(self, wait: Callable[[float], None], nbytes: int) -> PendingReduce:
        """A handle whose failed or timed-out wait breaks the communicator."""
        def guarded_wait(timeout_s: float) -> None:
            self._check_call()  # queued behind a reduction that failed: cancelled, never ran
            try:
                wait(timeout_s)
            except TimeoutError:
                self._break(f"an all-reduce of {nbytes} bytes timed out after {timeout_s:g} s")
                raise
            except Exception as error:
                self._break(f"an all-reduce of {nbytes} bytes failed ({type(error).__name__}: "
                            f"{error})")
                raise
        return PendingReduce(guarded_wait)

    def _ring(self, op: str, primitive: Callable[..., torch.Tensor], tensor: torch.Tensor,
              *args) -> torch.Tensor:
        """`primitive(tensor, *args)` with this communicator's group, ledger and timeout.

        Records the call in `events` when asked; a failure part-way breaks the communicator.
        """
        start = time.perf_counter()
        try:
            result = primitive(tensor, *args, group=self.group, ledger=self.ledger,
                               timeout_s=self.timeout_s)
        except (ValueError, TypeError):  # refused before any message was sent
            raise
        except Exception as error:  # a ring step failed part-way: its peers' messages are stale
            self._break(f"a ring {op} failed ({type(error).__name__}: {error})")
            raise
        if self.record_events:
            self.events.append((op, tensor.numel() * tensor.element_size(), start,
                                time.perf_counter()))
        return result


def builtin_all_gather(shard: torch.Tensor, sizes: list[int], group=None) -> torch.Tensor:
    """torch.distributed's all-gather for shards of unequal length: pad to the longest, gather, trim.

    Collective: call on every rank.
    """
    longest = max(sizes)
    padded = shard.new_zeros((longest, *shard.shape[1:]))
    padded[: shard.shape[0]] = shard
    gathered = [torch.empty_like(padded) for _ in sizes]
    dist.all_gather(gathered, padded, group=group)
    return torch.cat([piece[:size] for piece, size in zip(gathered, sizes)])

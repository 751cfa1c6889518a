"""Worlds of many ranks inside this one process, for lesson 78's scale lab (`scale_lab`).

A reader's machine runs 4 real ranks; what the course says of 64 or 512 ranks would otherwise
be a formula. Two simulated worlds run the course's own code, unchanged, for more ranks than
the machine has:

    with fake_rank(world_size=512, rank=0):     # this process is rank 0 of 512
        ...                                     # collectives return at once, moving nothing

    results = run_threads(fn, arg, world_size=4)    # fn(rank, 4, arg) on 4 threads

`fake_rank` uses torch's `fake` process-group backend: every collective and every message
completes at once without moving a byte, so the code runs, allocates and counts as rank `rank`
would, but what it receives is whatever its buffers held: the values are meaningless, the
shapes, bytes and messages are the real ones. One rank runs at a time; ask again for another.

`run_threads` runs every rank, each on a thread of this process with a process group that
really moves the data between threads: collectives are torch's threaded process group's
(torch.testing's multi_threaded_pg), and point-to-point messages, which the course's ring
collectives and pipeline are made of, are passed through a mailbox of this module. Values are
real; the ranks take turns on the interpreter, so it suits a few ranks, or many small ones.

Neither measures time, bandwidth, or the buffers a real backend (NCCL, gloo) allocates for
itself. Both are torch-internal machinery (torch.testing._internal), used as torch's own tests
use it. Standard library and torch only.
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
from collections import defaultdict, deque
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist

from torch.utils._python_dispatch import _disable_current_modes

from lesson_code.runtime.errors import RankFailedError, RankTimeoutError
from lesson_code.runtime.validate import require_positive, require_positive_int

BACKEND = "simulated"  # the name `run_threads` registers its process group under
DEFAULT_TIMEOUT_S = 120.0
# The collectives of torch's threaded process group (multi_threaded_pg.ProcessLocalGroup).
COLLECTIVES = ("allreduce", "allreduce_coalesced", "barrier", "allgather", "all_gather_single",
               "broadcast", "scatter", "gather", "reduce_scatter", "reduce_scatter_single",
               "alltoall", "all_to_all_single")
STOP_GRACE_S = 5.0  # how long stopped ranks get to leave their waits before they are given up


@contextmanager
def fake_rank(world_size: int, rank: int = 0) -> Iterator[None]:
    """This process as rank `rank` of `world_size`, in a process group that moves no data.

    Every collective and every message returns at once: what a rank sends is counted by the
    code that sends it, what it receives is left as its buffer was. Torch's intra-op threads
    are set to 1 meanwhile, as on a rank. Raises ValueError for a bad world size or rank, and
    RuntimeError when this process already belongs to a process group (inside a rank).
    """
    require_positive_int("world_size", world_size, "the number of simulated ranks, such as 64")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ValueError(f"rank={rank!r} is not in 0..{world_size - 1}: pass a rank of the "
                         f"{world_size} simulated ranks")
    if dist.is_initialized():
        raise RuntimeError("this process already belongs to a process group (it is a rank of a "
                           "real run): simulate from the notebook or a plain Python process")
    from torch.testing._internal.distributed.fake_pg import FakeStore  # registers "fake"

    excepthook = sys.excepthook
    with one_torch_thread():
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
        sys.excepthook = excepthook  # init_process_group prefixes every later traceback "[rank0]"
        try:
            yield
        finally:
            dist.destroy_process_group()


@contextmanager
def one_torch_thread() -> Iterator[None]:
    """Torch's intra-op threads set to 1 meanwhile, then back to what they were: as on a rank.
    On a machine whose cores are busy, more threads can make small operations many times
    slower (measured: building a 512-layer MiniGPT, 12 s with 2 threads, 2 s with 1)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def run_threads(fn: Callable[..., Any], *args: Any, world_size: int = 4,
                timeout_s: float = DEFAULT_TIMEOUT_S) -> list[Any]:
    """`fn(rank, world_size, *args)` on `world_size` threads of this process, each a rank of one
    process group that moves real data; the results in rank order.

    Like `launch.spawn`, but in this process: `fn` may be any callable, and what the ranks
    return is not copied. torch.distributed keeps its process groups per thread here, so a
    thread that a rank starts belongs to no group: lesson 77's DDP, whose ring reduces on a
    thread of its own, runs here only with torch's collectives (comm="builtin"). Torch's
    intra-op threads are 1 meanwhile (shared by the ranks, as the interpreter is); each rank
    has its own state of the random generator, and the caller's is as it was when the call
    returns. Raises RankFailedError naming the first rank that raised, with its traceback (the
    others are woken from their waits and stopped), and RankTimeoutError naming the ranks
    still running after `timeout_s`. RuntimeError when this process already belongs to a
    process group.
    """
    require_positive_int("world_size", world_size, "the number of simulated ranks, such as 4")
    require_positive("timeout_s", timeout_s, "a number of seconds, such as 120")
    if dist.is_initialized():
        raise RuntimeError("this process already belongs to a process group (it is a rank of a "
                           "real run): simulate from the notebook or a plain Python process")
    from torch.testing._internal.distributed import multi_threaded_pg as threaded

    if BACKEND not in dist.Backend.backend_list:
        dist.Backend.register_backend(BACKEND, _create_group, devices=["cpu"])
    world = _ThreadWorld(world_size, timeout_s)
    ranks = [_RankThread(world, rank, fn, args) for rank in range(world_size)]
    excepthook = sys.excepthook
    with world.only_one, one_torch_thread():  # torch's threaded groups keep state on a class
        threaded._install_threaded_pg()
        torch._C._distributed_c10d._set_thread_isolation_mode(True)  # group names per thread
        try:
            for thread in ranks:
                thread.start()
            deadline = time.monotonic() + timeout_s
            for thread in ranks:
                thread.join(max(0.0, deadline - time.monotonic()))
                if thread.failure is not None:
                    break  # stop waiting: the others are being woken
            late = [t.rank for t in ranks if t.is_alive() and t.failure is None]
            world.stop()
            grace = time.monotonic() + STOP_GRACE_S
            for thread in ranks:  # woken ranks end at once; one stuck computing cannot be
                thread.join(max(0.0, grace - time.monotonic()))
        finally:
            world.close()
            torch._C._distributed_c10d._set_thread_isolation_mode(False)
            threaded._uninstall_threaded_pg()
            threaded.ProcessLocalGroup.reset()
            torch.set_rng_state(world.start_rng)  # the ranks' draws were other "processes'"
            sys.excepthook = excepthook  # each rank's init_process_group replaced it
    failed = [t for t in ranks if t.failure is not None and t.failed_at <= world.stopped_at]
    if failed:
        first = min(failed, key=lambda t: t.failed_at)
        raise RankFailedError(first.rank, world_size, first.failure)
    if late:  # what the late ranks raised once woken is the stop's doing, not the cause
        raise RankTimeoutError(late, world_size, timeout_s)
    return [t.result for t in ranks]


class _ThreadWorld:
    """What the ranks of one `run_threads` share: their mailbox, the turn, whether it stopped.

    The ranks take turns: one runs at a time, and hands the turn on only while it waits for a
    message or a collective. Each keeps its own state of torch's random generator (which the
    threads of a process share) from turn to turn, starting from the caller's, as a forked
    process would: a model built from a seed on every rank gets that seed's weights, and a rank
    draws the same numbers as in a process of its own.
    """

    only_one = threading.Lock()  # one thread world at a time in a process

    def __init__(self, world_size: int, timeout_s: float):
        self.world_size, self.timeout_s = world_size, timeout_s
        self.store = dist.HashStore()
        self.mailbox = _Mailbox()
        self.turn = threading.Lock()
        self.holder: int | None = None  # the thread that has the turn
        self.start_rng = torch.get_rng_state()
        self.rng: dict[int, torch.Tensor] = {}  # each rank thread's generator state, between turns
        self.open = True
        self.stopped_at = float("inf")  # time.monotonic() of the first stop
        self.changing = threading.Lock()

    def take_turn(self) -> None:
        """Wait (bounded) until no other rank runs; RuntimeError once the run was stopped.

        The bound outlasts the run's own deadline, so that a rank holding the turn too long is
        reported by `run_threads` as late, rather than the one waiting for it as failed.
        """
        bound = self.timeout_s + STOP_GRACE_S
        if not self.turn.acquire(timeout=bound):
            raise RuntimeError(f"a simulated rank waited {bound:g} s for its turn: another rank "
                               "computed that long without communicating")
        self.holder = threading.get_ident()
        torch.set_rng_state(self.rng.get(self.holder, self.start_rng))
        if self.stopped_at != float("inf"):
            self.give_turn()
            raise RuntimeError("the simulated run was stopped")

    def give_turn(self) -> None:
        """Let another rank run, if this thread has the turn (keeping its generator's state)."""
        if self.holder == threading.get_ident():
            self.rng[self.holder] = torch.get_rng_state()
            self.holder = None
            self.turn.release()

    @contextmanager
    def waiting(self) -> Iterator[None]:
        """Hand the turn on while this rank waits for the others, and take it back after.

        A rank already waiting (a collective torch builds on another: its threaded barrier is
        an all-reduce, all_gather_single an all-gather) just waits on: handing on a turn it no
        longer holds and taking it twice would leave it waiting for itself.
        """
        if self.holder != threading.get_ident():
            yield
            return
        self.give_turn()
        try:
            yield
        finally:
            self.take_turn()

    def stop(self) -> None:
        """Wake every rank still waiting: in a message (it raises) or a collective (it exits).

        torch's threaded groups keep their collectives on their class, so only while this
        world runs: a rank left over from it must not stop the next world's collectives.
        """
        from torch.testing._internal.distributed.multi_threaded_pg import ProcessLocalGroup

        with self.changing:
            self.stopped_at = min(self.stopped_at, time.monotonic())
            self.mailbox.close()
            if self.open:
                ProcessLocalGroup.exception_handle(None)

    def close(self) -> None:
        """The run is over: later calls of `stop` by its ranks touch no other world."""
        with self.changing:
            self.open = False


class _RankThread(threading.Thread):
    """One rank: waits for its turn, joins the world's process group, runs `fn`, keeps its
    result or its traceback.

    A daemon: a rank stuck in computation cannot be stopped, and must not keep the process
    alive after `run_threads` has given up on it.
    """

    def __init__(self, world: _ThreadWorld, rank: int, fn: Callable[..., Any], args: tuple):
        super().__init__(name=f"rank {rank}", daemon=True)
        self.world, self.rank, self.fn, self.args = world, rank, fn, args
        self.result: Any = None
        self.failure: str | None = None
        self.failed_at = 0.0
        self.finished = False

    def run(self) -> None:
        try:
            self.world.take_turn()
            try:
                dist.init_process_group(BACKEND, store=self.world.store, rank=self.rank,
                                        world_size=self.world.world_size,
                                        timeout=timedelta(seconds=self.world.timeout_s))
                try:
                    self.result = self.fn(self.rank, self.world.world_size, *self.args)
                finally:
                    dist.destroy_process_group()
            finally:
                self.world.give_turn()
            self.finished = True
        except SystemExit:
            pass  # woken from a collective because another rank failed: that one reports
        except BaseException:  # noqa: BLE001 - reported to the caller, with the traceback
            self.failure, self.failed_at = traceback.format_exc(), time.monotonic()
            self.world.stop()


class _Mailbox:
    """Messages in flight between the ranks' threads: per (group, sender, receiver, tag), a
    first-in first-out queue, as MPI and gloo match messages. Every wait is bounded, and a
    message wakes only the rank waiting for it (hundreds of ranks may be waiting)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.queues: dict[tuple, deque] = defaultdict(deque)
        self.arrivals: dict[tuple, threading.Condition] = {}
        self.closed = False

    def put(self, key: tuple, tensor: torch.Tensor) -> None:
        with self.lock:
            self.queues[key].append(tensor)
            self._arrival(key).notify()

    def take(self, key: tuple, timeout_s: float) -> torch.Tensor:
        """The oldest message under `key`; RuntimeError after `timeout_s` or when closed."""
        with self.lock:
            arrived = self._arrival(key).wait_for(lambda: self.queues[key] or self.closed,
                                                  timeout_s)
            if self.queues[key]:
                return self.queues[key].popleft()
        reason = "the run was stopped" if arrived else f"timed out after {timeout_s:g} s"
        raise RuntimeError(f"a simulated receive from rank {key[1]} to rank {key[2]} {reason}")

    def close(self) -> None:
        with self.lock:
            self.closed = True
            for arrival in self.arrivals.values():
                arrival.notify_all()

    def _arrival(self, key: tuple) -> threading.Condition:
        """The condition the receiver of `key` waits on (call with the lock held)."""
        if key not in self.arrivals:
            self.arrivals[key] = threading.Condition(self.lock)
        return self.arrivals[key]


def _create_group(store, rank: int, world_size: int, timeout: timedelta):
    """The backend `run_threads` registers: called by init_process_group on the rank's thread."""
    from torch.testing._internal.distributed.multi_threaded_pg import ProcessLocalGroup

    world = threading.current_thread().world

    class ThreadGroup(ProcessLocalGroup):
        """torch's threaded process group, with the point-to-point messages it lacks."""

        def send(self, tensors, dst: int, tag: int = 0):
            # A copy, as a real send takes the bytes: the sender may reuse its tensor at once.
            # Made outside any dispatch mode: it is the network's, not the sender's memory.
            with _disable_current_modes():
                message = tensors[0].detach().clone()
            world.mailbox.put((self.pg_name, self._rank, dst, tag), message)
            return _Done()

        def recv(self, tensors, src: int, tag: int = 0):
            return _Receive(world, (self.pg_name, src, self._rank, tag), tensors[0])

        def getBackendName(self):
            return BACKEND

    # torch's threaded collectives complete before they return (every rank waits inside until
    # all have come), but their requests refuse a wait with a time limit, which the course's
    # code always gives: each is called with the turn handed on, and answers a done request.
    for name in COLLECTIVES:
        setattr(ThreadGroup, name, _completed(world, getattr(ProcessLocalGroup, name)))
    return ThreadGroup(rank, world_size)


def _completed(world: _ThreadWorld, collective: Callable) -> Callable:
    """`collective` (a method of torch's threaded group) run while the other ranks take their
    turns, returning a `_Done` request."""
    def call(self, *args, **kwargs):
        with world.waiting():
            collective(self, *args, **kwargs)
        return _Done()
    return call


class _Done(dist.Work):
    """The request of a send (its message is in the mailbox) or of a threaded collective
    (complete when the call returned): done at once."""

    def wait(self, timeout: timedelta = timedelta(0)) -> bool:
        return True

    def is_completed(self) -> bool:
        return True


class _Receive(dist.Work):
    """A receive's request: `wait` takes the message from the mailbox into the tensor, letting
    the other ranks run meanwhile."""

    def __init__(self, world: _ThreadWorld, key: tuple, tensor: torch.Tensor):
        super().__init__()
        self.world, self.key, self.tensor, self.done = world, key, tensor, False

    def wait(self, timeout: timedelta = timedelta(0)) -> bool:
        if not self.done:
            seconds = timeout.total_seconds() or self.world.timeout_s  # 0: the world's bound
            with self.world.waiting():
                message = self.world.mailbox.take(self.key, seconds)
            with torch.no_grad(), _disable_current_modes():  # delivered by the network
                self.tensor.copy_(message.view_as(self.tensor))
            self.done = True
        return True

    def is_completed(self) -> bool:
        return self.done

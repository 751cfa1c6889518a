"""All-reduce through shared memory, for ranks on one machine (lesson 76).

Every other algorithm of the lesson moves bytes as messages: gloo writes them into a TCP socket
and the kernel copies them out again at the receiver, so on one machine each byte is copied twice
by the kernel, and no algorithm sends fewer bytes than the ring. Processes on one machine can
share pages instead: each rank copies its tensor into its own slot of one shared segment; after a
barrier, each rank adds up its chunk of every slot into a result slot; after a second barrier,
each copies the result out. Nothing goes through a socket, so the ledger records no bytes for it
(its barriers are one-element messages through rank 0, not counted). MPICH has shared-memory
collectives of this kind for the processes of one node. NCCL's are not built this way: its SHM
and P2P are transports, which carry the messages of its ring and tree algorithms between the
GPUs of one node. The GPU counterpart of a shared buffer is symmetric memory, in which each GPU
reads its peers' registered buffers directly (torch.ops.symm_mem.one_shot_all_reduce and
two_shot_all_reduce_), or NVLS, where the NVSwitch reduces.

It needs what a message does not: every rank on the same machine, a CPU tensor on gloo, and room
in /dev/shm (a container may have as little as 64 MiB). Rank 0 creates the segment and the others
attach to it; if any of them cannot, every rank learns it together and runs the direct all-reduce
instead, now and for that size from then on. The segment's file is deleted as soon as every rank
has mapped it, so a rank killed later leaves nothing behind.

    from lesson_code.collectives import shared_memory
    shared_memory.shared_memory_all_reduce(tensor, "sum")    # call on every rank; in place
"""

from __future__ import annotations

import math
import mmap
import os
import uuid
import weakref
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import torch
import torch.distributed as dist

from lesson_code.collectives.direct import direct_all_reduce
from lesson_code.collectives.ledger import CommLedger
from lesson_code.collectives.p2p import DEFAULT_WAIT_S, Peers
from lesson_code.collectives.ring import (check_op, contiguous_in_place, naive_all_reduce,
                                          peers_for)

SHM_DIR = Path("/dev/shm")
# The largest segment one group maps (N + 1 slots); larger tensors go direct.
LIMIT_BYTES = 1 << 30
# A segment takes at most this share of the free space of SHM_DIR.
FREE_SHARE = 0.5
SLOT_ALIGN = 64
PREFIX = "lesson_code-"  # a segment's file: lesson_code-<creator's process id>-<random>


@dataclass
class Arena:
    """One group's shared segment: N + 1 slots of `slot_bytes` each.

    Slot r holds rank r's tensor, slot N the result. Every call uses the same slots: a call's two
    barriers keep consecutive calls apart. After the second no rank reads an input slot, and the
    next call writes the result slot only after its own first barrier, which no rank passes
    before every rank has copied the last result out. (A one-shot variant, with one
    synchronization a call, would need two sets of slots to alternate between.)
    """

    mapping: mmap.mmap
    slot_bytes: int
    slots: int

    def views(self, dtype: torch.dtype, numel: int) -> list[torch.Tensor]:
        """The N + 1 slots as flat tensors of `numel` elements of `dtype`."""
        return [torch.frombuffer(self.mapping, dtype=dtype, count=numel,
                                 offset=slot * self.slot_bytes)
                for slot in range(self.slots)]


@dataclass
class ArenaCache:
    """This process's arenas by process group, and the smallest slot size each group was refused
    (every rank of the group refused alike, so none asks again for that size or more).

    Keyed weakly by the group object: an arena goes with its group (a new group maps anew), and
    no group outlives its destruction because of this cache (a group object destroyed only at
    interpreter exit aborts the process there)."""

    arenas: weakref.WeakKeyDictionary = field(default_factory=weakref.WeakKeyDictionary)
    refused: weakref.WeakKeyDictionary = field(default_factory=weakref.WeakKeyDictionary)

    def current(self, pg) -> Arena | None:
        """The arena of group `pg`, or None."""
        return self.arenas.get(pg)


@lru_cache(maxsize=1)
def arena_cache() -> ArenaCache:
    """The one ArenaCache of this process (each rank is a process of its own)."""
    return ArenaCache()


def _group_object(group):
    """The process group object itself (the default group for None): new after each init."""
    return group if group is not None else dist.group.WORLD


def has_arena(group=None) -> bool:
    """Whether this rank holds a mapped segment for `group` (its all-reduces went through it)."""
    return arena_cache().current(_group_object(group)) is not None


def _create_segment(nbytes: int) -> tuple[str, mmap.mmap] | None:
    """Rank 0: a new file of `nbytes` in SHM_DIR, its pages reserved, and its mapping; or None.

    None when there is no SHM_DIR, the size is above LIMIT_BYTES or FREE_SHARE of the free
    space, or the pages cannot be reserved: touching a page a full tmpfs cannot back would kill
    the process (SIGBUS), so `posix_fallocate` claims them all first.
    """
    if not SHM_DIR.is_dir() or nbytes > LIMIT_BYTES:
        return None
    sweep_orphans()
    path = SHM_DIR / f"{PREFIX}{os.getpid()}-{uuid.uuid4().hex[:12]}"
    try:  # a folder this user may not read or write gives an OSError: no segment, as for no room
        stats = os.statvfs(SHM_DIR)
        if nbytes > FREE_SHARE * stats.f_bavail * stats.f_frsize:
            return None
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError:
        return None
    try:
        os.posix_fallocate(descriptor, 0, nbytes)
        return str(path), mmap.mmap(descriptor, nbytes)
    except OSError:
        path.unlink(missing_ok=True)
        return None
    finally:
        os.close(descriptor)


def sweep_orphans() -> list[str]:
    """Delete the segment files whose creator is dead; their names.

    Rank 0 deletes a segment's file once every rank has mapped it, or in a `finally` when that
    failed; a rank 0 killed (SIGKILL, or the launcher stopping it) between creating the file and
    deleting it leaves the file behind, real memory in a tmpfs until reboot. Its name carries
    the creator's process id, so the next segment created on this machine removes it.
    """
    removed = []
    for path in SHM_DIR.glob(f"{PREFIX}*"):
        try:
            os.kill(int(path.name.removeprefix(PREFIX).split("-")[0]), 0)
            continue  # its creator lives (or is another user's process, whose file we leave)
        except ProcessLookupError:
            pass
        except (ValueError, PermissionError):
            continue
        path.unlink(missing_ok=True)
        removed.append(path.name)
    return removed


def attach_segment(path: str, nbytes: int) -> mmap.mmap | None:
    """Another rank: map the segment rank 0 created, or None when this machine has no such file
    (the rank runs on another machine) or it cannot be opened."""
    try:
        descriptor = os.open(path, os.O_RDWR)
    except OSError:
        return None
    try:
        return mmap.mmap(descriptor, nbytes) if os.fstat(descriptor).st_size == nbytes else None
    except OSError:  # no memory to map it: this rank says so, and every rank goes direct
        return None
    finally:
        os.close(descriptor)


def _everyone(flag: bool, peers: Peers) -> bool:
    """True on every rank when `flag` is True on every rank (a bounded wait)."""
    value = torch.tensor([1 if flag else 0], dtype=torch.int32)
    dist.all_reduce(value, op=dist.ReduceOp.MIN, group=peers.group,
                    async_op=True).wait(peers.timeout)
    return bool(value.item())


def _new_arena(slot_bytes: int, peers: Peers) -> Arena | None:
    """Collective: a segment for slots of `slot_bytes`, mapped on every rank, or None on all."""
    slots = peers.world_size + 1
    nbytes = slots * slot_bytes
    created = _create_segment(nbytes) if peers.rank == 0 else None
    box = [created[0] if created else None]
    try:  # from its creation on: a broadcast that fails (a peer gone) must not keep the file
        dist.broadcast_object_list(box, src=peers.global_rank(0), group=peers.group)
        if box[0] is None:
            return None
        mapping = created[1] if created else attach_segment(box[0], nbytes)
        mapped_everywhere = _everyone(mapping is not None, peers)
    finally:  # every rank has it mapped, gave up, or failed: the file must not outlive this call
        if created:
            Path(created[0]).unlink(missing_ok=True)
    if not mapped_everywhere:
        return None
    return Arena(mapping=mapping, slot_bytes=slot_bytes, slots=slots)


def arena_for(nbytes: int, peers: Peers) -> Arena | None:
    """This group's arena with slots of at least `nbytes`, or None where shared memory is not
    usable. Collective the first time a group needs a larger one; every rank returns alike."""
    pg, cache = _group_object(peers.group), arena_cache()
    arena = cache.current(pg)
    if arena is not None and arena.slot_bytes >= nbytes:
        return arena
    if nbytes >= cache.refused.get(pg, math.inf):
        return None
    wanted = max(nbytes, 2 * arena.slot_bytes if arena else 1 << 20)
    wanted = -(-wanted // SLOT_ALIGN) * SLOT_ALIGN
    new = _new_arena(wanted, peers)
    if new is None:
        cache.refused[pg] = min(nbytes, cache.refused.get(pg, math.inf))
        return None
    cache.arenas[pg] = new
    return new


def usable(tensor: torch.Tensor, group=None) -> bool:
    """Whether `tensor` may go through shared memory at all: a CPU tensor on gloo. The same on
    every rank, with no message. Whether this machine has SHM_DIR is not asked here: ranks on
    two machines could answer differently and take different paths; `arena_for` asks every
    rank and agrees (no SHM_DIR on any rank: every rank runs the direct all-reduce)."""
    return tensor.device.type == "cpu" and dist.get_backend(group) == "gloo"


def _barrier(peers: Peers) -> None:
    """Wait until every rank of the group gets here, each wait bounded by the call's timeout.

    A one-element all-reduce through rank 0 (`naive_all_reduce`, not counted in any ledger):
    every other rank sends one message and waits for one, the fewest wake-ups in a row, which
    on a machine with fewer cores than ranks costs less than gloo's own barrier.
    """
    naive_all_reduce(torch.zeros(1, dtype=torch.int32), group=peers.group,
                     timeout_s=peers.timeout.total_seconds())


def _reduce_through(arena: Arena, flat: torch.Tensor, op: str, peers: Peers) -> None:
    """Copy `flat` in, reduce this rank's chunk of every slot into the result, copy it out."""
    slots = arena.views(flat.dtype, flat.numel())
    slots[peers.rank].copy_(flat)
    _barrier(peers)  # every rank's tensor is in its slot
    chunks = [torch.tensor_split(slot, peers.world_size)[peers.rank] for slot in slots]
    result = chunks[-1]
    torch.add(chunks[0], chunks[1], out=result)
    for chunk in chunks[2:-1]:  # ranks in order: the same sum on every call
        result.add_(chunk)
    if op == "avg":
        result.div_(peers.world_size)
    _barrier(peers)  # every chunk of the result is written
    flat.copy_(slots[-1])


def shared_memory_all_reduce(tensor: torch.Tensor, op: str = "sum", *, group=None,
                             ledger: CommLedger | None = None,
                             timeout_s: float = DEFAULT_WAIT_S) -> torch.Tensor:
    """Reduce `tensor` over all ranks in place through a shared segment; return it.

    Collective: call on every rank with tensors of the same shape and dtype. Each chunk is
    reduced once, by its owner, so every rank ends with bitwise the same result. Where shared
    memory is not usable (see the module's docstring), or on one rank, or for an empty tensor,
    it runs `direct_all_reduce`, on every rank alike. Raises ValueError for an unknown op, or
    op="avg" on an integer tensor.
    """
    check_op(op, tensor)
    nbytes = tensor.numel() * tensor.element_size()
    peers = peers_for("all_reduce", group, ledger, timeout_s)
    if peers.world_size > 1 and nbytes and usable(tensor, group):
        arena = arena_for(nbytes, peers)
        if arena is not None:
            with contiguous_in_place(tensor) as work:
                _reduce_through(arena, work.view(-1), op, peers)
            peers.counter.commit()  # no bytes sent: the ledger shows the call, with none
            return tensor
    return direct_all_reduce(tensor, op, group=group, ledger=ledger, timeout_s=timeout_s)


"""What a rank really allocates: every allocation and free over a block of code (lesson 78).

Formulas count parameters, gradients and optimizer state; a real training step also allocates
activations, communication buffers and copies. `AllocationTrace` runs torch's profiler with
`profile_memory=True` over a block: torch's allocator then reports every allocation and every
free (address, bytes, time), and `torch.profiler.record_function` marks named ranges of time.
From these the trace gives the bytes live at any moment since the block began, the peak, and,
for any moment, which marked range allocated the bytes live then.

Counted: storage that torch's allocator hands out for tensors on one device, on the thread that
entered the block and on autograd's threads (the profiler follows backward there), including a
kernel's scratch: storage an operation allocates and frees before it returns (oneDNN's bfloat16
matrix products on a CPU with AVX-512 take some; other CPUs' kernels take none), which
`peak(..., scratch=False)` leaves out. Not counted:
memory outside torch's allocator (gloo's own buffers, Python objects; on a GPU the allocator's
cache, since these are allocated bytes, not reserved ones), threads the profiler does not follow
(a ThreadPoolExecutor's, where lesson 77's bucketed DDP reduces), and whatever was allocated
before the block began: start it before building the model.

    with AllocationTrace(device) as trace:
        model, optimizer = build()
        with torch.profiler.record_function("step"):
            ...
    step = trace.ranges_named("step")[0]
    trace.peak(step.start_ns, step.end_ns)     # (bytes, when) of the highest point in the step
    trace.live_by_range(when)                  # {range name: bytes it allocated, live then}
"""

from __future__ import annotations

import bisect
import itertools
import os
from dataclasses import dataclass

import torch
from torch._C._profiler import _EventType, RecordScope

BEFORE = "(before)"  # live_by_range's name for bytes allocated outside every range, or earlier


@dataclass(frozen=True)
class Allocation:
    """One block of storage: its size, when it was allocated and freed (profiler clock, ns;
    `freed_ns` is None when it was still live at the end of the trace)."""

    nbytes: int
    allocated_ns: int
    freed_ns: int | None
    scratch: bool = False  # freed before the operation that allocated it returned


@dataclass(frozen=True)
class Range:
    """A range of time marked with `torch.profiler.record_function(name)`."""

    name: str
    start_ns: int
    end_ns: int

    def contains(self, time_ns: int) -> bool:
        return self.start_ns <= time_ns <= self.end_ns


class AllocationTrace:
    """Records the allocations of tensors on `device` while its `with` block runs.

    After the block: `allocations`, `ranges`, and the queries below. Raises RuntimeError when
    entered while another profiler runs in this thread (torch allows one at a time).
    """

    def __init__(self, device: torch.device | str = "cpu"):
        self.device = torch.device(device)
        self.allocations: list[Allocation] = []
        self.ranges: list[Range] = []
        # {scratch counted: (when the live total changed, in order; the total right after)}
        self._series: dict[bool, tuple[list[int], list[int]]] = {True: ([], []), False: ([], [])}
        self._profiler: torch.profiler.profile | None = None

    def __enter__(self) -> "AllocationTrace":
        if torch.autograd._profiler_enabled():
            raise RuntimeError("another torch profiler is running in this thread: an "
                               "AllocationTrace needs its own, so end the other one first")
        # Kineto, the profiler's engine, prints "USDT: ... profiler_start" (and _stop) on stderr,
        # into every rank's output, unless its log level, read when a process first profiles,
        # is above 5. A level the reader set is left alone.
        os.environ.setdefault("KINETO_LOG_LEVEL", "6")
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self._profiler = torch.profiler.profile(activities=activities, profile_memory=True)
        self._profiler.__enter__()
        return self

    def __exit__(self, *exc_info) -> None:
        self._profiler.__exit__(*exc_info)
        if exc_info[0] is None:
            self._read(self._profiler.profiler.kineto_results.experimental_event_tree())
        self._profiler = None

    def live_at(self, time_ns: int, scratch: bool = True) -> int:
        """Bytes allocated in the trace and not yet freed at `time_ns` (its changes included);
        without kernels' scratch when `scratch` is False."""
        times, totals = self._series[scratch]
        index = bisect.bisect_right(times, time_ns)
        return totals[index - 1] if index else 0

    def peak(self, start_ns: int | None = None, end_ns: int | None = None,
             scratch: bool = True) -> tuple[int, int]:
        """(most bytes live at once, the first time it was reached) between the two times
        (default: the whole trace); without kernels' scratch when `scratch` is False."""
        times, totals = self._series[scratch]
        start_ns = times[0] if start_ns is None else start_ns
        end_ns = times[-1] if end_ns is None else end_ns
        best = (self.live_at(start_ns, scratch), start_ns)
        first = bisect.bisect_right(times, start_ns)
        last = bisect.bisect_right(times, end_ns)
        for time_ns, total in zip(times[first:last], totals[first:last]):
            if total > best[0]:
                best = (total, time_ns)
        return best

    def ranges_named(self, prefix: str) -> list[Range]:
        """The marked ranges whose name starts with `prefix`, in order of their start."""
        return [r for r in self.ranges if r.name.startswith(prefix)]

    def series(self, start_ns: int, end_ns: int) -> list[tuple[int, int]]:
        """(time, bytes live) at `start_ns` and at every change up to `end_ns`."""
        times, totals = self._series[True]
        first = bisect.bisect_right(times, start_ns)
        last = bisect.bisect_right(times, end_ns)
        return [(start_ns, self.live_at(start_ns)), *zip(times[first:last], totals[first:last])]

    def live_by_range(self, time_ns: int, since_ns: int | None = None) -> dict[str, int]:
        """Bytes live at `time_ns`, by the innermost marked range that allocated them (the
        shortest one containing the allocation's time); under BEFORE those allocated outside
        every range, or before `since_ns` when given."""
        by_range: dict[str, int] = {}
        for block in self.allocations:
            if block.allocated_ns <= time_ns and (block.freed_ns is None
                                                  or block.freed_ns > time_ns):
                early = since_ns is not None and block.allocated_ns < since_ns
                name = BEFORE if early else self.range_at(block.allocated_ns)
                by_range[name] = by_range.get(name, 0) + block.nbytes
        return by_range

    def range_at(self, time_ns: int) -> str:
        """The name of the innermost marked range containing `time_ns` (BEFORE if none)."""
        inside = [r for r in self.ranges if r.contains(time_ns)]
        return min(inside, key=lambda r: r.end_ns - r.start_ns).name if inside else BEFORE

    def _read(self, roots) -> None:
        """Collect this device's allocations (paired with their frees by address, each marked
        as scratch when freed before the end of the innermost operation that allocated it) and
        the user-marked ranges from the profiler's event tree."""
        events, stack = [], list(roots)
        while stack:
            node = stack.pop()
            stack.extend(node.children)
            if node.tag == _EventType.Allocation and self._on_device(node.extra_fields.device):
                events.append((node.start_time_ns, node.extra_fields.ptr,
                               node.extra_fields.alloc_size, _operation_end(node)))
            elif (node.tag == _EventType.TorchOp
                  and node.extra_fields.scope == RecordScope.USER_SCOPE):
                self.ranges.append(Range(node.name, node.start_time_ns, node.end_time_ns))
        self.ranges.sort(key=lambda r: r.start_ns)
        events.sort(key=lambda event: event[0])
        # address -> (bytes, allocated at, end of the operation that allocated it)
        open_blocks: dict[int, tuple[int, int, int | None]] = {}
        closed = []
        for time_ns, address, nbytes, operation_end in events:
            if nbytes > 0:
                open_blocks[address] = (nbytes, time_ns, operation_end)
            elif address in open_blocks:  # frees of blocks allocated before the trace: unknown
                size, allocated, operation_end = open_blocks.pop(address)
                closed.append(Allocation(size, allocated, time_ns, scratch=operation_end
                                         is not None and time_ns <= operation_end))
        self.allocations = sorted(closed + [Allocation(size, allocated, None)
                                            for size, allocated, _ in open_blocks.values()],
                                  key=lambda block: block.allocated_ns)
        for scratch in (True, False):
            blocks = [b for b in self.allocations if scratch or not b.scratch]
            changes = sorted([(b.allocated_ns, b.nbytes) for b in blocks] +
                             [(b.freed_ns, -b.nbytes) for b in blocks if b.freed_ns])
            self._series[scratch] = ([time_ns for time_ns, _ in changes],
                                     list(itertools.accumulate(change for _, change in changes)))

    def _on_device(self, device: torch.device) -> bool:
        return device.type == self.device.type and (
            self.device.index is None or device.index in (None, -1, self.device.index))


def _operation_end(node) -> int | None:
    """When the innermost operator (an aten op, not a user-marked range nor autograd's node)
    around the profiler event `node` ended; None outside every operator."""
    parent = node.parent
    while parent is not None:
        if parent.tag == _EventType.TorchOp and parent.extra_fields.scope == RecordScope.FUNCTION:
            return parent.end_time_ns
        parent = parent.parent
    return None

"""What a rank holds, read from its tensors' storage (lesson 78's scale lab).

`StorageTracker` watches every operation run under it and follows each storage an operation
creates until it is freed, so it knows the bytes live at any moment and their peak, whether
the tensors are real or on the meta device (shapes and bytes, no memory). `held_bytes` sums
the storages of named groups of tensors, each storage once.

    with StorageTracker() as tracker:
        model = MiniGPT(config)                    # followed from its first tensor
        tracker.reset_peak()
        loss = model(x, y)[1]; loss.backward()
    tracker.peak, tracker.live_bytes()

A meta tensor has no values, so reading one as a Python number (`.item()`, `.tolist()`) has
no answer: under the tracker such a read returns 0 and is counted in `scalar_reads`, so that
code which checks a flag (lesson 77's DDP asks whether any rank missed a gradient) runs on,
and the report can say how many answers were made up.

The tracker also says where its peak fell: `phase` names the part of the work running now (the
caller sets it: "building", "forward", "backward", "optimizer"); at each new peak it records
that phase (`peak_in`), the course's functions on the call stack (`peak_at`, outermost first)
and the bytes live by the phase that made their storage (`peak_by_phase`).

Counted: every storage behind a tensor that an operation dispatched through torch returns, on
the thread that entered the tracker (autograd's backward runs there on the CPU), from the first
such operation on. That includes a storage made before the tracker when an operation returns a
view of it: MiniGPT's loss reshapes the batch's targets, so their storage is followed from the
forward on, as made there. Not counted: a storage no operation under the tracker returns (the
batch's token ids), what a kernel allocates inside itself and frees before it returns, Python
objects, a backend's own buffers, and work on other threads (lesson 77's bucketed DDP reduces
its buckets on a thread of its own, whose two ring buffers of 1/N of a bucket each are not
seen; they are freed before the optimizer runs, where DDP's step peaks).
"""

from __future__ import annotations

import sys
import weakref
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator
from unittest import mock

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack

SCALAR_READ = torch.ops.aten._local_scalar_dense.default  # what .item() and .tolist() run
PACKAGE = str(Path(__file__).resolve().parents[1])  # lesson_code/
HERE = str(Path(__file__).resolve().parent)  # scale_lab/: the instrument, not what it measures


class StorageTracker(TorchDispatchMode):
    """Follows the storage of every tensor the operations under it return, a view's too: the
    bytes live now, and the peak, taken whenever an operation creates a storage (a storage
    resized outside an operation, as ZeRO-3 refills a unit, counts from the next one). At each
    new peak it records the caller's `phase` (`peak_in`), the course's functions running
    (`peak_at`) and the bytes live by the phase that created them (`peak_by_phase`).
    """

    def __init__(self, phase: str = "building"):
        super().__init__()
        self.storages: dict[int, weakref.ref] = {}
        self.born: dict[int, str] = {}  # storage -> the phase that created it
        self.phase = phase
        self.peak = 0
        self.peak_in, self.peak_at, self.peak_by_phase = phase, "", {}
        self.scalar_reads = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is SCALAR_READ and args[0].is_meta:
            self.scalar_reads += 1
            return _zero_of(args[0].dtype)
        out = func(*args, **(kwargs or {}))
        if any([self.follow(t) for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]):
            self.take_peak()
        return out

    def take_peak(self) -> None:
        """Make the bytes live now the peak, if they are the most so far."""
        by_phase = self.live_by_phase()
        if sum(by_phase.values()) > self.peak:
            self.peak, self.peak_by_phase = sum(by_phase.values()), by_phase
            self.peak_in, self.peak_at = self.phase, course_callers()

    def follow(self, tensor: torch.Tensor) -> bool:
        """Follow `tensor`'s storage from now on; True if it was not followed yet."""
        storage = tensor.untyped_storage()
        key = id(storage)
        if key in self.storages:
            return False
        # torch keeps a storage's Python object alive as long as the storage itself, so this
        # reference dies exactly when the storage is freed, and then forgets itself.
        self.storages[key] = weakref.ref(storage, lambda _, key=key: self.forget(key))
        self.born[key] = self.phase
        return True

    def forget(self, key: int) -> None:
        """Stop following a storage torch has freed."""
        self.storages.pop(key, None)
        self.born.pop(key, None)

    def live_bytes(self) -> int:
        """Bytes of every followed storage still alive, at its current size."""
        return sum(storage.nbytes() for ref in list(self.storages.values())
                   if (storage := ref()) is not None)

    def live_by_phase(self) -> dict[str, int]:
        """Bytes of every followed storage still alive, by the phase that created it."""
        by_phase: dict[str, int] = {}
        for key, ref in list(self.storages.items()):
            if (storage := ref()) is not None:
                by_phase[self.born[key]] = by_phase.get(self.born[key], 0) + storage.nbytes()
        return by_phase

    def reset_peak(self, phase: str | None = None) -> int:
        """Start a new peak from the bytes live now (in `phase` from now on, if given); return
        them."""
        self.phase = phase or self.phase
        self.peak_by_phase = self.live_by_phase()
        self.peak = sum(self.peak_by_phase.values())
        self.peak_in, self.peak_at = self.phase, ""
        return self.peak


@contextmanager
def peaks_on_resize() -> Iterator[dict[str, int]]:
    """Meanwhile every StorageTracker on this thread also takes its peak right after each
    `torch.UntypedStorage.resize_`, as torch's MemTracker does (lesson 78b's exercise 5).
    Yields {"resizes": how many resize_ calls it saw}."""
    original = torch.UntypedStorage.resize_
    seen = {"resizes": 0}

    def resize_(storage, size):
        result = original(storage, size)
        seen["resizes"] += 1
        for mode in _get_current_dispatch_mode_stack():
            if isinstance(mode, StorageTracker):
                mode.take_peak()
        return result

    with mock.patch.object(torch.UntypedStorage, "resize_", resize_):
        yield seen


def course_callers() -> str:
    """The course's functions on the call stack now, outermost first, as "module.function"
    joined by " > " (the tracker's own module and the scale lab's left out): where in the
    course's code an operation runs."""
    names, frame = [], sys._getframe(1)
    while frame is not None:
        path = frame.f_code.co_filename
        if path.startswith(PACKAGE) and not path.startswith(HERE):
            names.append(f"{Path(path).stem}.{frame.f_code.co_qualname}")
        frame = frame.f_back
    return " > ".join(reversed(names))


def _zero_of(dtype: torch.dtype):
    """0 as the Python number a tensor of `dtype` reads as."""
    if dtype == torch.bool:
        return False
    return 0.0 if dtype.is_floating_point or dtype.is_complex else 0


def held_bytes(groups: dict[str, list[torch.Tensor | None]]) -> dict[str, int]:
    """Bytes of each named group of tensors (None entries skipped), each storage counted once,
    in the first group that holds it: a view counts nothing beyond the tensor it views."""
    seen, held = set(), {}
    for name, tensors in groups.items():
        held[name] = 0
        for tensor in tensors:
            if tensor is None:
                continue
            storage = tensor.untyped_storage()
            if id(storage) not in seen:
                seen.add(id(storage))
                held[name] += storage.nbytes()
    return held

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

Counted: storages that operations dispatched through torch create, on the thread that entered
the tracker (autograd's backward runs there on the CPU). Not counted: what a kernel allocates
inside itself and frees before it returns, Python objects, a backend's own buffers, and work
on other threads (lesson 77's bucketed DDP reduces its buckets on a thread of its own, whose
ring buffers of 2/N of a bucket each are not seen).
"""

from __future__ import annotations

import weakref

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

SCALAR_READ = torch.ops.aten._local_scalar_dense.default  # what .item() and .tolist() run


class StorageTracker(TorchDispatchMode):
    """Follows every storage the operations under it create: bytes live now, and the peak.

    The peak is taken whenever an operation creates a storage (memory only grows then; a
    storage resized up outside an operation, as ZeRO-3 refills a freed unit, is counted at the
    next one, which for ZeRO-3 is the gather's own output).
    """

    def __init__(self):
        super().__init__()
        self.storages: dict[int, weakref.ref] = {}
        self.peak = 0
        self.scalar_reads = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is SCALAR_READ and args[0].is_meta:
            self.scalar_reads += 1
            return _zero_of(args[0].dtype)
        out = func(*args, **(kwargs or {}))
        if any([self.follow(t) for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]):
            self.peak = max(self.peak, self.live_bytes())
        return out

    def follow(self, tensor: torch.Tensor) -> bool:
        """Follow `tensor`'s storage from now on; True if it was not followed yet."""
        storage = tensor.untyped_storage()
        key = id(storage)
        if key in self.storages:
            return False
        # torch keeps a storage's Python object alive as long as the storage itself, so this
        # reference dies exactly when the storage is freed, and then forgets itself.
        self.storages[key] = weakref.ref(storage, lambda _, key=key: self.storages.pop(key, None))
        return True

    def live_bytes(self) -> int:
        """Bytes of every followed storage still alive, at its current size."""
        return sum(storage.nbytes() for ref in list(self.storages.values())
                   if (storage := ref()) is not None)

    def reset_peak(self) -> int:
        """Start a new peak from the bytes live now; return them."""
        self.peak = self.live_bytes()
        return self.peak


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

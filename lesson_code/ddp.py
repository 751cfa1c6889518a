"""Data parallelism from scratch (lesson 77): same parameters everywhere, averaged gradients.

Every rank holds a full copy of the model and a different slice of the batch. Two wrappers sit side
by side, as in picotron: `NaiveDDP` all-reduces each parameter's gradient after backward;
`BucketedDDP` packs gradients into buckets and starts each bucket's all-reduce during backward, as
soon as its last gradient is ready, so that communication hides behind the rest of backward.
Both start from `broadcast_parameters` and honour `no_sync()` for gradient accumulation.

    model = BucketedDDP(MiniGPT(), bucket_cap_mb=1.0)   # inside a rank: lesson_code.launch.spawn
    loss = model(x, y)[1]; loss.backward()              # gradients arrive averaged
    optimizer.step()

Run the lesson's checks: `python -m lesson_code.ddp_lab` (4 ranks) or under torchrun.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator

import torch
import torch.distributed as dist
from torch import nn

from lesson_code.collectives.comm import Communicator, PendingReduce
from lesson_code.collectives.ledger import CommLedger
from lesson_code.harness.validate import require_positive


def broadcast_parameters(module: nn.Module, src: int = 0, comm: Communicator | None = None) -> None:
    """Copy rank `src`'s parameters and buffers into `module` on every rank.

    Collective: call on every rank of `comm`'s group (default: a ring communicator over all
    ranks). Tensors are packed into one flat buffer per dtype, so the broadcast costs one message
    per tree edge rather than one per tensor. `src` is a rank of that group.
    Raises ValueError (on every rank) when ranks hold parameters of different names or shapes.
    """
    comm = comm or Communicator("ring")
    _check_same_layout(module, comm)
    tensors = [p.data for p in module.parameters()] + list(module.buffers())
    for dtype in sorted({t.dtype for t in tensors}, key=str):
        group = [t for t in tensors if t.dtype == dtype]
        flat = torch.cat([t.reshape(-1) for t in group])
        comm.broadcast(flat, src)
        for tensor, value in zip(group, torch.split(flat, [t.numel() for t in group])):
            tensor.copy_(value.view_as(tensor))


def _check_same_layout(module: nn.Module, comm: Communicator) -> None:
    """Raise ValueError unless every rank of `comm`'s group has the same parameter names,
    shapes and dtypes (a one-object all-gather, so every rank raises the same error)."""
    layout = [(name, tuple(p.shape), str(p.dtype)) for name, p in module.named_parameters()]
    layouts: list = [None] * comm.world_size
    dist.all_gather_object(layouts, layout, group=comm.group)
    for rank, other in enumerate(layouts):
        if other != layouts[0]:
            first = next((a, b) for a, b in zip(layouts[0] + [None], other + [None]) if a != b)
            raise ValueError(
                f"rank {rank} holds different parameters from rank 0: {first[1]} vs {first[0]}. "
                "Build the same model on every rank (same class and config) before wrapping it.")


class _DataParallel(nn.Module):
    """What both wrappers share: validation, the initial broadcast, forward, no_sync."""

    def __init__(self, module: nn.Module, comm: Communicator | str = "ring",
                 ledger: CommLedger | None = None):
        super().__init__()
        self.module = module
        self.params = [p for p in module.parameters() if p.requires_grad]
        if not self.params:
            raise ValueError(
                f"{type(module).__name__} has no trainable parameters: data parallelism averages "
                "gradients, so wrap a module with at least one parameter that requires grad")
        self.comm = comm if isinstance(comm, Communicator) else Communicator(comm, ledger)
        self._no_sync, self._sync_this_backward, self._backward_started = False, True, False
        self.first_gradient_at = 0.0
        # Of the last synchronised backward: seconds the all-reduce calls lasted in all (each
        # from its start to its end, so waits inside it for slower ranks count), seconds the
        # training loop waited for them after backward (the part not hidden behind computation),
        # and seconds of the rest of the end of backward (the ranks' check that no gradient is
        # missing, and BucketedDDP's copy of the buckets back into .grad).
        self.stats = {"comm_s": 0.0, "wait_s": 0.0, "finish_s": 0.0}
        self.checks = 0  # one-element all-reduces made by _agree_on_missing (one per sync)
        # The number _agree_on_missing all-reduces, made once and kept: gloo's worker thread
        # holds the tensor it reduced for a moment after the wait returns, so a tensor made
        # afresh at each backward would outlive the step for a time that varies from run to run.
        self._missing_flag = torch.zeros(1, device=self.params[0].device)
        broadcast_parameters(module, comm=self.comm)
        for param in self.params:
            param.register_post_accumulate_grad_hook(self._on_gradient_ready)

    def forward(self, *args, **kwargs):
        # Like torch DDP, the decision to synchronise is taken at forward time: a backward whose
        # forward ran inside no_sync() does not synchronise, whatever the flag is by then.
        self._sync_this_backward = not self._no_sync
        # A backward that raised (or a notebook cell interrupted) after its first gradient hook
        # never reached _finish_backward: clear what it left, or this step would not synchronise.
        if self._backward_started:
            self._backward_started = False
            self._discard_unfinished()
        return self.module(*args, **kwargs)

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """Skip gradient synchronisation for forward/backward passes run inside this block.

        Gradients accumulate locally; the first backward outside the block averages the sum.
        """
        previous, self._no_sync = self._no_sync, True
        try:
            yield
        finally:
            self._no_sync = previous

    def _on_gradient_ready(self, param: torch.Tensor) -> None:
        if not self._sync_this_backward:
            return
        if not self._backward_started:
            self._backward_started = True
            self.first_gradient_at = time.perf_counter()
            self.stats = {"comm_s": 0.0, "wait_s": 0.0, "finish_s": 0.0}
            # Runs once autograd has finished this backward (torch DDP queues such a callback too).
            torch.autograd.Variable._execution_engine.queue_callback(self._finish_backward)
        self._gradient_ready(param)

    def _gradient_ready(self, param: torch.Tensor) -> None:
        raise NotImplementedError

    def _finish_backward(self) -> None:
        self._backward_started = False
        self._synchronise()

    def _synchronise(self) -> None:
        raise NotImplementedError

    def _discard_unfinished(self) -> None:
        """Forget the state of a backward pass that did not finish."""

    def _agree_on_missing(self, missing: list[torch.Tensor]) -> None:
        """Raise the same RuntimeError on every rank if any rank's backward left out parameters.

        Collective: call on every rank, after every reduction of this backward has finished (so
        no message is left in flight). It costs every synchronised backward one more all-reduce,
        of one number, through torch.distributed rather than the communicator (so the ledger
        does not count it; `self.checks` does), and a `.item()`, which on a GPU makes the CPU
        wait for the queued work. That buys agreement: a rank that missed a gradient would
        otherwise raise alone while its peers went on to the next step's collectives and
        waited there for it until their timeout. (torch DDP checks locally, at the next forward.)
        """
        self.checks += 1
        flag = self._missing_flag.fill_(float(len(missing)))
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.comm.group)
        if flag.item() == 0:
            return
        names = {id(p): name for name, p in self.module.named_parameters()}
        gathered: list = [None] * self.comm.world_size
        dist.all_gather_object(gathered, [names.get(id(p), "?") for p in missing],
                               group=self.comm.group)
        raise RuntimeError(_no_gradient_message(gathered))


class NaiveDDP(_DataParallel):
    """After backward, all-reduce (average) each parameter's gradient, one call per parameter."""

    def _gradient_ready(self, param: torch.Tensor) -> None:
        pass  # nothing to do until the whole backward pass is over

    def _synchronise(self) -> None:
        start = time.perf_counter()
        self._agree_on_missing([p for p in self.params if p.grad is None])
        checked = time.perf_counter()
        for param in self.params:
            self.comm.all_reduce(param.grad, op="avg")
        self.stats["finish_s"] = checked - start
        self.stats["comm_s"] = self.stats["wait_s"] = time.perf_counter() - checked


class Bucket:
    """A flat gradient buffer for consecutive parameters, reduced by one all-reduce. `views[i]`
    is `params[i]`'s slice of `flat`; `missing`, the ids of gradients not yet delivered."""

    def __init__(self, params: list[torch.Tensor]):
        self.params = params
        self.flat = torch.zeros(sum(p.numel() for p in params), dtype=params[0].dtype,
                                device=params[0].device)
        self.views = torch.split(self.flat, [p.numel() for p in params])
        self.missing: set[int] = set()
        self.pending: PendingReduce | None = None
        self.ready_at = 0.0
        self.gradients_before = 0  # gradients of the backward delivered when it started

    def reset(self) -> None:
        """Wait for every gradient again (the start of a backward pass)."""
        self.missing = {id(p) for p in self.params}
        self.pending = None


class BucketedDDP(_DataParallel):
    """Gradients packed into buckets; each bucket's all-reduce starts as soon as it is full.

    Buckets take parameters in reverse registration order (roughly the order backward produces
    gradients), up to `bucket_cap_mb` MiB each, one dtype per bucket. Buckets are started in
    bucket order on every rank, so that all ranks issue the same collectives in the same order.
    With `rebuild_buckets=True` the buckets are cut again, once, at the forward after the first
    synchronised backward, in the order its gradients arrived on rank 0 (`rebuild_buckets()`).
    Raises ValueError for a bucket size of zero or less.
    """

    def __init__(self, module: nn.Module, bucket_cap_mb: float = 25.0,
                 comm: Communicator | str = "ring", ledger: CommLedger | None = None,
                 rebuild_buckets: bool = False):
        require_positive("bucket_cap_mb", bucket_cap_mb,
                         "25 (torch DDP's default) or 1 for small models")
        super().__init__(module, comm, ledger)
        self.bucket_cap_bytes = int(bucket_cap_mb * 2 ** 20)
        # With rebuild_buckets, the first synchronised backward's order of arrival (indices
        # into self.params) becomes the buckets' order at the next forward, as in torch DDP.
        self._rebuild_pending = rebuild_buckets
        self._arrived: list[int] = []
        self._index_of = {id(p): i for i, p in enumerate(self.params)}
        self._set_buckets(list(reversed(self.params)))
        # Of the last synchronised backward, per bucket: bytes, when it was ready, started and
        # finished reducing (perf_counter seconds; start/end need comm.record_events), and how
        # many gradients had arrived when it started (all of them: it started after the last).
        self.timeline: list[dict] = []

    def _set_buckets(self, ordered: list[torch.Tensor]) -> None:
        self.buckets = make_buckets(ordered, self.bucket_cap_bytes)
        self._slot_of = {id(p): (b, i) for b in self.buckets for i, p in enumerate(b.params)}
        self._reset_buckets()

    def forward(self, *args, **kwargs):
        if self._rebuild_pending and self._arrived and not self._backward_started:
            self.rebuild_buckets()
        return super().forward(*args, **kwargs)

    def rebuild_buckets(self) -> None:
        """Cut the buckets again in the order the last synchronised backward's gradients arrived
        on the group's rank 0. Collective: every rank, between steps.

        Every rank must cut the same buckets, or the ranks would all-reduce buffers of different
        layouts together: so rank 0's order is broadcast (torch DDP's reducer does the same).
        Parameters that got no gradient go last, in reverse registration order.
        """
        arrived = list(dict.fromkeys(self._arrived))
        seen = set(arrived)
        rest = [i for i in reversed(range(len(self.params))) if i not in seen]
        order = torch.tensor(arrived + rest, dtype=torch.int64, device=self.params[0].device)
        self.comm.broadcast(order, 0)
        self._rebuild_pending = False
        self._set_buckets([self.params[i] for i in order.tolist()])

    def _gradient_ready(self, param: torch.Tensor) -> None:
        self._arrived.append(self._index_of[id(param)])
        bucket, index = self._slot_of[id(param)]
        bucket.views[index].copy_(param.grad.view(-1))
        bucket.missing.discard(id(param))
        while self._next_to_start < len(self.buckets) and not self.buckets[self._next_to_start].missing:
            ready = self.buckets[self._next_to_start]
            ready.ready_at = time.perf_counter()
            ready.gradients_before = len(self._arrived)
            ready.pending = self.comm.all_reduce_async(ready.flat, op="avg")
            self._next_to_start += 1

    def _synchronise(self) -> None:
        unfinished = [p for b in self.buckets for p in b.params if id(p) in b.missing]
        # Start the buckets a missing gradient held back (zeros in its place), so that every
        # rank runs the same reductions whatever happened here; then the ranks agree.
        for bucket in self.buckets[self._next_to_start:]:
            for param, view in zip(bucket.params, bucket.views):
                if id(param) in bucket.missing:
                    view.zero_()
            bucket.pending = self.comm.all_reduce_async(bucket.flat, op="avg")
        start = time.perf_counter()
        try:
            for bucket in self.buckets:
                bucket.pending.wait(self.comm.timeout_s)
            waited = time.perf_counter()
            self._agree_on_missing(unfinished)
        except BaseException:
            self._reset_buckets()
            raise
        for bucket in self.buckets:
            for param, view in zip(bucket.params, bucket.views):
                param.grad.copy_(view.view_as(param))
        self.stats["wait_s"] = waited - start
        self.stats["finish_s"] = time.perf_counter() - waited
        self._record_timeline()
        self._reset_buckets()

    def _record_timeline(self) -> None:
        """Pair each bucket with its reduction's measured start and end (ring communicator)."""
        events = self.comm.events[-len(self.buckets):] if self.comm.record_events else []
        if len(events) == len(self.buckets):
            self.comm.events.clear()
        else:
            events = [(None, 0, float("nan"), float("nan"))] * len(self.buckets)
        self.timeline = [
            {"bucket": index, "bytes": bucket.flat.numel() * bucket.flat.element_size(),
             "ready": bucket.ready_at, "start": start, "end": end,
             "gradients before": bucket.gradients_before}
            for index, (bucket, (_, _, start, end)) in enumerate(zip(self.buckets, events))
        ]
        self.stats["comm_s"] = sum(row["end"] - row["start"] for row in self.timeline)

    def _discard_unfinished(self) -> None:
        """Wait out the reductions a failed backward started (every rank started the same ones
        if every rank failed alike; if not, the wait times out and the communicator says so)."""
        try:
            for bucket in self.buckets:
                if bucket.pending is not None:
                    bucket.pending.wait(self.comm.timeout_s)
        finally:
            self._reset_buckets()

    def _reset_buckets(self) -> None:
        self._next_to_start = 0
        if not self._rebuild_pending:
            self._arrived = []
        for bucket in self.buckets:
            bucket.reset()


def make_buckets(params: list[torch.Tensor], cap_bytes: int) -> list[Bucket]:
    """Group consecutive parameters of one dtype into buckets of at most `cap_bytes` each.

    A parameter larger than the cap gets a bucket of its own; every parameter lands in exactly
    one bucket, in the order given (BucketedDDP passes them in reverse registration order).
    """
    groups = bucket_groups([p.numel() * p.element_size() for p in params], cap_bytes,
                           [p.dtype for p in params])
    return [Bucket([params[index] for index in group]) for group in groups]


def bucket_groups(sizes: list[int], cap_bytes: int, kinds: list | None = None) -> list[list[int]]:
    """The indices of `sizes` (bytes, in order) each bucket takes: consecutive, at most
    `cap_bytes` together unless one alone is larger, and of one kind (dtype) each.
    Lesson 77's explorer cuts its buckets the same way (book/static/explorer-77.js)."""
    kinds = kinds or [None] * len(sizes)
    groups, current, size = [], [], 0
    for index, nbytes in enumerate(sizes):
        if current and (size + nbytes > cap_bytes or kinds[index] != kinds[current[0]]):
            groups.append(current)
            current, size = [], 0
        current.append(index)
        size += nbytes
    if current:
        groups.append(current)
    return groups


def _no_gradient_message(names_by_rank: list[list[str]]) -> str:
    """The error every rank raises: which parameters got no gradient on which rank, and the fix."""
    listed = "; ".join(f"rank {rank}: {', '.join(names[:5])}"
                       for rank, names in enumerate(names_by_rank) if names)
    return (f"parameters received no gradient in this backward pass ({listed}), so no rank "
            "synchronised its gradients. Every trainable parameter must take part in the loss on "
            "every rank (torch DDP would need find_unused_parameters=True); freeze unused ones "
            "with requires_grad_(False) before wrapping the model")

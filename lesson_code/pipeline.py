"""Pipeline parallelism (lesson 79): a model cut into stages over ranks, fed with micro-batches.

The stages are the ranks of a `Communicator`'s group: rank s of the group holds stage s, a
contiguous run of the model's layers, and the group's size is the number of stages (a row of a 2-D
data x pipeline grid is a sub-group). A batch is split into m micro-batches; activations flow
forward from stage to stage and their gradients flow back, as point-to-point messages: on gloo
isend, waited for once the peer is known to have received it, and irecv with a bounded wait; under NCCL each stage's sends go out with its next receive
in one batch_isend_irecv (gloo has no such grouping: there batch_isend_irecv posts the same
isend and irecv one by one). Every message is counted in the communicator's ledger, under
"pipeline", one entry per step. Two schedules order the work on each stage:

- GPipe: all m forwards, then all m backwards; every stage stores m micro-batches' activations.
- 1F1B: P - s warm-up forwards (at most m), as torch's Schedule1F1B counts them, then one backward
  and one forward in turn, then the remaining backwards; a stage stores at most P - s micro-batches' activations.

`gpipe_step` is the same protocol at its simplest, which the lesson shows first: GPipe order,
activation shapes known in advance, no bookkeeping.

Each stage records timed events (stage, micro-batch, "F" or "B", start, end), from which the
lesson measures the bubble: the fraction of time a stage sits idle, (P - 1) / (m + P - 1) on equal
stages, more on unequal ones (`unequal_stage_bubble`).

    python -m lesson_code.pipeline_lab      # 4 stages, both schedules, checked against torch
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn

from lesson_code.collectives.comm import Communicator
from lesson_code.collectives.ledger import TrafficCounter
from lesson_code.runtime.devices import clock, current_device
from lesson_code.harness.validate import require_choice, require_positive_int

SCHEDULES = ("gpipe", "1f1b")
# An activation travels after a header of HEADER_LENGTH int64s: its dtype's index in
# ACTIVATION_DTYPES, its number of dimensions, then its shape. So the receiver allocates the
# right buffer for every micro-batch: any batch size, any of these dtypes, no probe forward.
ACTIVATION_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
HEADER_LENGTH = 10


def partition_layers(layers: list[nn.Module], num_stages: int,
                     partition: list[int] | None = None) -> list[tuple[int, int]]:
    """Split `layers` into `num_stages` contiguous [start, end) ranges.

    With `partition` (layers per stage) use it as given; otherwise balance the parameter counts:
    each cut goes where the running total of parameters is closest to k/num_stages of the total,
    keeping at least one layer per stage. Raises ValueError for more stages than layers or a
    partition that does not cover the layers.
    """
    count = len(layers)
    require_positive_int("num_stages", num_stages, "the number of pipeline stages (ranks), such as 4")
    if num_stages > count:
        raise ValueError(f"{num_stages} stages but only {count} layers: every stage needs at least "
                         f"one layer, so use at most {count} stages (ranks)")
    if partition is not None:
        if len(partition) != num_stages or sum(partition) != count or min(partition) < 1:
            raise ValueError(f"partition {partition} must give {num_stages} positive layer counts "
                             f"that add up to {count}")
        sizes = partition
    else:
        sizes = _balanced_sizes([sum(p.numel() for p in layer.parameters()) for layer in layers],
                                num_stages)
    bounds, start = [], 0
    for size in sizes:
        bounds.append((start, start + size))
        start += size
    return bounds


def _balanced_sizes(weights: list[int], num_stages: int) -> list[int]:
    """Layers per stage so that each stage's parameter count is as close as possible to equal."""
    total, cuts, running = sum(weights), [], 0
    prefix = [running := running + w for w in weights]
    for k in range(1, num_stages):
        target = total * k / num_stages
        low = (cuts[-1] if cuts else 0) + 1           # leave at least one layer before the cut
        high = len(weights) - (num_stages - k)        # and one for every remaining stage
        # On a tie, cut later: a parameter-free layer (ReLU) stays with the layer before it.
        cuts.append(min(range(low, high + 1), key=lambda c: (abs(prefix[c - 1] - target), -c)))
    edges = [0, *cuts, len(weights)]
    return [b - a for a, b in zip(edges, edges[1:])]


def split_micro_batches(batch: torch.Tensor, micro_batches: int) -> tuple[torch.Tensor, ...]:
    """`batch` cut along dim 0 into `micro_batches` equal parts.

    Raises ValueError unless the count is positive and divides the batch size.
    """
    size = batch.shape[0]
    require_positive_int("micro_batches", micro_batches, f"a divisor of the batch size {size}")
    if size % micro_batches:
        raise ValueError(f"{micro_batches!r} micro-batches do not divide the batch of {size}: "
                         f"use a divisor of {size}")
    return torch.split(batch, size // micro_batches)


def schedule_order(schedule: str, stage: int, num_stages: int,
                   micro_batches: int, extra_warmup: int = 0) -> list[tuple[str, int]]:
    """Stage `stage`'s sequence of ("F", i) and ("B", i) under `schedule`, for m micro-batches.

    Under 1F1B stage s runs P - s warm-up forwards (at most m), as torch's Schedule1F1B does,
    then a backward and a forward in turn, then the remaining backwards. `warmup` below counts
    all but the last warm-up forward, which opens the loop's first pair. `extra_warmup` (page
    79b only) adds that many warm-up forwards on every stage but the last.
    Raises ValueError for an unknown schedule, a count below 1, a negative `extra_warmup` or a
    stage outside 0..P-1.
    """
    require_choice("schedule", schedule, SCHEDULES)
    require_positive_int("num_stages", num_stages, "the number of pipeline stages, such as 4")
    m = require_positive_int("micro_batches", micro_batches, "the micro-batches per step, such as 4")
    if not 0 <= stage < num_stages:
        raise ValueError(f"stage {stage!r} is not one of the {num_stages} stages: "
                         f"pass 0 to {num_stages - 1}")
    if not isinstance(extra_warmup, int) or isinstance(extra_warmup, bool) or extra_warmup < 0:
        raise ValueError(f"extra_warmup={extra_warmup!r}: pass a count of 0 or more")
    if schedule == "gpipe":
        return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
    warmup = min(num_stages - stage - 1 + (extra_warmup if stage < num_stages - 1 else 0), m)
    steps = [("F", i) for i in range(warmup)]
    for i in range(m - warmup):
        steps += [("F", warmup + i), ("B", i)]
    return steps + [("B", i) for i in range(m - warmup, m)]


def gpipe_step(layers: nn.Module, loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
               inputs: torch.Tensor, targets: torch.Tensor, micro_batches: int,
               activation_shape: tuple[int, ...], group: dist.ProcessGroup | None = None,
               timeout: timedelta = timedelta(seconds=60)) -> float | None:
    """One GPipe step of stage `dist.get_rank(group)`: `PipelineStage`'s messages without headers, no bookkeeping.

    Collective: call on every rank of `group`. Every activation has `activation_shape` (float32).
    Gradients accumulate in `layers`; returns the mean loss on the last stage, None elsewhere.
    Raises ValueError when m does not divide the batch, RuntimeError when a wait times out.
    """
    stage, last = dist.get_rank(group), dist.get_world_size(group) - 1
    x_parts = split_micro_batches(inputs, micro_batches)
    y_parts = split_micro_batches(targets, micro_batches)
    kept, sends, loss = [], [], 0.0
    for i in range(micro_batches):  # forwards
        x = x_parts[i]
        if stage > 0:
            x = torch.empty(activation_shape, device=current_device())
            dist.irecv(x, group=group, group_src=stage - 1).wait(timeout)
            x.requires_grad_(True)
        y = layers(x)
        if stage == last:
            y = loss_fn(y, y_parts[i]) / micro_batches  # so that the m gradients add up
            loss += y.item()
        else:  # not waited for: the next stage receives it when it gets there
            sends.append(dist.isend(y.detach(), group=group, group_dst=stage + 1))
        kept.append((x, y))  # the graph and the output, kept for the backward
    for x, y in kept:  # backwards, in the same order
        gradient = None
        if stage < last:
            gradient = torch.empty_like(y)
            dist.irecv(gradient, group=group, group_src=stage + 1).wait(timeout)
        y.backward(gradient)
        if stage > 0:
            sends.append(dist.isend(x.grad, group=group, group_dst=stage - 1))
    for work in sends:
        work.wait(timeout)
    return loss if stage == last else None


@dataclass
class PipelineStats:
    """What one stage measured in one step: its events, the most micro-batches it stored at once,
    and the most bytes it kept only because their sends were not yet known to be complete."""

    events: list[tuple[int, int, str, float, float]] = field(default_factory=list)
    peak_stored: int = 0
    peak_sent_bytes: int = 0
    loss: float | None = None


class PipelineStage:
    """One rank's stage: its layers, its neighbours, and one training step under a schedule.

    `comm` is a `Communicator` (or a process group, None for the default one): this rank's place
    in its group is the stage, the group's size the number of stages, and every message of a step
    goes into `comm.ledger` (when it has one) as one "pipeline" entry. Its timeout bounds every
    wait. Collective: the stage is built, and `train_step` called with the same arguments, on
    every rank of the group.
    `loss_fn(output, target)` is applied on the last stage to each micro-batch's output; its
    mean over micro-batches is the loss, so the gradients equal those of the whole batch.
    """

    def __init__(self, layers: nn.Module, comm: Communicator | dist.ProcessGroup | None,
                 loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]):
        self.comm = comm if isinstance(comm, Communicator) else Communicator(group=comm)
        self.layers, self.loss_fn = layers, loss_fn
        self.stage, self.num_stages = self.comm.rank, self.comm.world_size
        self.timeout = timedelta(seconds=self.comm.timeout_s)
        self.is_first, self.is_last = self.stage == 0, self.stage == self.num_stages - 1
        # Under NCCL two neighbours' sends to each other can wait for each other's receives on
        # the GPU, so there every send goes out in one group (batch_isend_irecv) with the
        # stage's next receive, as torch.distributed.pipelining does. gloo posts them one by one.
        self.batched = dist.get_backend(self.comm.group) == "nccl"
        # batch_isend_irecv's documentation asks every rank of the group to join the group's
        # first collective call, and a grouped call joins two neighbours only: one barrier here,
        # on every backend, makes the first call one that all stages join.
        dist.barrier(group=self.comm.group)
        self._begin_step()

    def _begin_step(self) -> None:
        """Fresh per-step state: statistics, stored activations, sends in flight, traffic."""
        self.stats = PipelineStats()
        self._stored: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._sends: dict = {}     # ("F" or "B", micro-batch) -> [(work, tensor)] posted on gloo
        self._last_gradient: int | None = None  # the micro-batch of the last gradient sent
        self._pending: list = []   # (P2POp, tensor) under NCCL, posted with the next receive
        self._total_loss = 0.0
        self._traffic = TrafficCounter("pipeline", self.comm.ledger)

    def train_step(self, inputs: torch.Tensor | None, targets: torch.Tensor | None,
                   micro_batches: int, schedule: str) -> PipelineStats:
        """Run forward and backward of every micro-batch in `schedule` order; gradients accumulate.

        Only the first stage reads `inputs` and only the last reads `targets`; the others may pass
        the same tensors or None. Raises ValueError for an unknown schedule or a micro-batch count
        that does not divide the batch.
        """
        order = schedule_order(schedule, self.stage, self.num_stages, micro_batches)
        x_parts = split_micro_batches(inputs, micro_batches) if self.is_first else [None] * micro_batches
        y_parts = split_micro_batches(targets, micro_batches) if self.is_last else [None] * micro_batches
        self._begin_step()
        for kind, index in order:
            if kind == "F":
                self._forward(index, x_parts[index], y_parts[index], micro_batches)
            else:
                self._backward(index)
        self._post_pending()
        for key in list(self._sends):
            self._wait_sends(key)
        self._traffic.commit()
        if self.is_last:
            self.stats.loss = self._total_loss
        return self.stats

    def _forward(self, index: int, x: torch.Tensor | None, y: torch.Tensor | None, m: int) -> None:
        if self.is_first:
            self._post_pending()  # stage 0 posts no receive in a forward: post its pending sends now
        received = x if self.is_first else self._receive_activation()
        start = clock()
        if not self.is_first:
            received.requires_grad_(True)
        output = self.layers(received)
        if self.is_last:
            output = self.loss_fn(output, y) / m
            self._total_loss += output.item()
        self._stored[index] = (received, output)
        self.stats.peak_stored = max(self.stats.peak_stored, len(self._stored))
        self.stats.events.append((self.stage, index, "F", start, clock()))
        if not self.is_last:
            self._send_activation(output.detach(), index)

    def _backward(self, index: int) -> None:
        received, output = self._stored.pop(index)
        if self.is_last:
            self._post_pending()
        gradient = None if self.is_last else self._receive(tuple(output.shape), output.dtype, +1)
        # The next stage sent this gradient, so it has received this micro-batch's activation and
        # that send is complete. The wait drops the send's reference; the activation's storage,
        # shared with `output`, is freed when this backward ends.
        self._wait_sends(("F", index))
        start = clock()
        output.backward(gradient)
        self.stats.events.append((self.stage, index, "B", start, clock()))
        if not self.is_first:
            self._send(received.grad, self.stage - 1, ("B", index))
            # Rule 2 of lesson 79: wait for the previous gradient's send, which cannot deadlock;
            # at most two gradients stay alive.
            if self._last_gradient is not None:
                self._wait_sends(("B", self._last_gradient))
            self._last_gradient = index

    def _send(self, tensor: torch.Tensor, to: int, key: tuple[str, int]) -> None:
        # Not waited for here: both neighbours may be sending to each other at this moment (lesson
        # 79, exercise 4), so a send is waited for only once it is known to be received
        # (`_wait_sends`). The tensor is kept with its request until then.
        tensor = tensor.contiguous()
        self._traffic.sent(tensor.numel() * tensor.element_size())
        if self.batched:  # posted with the next receive, or by _post_pending
            op = dist.P2POp(dist.isend, tensor, group=self.comm.group, group_peer=to)
            self._pending.append((op, tensor))
            return
        self._sends.setdefault(key, []).append(
            (dist.isend(tensor, group=self.comm.group, group_dst=to), tensor))
        self._count_kept_bytes()

    def _count_kept_bytes(self) -> None:
        """Update `stats.peak_sent_bytes`: bytes kept only for sends in flight, not the storage
        of an output the stage still holds for its backward."""
        stored = {output.untyped_storage().data_ptr() for _, output in self._stored.values()}
        kept = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                for works in self._sends.values() for _, t in works}
        self.stats.peak_sent_bytes = max(self.stats.peak_sent_bytes,
                                         sum(n for ptr, n in kept.items() if ptr not in stored))

    def _wait_sends(self, key: tuple[str, int]) -> None:
        """Wait (bounded) for the gloo sends posted under `key` and drop their tensors."""
        for work, _ in self._sends.pop(key, []):
            work.wait(self.timeout)

    def _post_pending(self, receive: dist.P2POp | None = None) -> None:
        """Under NCCL: post the pending sends (and `receive`) as one group and wait, bounded."""
        ops = [op for op, _ in self._pending] + ([receive] if receive is not None else [])
        self._pending = []
        for work in dist.batch_isend_irecv(ops) if ops else []:
            work.wait(self.timeout)

    def _send_activation(self, output: torch.Tensor, index: int) -> None:
        """Send the header describing micro-batch `index`'s `output`, then `output`, to the next stage."""
        if output.dtype not in ACTIVATION_DTYPES or output.dim() > HEADER_LENGTH - 2:
            raise ValueError(
                f"stage {self.stage} outputs a {output.dtype} tensor of shape {tuple(output.shape)}: "
                f"activations between stages must have one of the dtypes {ACTIVATION_DTYPES} and "
                f"at most {HEADER_LENGTH - 2} dimensions; cut the model at another layer"
            )
        header = torch.zeros(HEADER_LENGTH, dtype=torch.int64, device=output.device)
        header[0], header[1] = ACTIVATION_DTYPES.index(output.dtype), output.dim()
        header[2: 2 + output.dim()] = torch.tensor(output.shape)
        self._send(header, self.stage + 1, ("F", index))
        self._send(output, self.stage + 1, ("F", index))

    def _receive_activation(self) -> torch.Tensor:
        """Receive a header from the previous stage, then the activation it describes."""
        header = self._receive((HEADER_LENGTH,), torch.int64).tolist()
        shape = tuple(header[2: 2 + header[1]])
        return self._receive(shape, ACTIVATION_DTYPES[header[0]])

    def _receive(self, shape: tuple[int, ...], dtype: torch.dtype, offset: int = -1) -> torch.Tensor:
        buffer = torch.empty(shape, dtype=dtype, device=current_device())
        self._traffic.received(buffer.numel() * buffer.element_size())
        peer = self.stage + offset
        if self.batched:
            self._post_pending(dist.P2POp(dist.irecv, buffer, group=self.comm.group, group_peer=peer))
            return buffer
        dist.irecv(buffer, group=self.comm.group, group_src=peer).wait(self.timeout)
        return buffer


def bubble_fraction(events: list[tuple[int, int, str, float, float]], num_stages: int) -> float:
    """Measured bubble: 1 - (busy time of all stages) / (num_stages x the step's span).

    The span runs from the first event's start to the last event's end over all stages.
    """
    if not events:
        raise ValueError("no events: run a pipeline step first")
    start = min(e[3] for e in events)
    end = max(e[4] for e in events)
    busy = sum(e[4] - e[3] for e in events)
    return 1 - busy / (num_stages * (end - start))


def imbalance_floor(events: list[tuple[int, int, str, float, float]], num_stages: int) -> float:
    """1 - mean/max of the stages' busy times: the least bubble these stages allow at any m.

    A step lasts at least as long as its busiest stage is busy, so `bubble_fraction` can never
    fall below this; the formula (P-1)/(m+P-1) assumes equal stages, where it is 0.
    """
    busy = [sum(e[4] - e[3] for e in events if e[0] == stage) for stage in range(num_stages)]
    return 1 - sum(busy) / (num_stages * max(busy))


def theoretical_bubble(num_stages: int, micro_batches: int) -> float:
    """(P - 1) / (m + P - 1): the idle fraction of GPipe and 1F1B with equal stage times."""
    return (num_stages - 1) / (micro_batches + num_stages - 1)


def unequal_stage_bubble(num_stages: int, micro_batches: int, floor: float) -> float:
    """The bubble of GPipe on stages of unequal speed, from their `imbalance_floor` f.

    With t_s the time stage s spends on one micro-batch (forward and backward), a step lasts
    sum(t) + (m - 1) max(t): the first micro-batch crosses every stage, then the slowest stage
    paces the other m - 1. So b = 1 - m sum(t) / (P (sum(t) + (m - 1) max(t))), which depends on
    the times only through sum(t) / max(t) = P (1 - f). f = 0 gives (P - 1) / (m + P - 1); as m
    grows, b falls to f. Exact for GPipe with free messages when every stage's backward takes the
    same multiple of its forward; 1F1B's bubble is the same or lower (`ideal_timeline` with
    per-stage times shows both).
    """
    ratio = num_stages * (1 - floor)  # sum(t) / max(t)
    return 1 - micro_batches * ratio / (num_stages * (ratio + micro_batches - 1))


def ideal_timeline(schedule: str, num_stages: int, micro_batches: int,
                   forward: float | list[float] = 1.0, backward: float | list[float] = 2.0,
                   message: float = 0.0, extra_warmup: int = 0
                   ) -> list[tuple[int, int, str, float, float]]:
    """The step `schedule` gives when each message between stages takes `message` (0: free
    messages): events (stage, micro-batch, "F" or "B", start, end), like those a real step
    measures.

    Each stage runs its `schedule_order` (with `extra_warmup`) one item at a time, each as soon
    as the stage is free and its input has arrived: forward i on stage s `message` after forward
    i on s - 1 ends, backward i `message` after backward i on s + 1 ends (on the last stage, at
    once after its own forward i). A stage waits for nothing else, as if it posted its receives
    ahead and never waited for a send. Every forward takes
    `forward`, every backward `backward` (about twice a forward in practice), or, given lists,
    each stage its own. On equal stages its `bubble_fraction` is (P - 1) / (m + P - 1) under
    both schedules; lesson 79's explorer draws this same timeline in the browser
    (book/static/explorer-79.js, tested against this). Raises ValueError for a list whose
    length is not the number of stages.
    """
    orders = [schedule_order(schedule, stage, num_stages, micro_batches, extra_warmup)
              for stage in range(num_stages)]
    if not isinstance(message, (int, float)) or not message >= 0:
        raise ValueError(f"message={message!r}: pass a time of 0 or more")
    times = {kind: list(given) if isinstance(given, (list, tuple)) else [given] * num_stages
             for kind, given in (("F", forward), ("B", backward))}
    if any(len(per_stage) != num_stages for per_stage in times.values()):
        raise ValueError(f"forward and backward times {forward!r}, {backward!r}: give one "
                         f"number, or one per stage ({num_stages})")
    done: dict[tuple[int, str, int], float] = {}  # (stage, kind, micro-batch) -> end
    free, next_item, events = [0.0] * num_stages, [0] * num_stages, []
    while len(events) < 2 * micro_batches * num_stages:
        before = len(events)
        for stage, order in enumerate(orders):
            while next_item[stage] < len(order):
                kind, micro = order[next_item[stage]]
                needs = ((stage - 1, "F", micro) if kind == "F" else
                         (stage + 1, "B", micro) if stage < num_stages - 1 else (stage, "F", micro))
                if kind == "F" and stage == 0:
                    ready = 0.0
                elif needs in done:
                    ready = done[needs] + (message if needs[0] != stage else 0.0)
                else:
                    break  # its input is not computed yet: another stage goes first
                start = max(free[stage], ready)
                free[stage] = done[(stage, kind, micro)] = start + times[kind][stage]
                events.append((stage, micro, kind, start, free[stage]))
                next_item[stage] += 1
        if len(events) == before:  # cannot happen with schedule_order's orders; never spin
            raise RuntimeError(f"{schedule} with P={num_stages}, m={micro_batches} deadlocks")
    return sorted(events, key=lambda event: (event[0], event[3]))


def peak_in_flight(order: list[tuple[str, int]]) -> int:
    """The most micro-batches whose activations a stage holds at once under `order` (its
    forwards not yet matched by their backward): m under GPipe, at most P - s under 1F1B."""
    held = peak = 0
    for kind, _ in order:
        held += 1 if kind == "F" else -1
        peak = max(peak, held)
    return peak

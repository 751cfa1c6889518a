"""One training step of DDP or a ZeRO stage on one rank, and what the rank held and sent in it
(lesson 78's scale lab).

`measure_step` is a rank function: it runs the same on a real rank (`launch.spawn`), on a
rank of a simulated world (`runtime.simulated`), and on the meta device, where tensors have
shapes and bytes but no memory and no values. It builds the model and the strategy with the
course's own code (`zero_lab.build_optimizer`: lesson 77's `BucketedDDP` with `MasterAdam`,
lesson 78's `ZeroOptimizer`, `Zero2Optimizer`, `Zero3Optimizer`), runs one step of forward,
backward and optimizer, and reports, from the tensors' storage and the communication ledger:

- held: after the step, the bytes of each thing the rank keeps (`held_tensors`), by kind;
- peak: the most bytes live at once during the step; setup_peak: the same while building;
- traffic: the bytes and messages the ledger counted in the step (the setup's broadcast apart).

    from lesson_code.scale_lab.step import ScaleRun, measure_step
    from lesson_code.runtime.simulated import fake_rank
    with fake_rank(64, rank=0):
        row = measure_step(0, 64, ScaleRun("ZeRO-2"), shapes_only=True)
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field, replace

import torch
from torch import nn
from torch.profiler import record_function

from lesson_code import zero_lab
from lesson_code.collectives.ledger import CommLedger
from lesson_code.experiment import DTYPES
from lesson_code.harness.allocations import AllocationTrace
from lesson_code.harness.validate import require_choice, require_positive, require_positive_int
from lesson_code.runtime.devices import current_device
from lesson_code.models import GPTConfig, MiniGPT, count_parameters
from lesson_code.scale_lab.storages import StorageTracker, held_bytes
from lesson_code.zero_lab import ZeroRun

# The strategies the scale lab compares, named as `memory.STAGES`, and zero_lab's name for each.
# DDP is lesson 77's bucketed DDP (the one a reader trains with), with an unsharded fp32 master.
STRATEGIES = {"DDP": "ddp", "ZeRO-1": "zero", "ZeRO-2": "zero2", "ZeRO-3": "zero3"}
KINDS = ("parameters", "gradients", "optimizer", "buffers")
# MiniGPT of lesson 77's benchmark: 6 blocks of width 256, context 64; 4,788,224 parameters.
SWEEP_GPT = GPTConfig(n_embd=256, n_layer=6, n_head=8, context=64)


@dataclass(frozen=True)
class ScaleRun:
    """A step the scale lab measures: `strategy`, a MiniGPT of shape `gpt` in `dtype` (its
    weights and gradients; the optimizers keep an fp32 master copy and fp32 moments, as in
    the ZeRO paper's mixed-precision Adam), `sequences_per_rank` sequences of `tokens` tokens
    (the model's context when None) on each rank, the buckets of DDP and ZeRO-2, and the
    communicator: lesson 76's ring, whose every message the ledger counts, or torch's own.

    Raises ValueError for an unknown strategy or dtype, and counts or sizes below 1.
    """

    strategy: str = "ZeRO-1"
    gpt: GPTConfig = field(default_factory=lambda: SWEEP_GPT)
    dtype: str = "bfloat16"
    sequences_per_rank: int = 1
    tokens: int | None = None
    bucket_cap_mb: float = 25.0
    lr: float = 1e-3
    seed: int = 0
    comm: str = "ring"  # lesson 76's ring (its bytes counted in the ledger) or "builtin"

    def __post_init__(self):
        require_choice("strategy", self.strategy, STRATEGIES)
        require_choice("dtype", self.dtype, zero_lab.MODEL_DTYPES)
        require_positive_int("sequences_per_rank", self.sequences_per_rank)
        if self.tokens is not None and not 1 <= self.tokens <= self.gpt.context:
            raise ValueError(f"tokens={self.tokens!r} does not fit the model's context of "
                             f"{self.gpt.context}: pass 1 to {self.gpt.context}, or None")
        require_positive("bucket_cap_mb", self.bucket_cap_mb)
        require_positive("lr", self.lr)
        require_choice("communicator", self.comm, ("ring", "builtin"))

    def zero_run(self, world_size: int) -> ZeroRun:
        """Lesson 78's description of this run on `world_size` ranks (its global batch)."""
        return ZeroRun(model="gpt", gpt=self.gpt, optimizer=STRATEGIES[self.strategy],
                       batch_size=self.sequences_per_rank * world_size, dtype=self.dtype,
                       lr=self.lr, bucket_cap_mb=self.bucket_cap_mb, seed=self.seed, steps=1,
                       comm=self.comm)

    def batch(self, rank: int, world_size: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's (tokens, targets): its slice of the global batch of step 0, copied out of
        it (on a real device a slice would keep the whole batch's storage alive)."""
        data = replace(self.zero_run(world_size), gpt=replace(self.gpt, context=self.tokens)) \
            if self.tokens else self.zero_run(world_size)
        return tuple(t.to(device).clone() for t in data.local_batch(0, rank, world_size))

    @property
    def parameters(self) -> int:
        """Trainable parameters of the model (built on the meta device: no memory)."""
        with torch.device("meta"):
            return count_parameters(MiniGPT(self.gpt))


def build_model(run: ScaleRun, rank: int, world_size: int, shapes_only: bool) -> nn.Module:
    """The run's MiniGPT in its dtype: as lesson 78 builds it (`zero_lab.run_model`, from the
    seed, on this process's device), or with `shapes_only` on the meta device, built in float32
    and then cast, as the real one is (so its tensors, and their bytes, are the same)."""
    if not shapes_only:
        return zero_lab.run_model(run.zero_run(world_size), seed_offset=rank)
    with torch.device("meta"):
        return MiniGPT(run.gpt).to(DTYPES[run.dtype])


def held_tensors(model: nn.Module, wrapper: nn.Module, optimizer) -> dict[str, list]:
    """What the rank keeps, by kind and by holder: "kind: holder" -> tensors (each storage is
    counted once, under the first holder: `held_bytes`). Read from the course's classes:

    parameters: the model's weights (ZeRO-3: empty, or views of a gathered unit), ZeRO-3's
    shards and gathered units; gradients: each parameter's .grad, DDP's buckets and ZeRO-2/3's
    buckets not yet reduced, the averaged gradient shard of ZeRO-1/2/3; optimizer: the fp32
    master copy and Adam's two moments; buffers: the model's (MiniGPT's causal masks).
    """
    groups = getattr(optimizer, "groups", [])
    params = list(model.parameters())
    return {
        "parameters: weights": params,
        "parameters: shards": [g.shard for g in groups],
        "parameters: gathered units": [g.full for g in groups],
        "gradients: .grad": [p.grad for p in params],
        "gradients: buckets": [b.flat for b in getattr(wrapper, "buckets", [])]
        + [g.flat_grad for g in groups],
        "gradients: shard": [getattr(optimizer, "grad_shard", None)],
        "optimizer: fp32 master": [optimizer.master],
        "optimizer: moments": [optimizer.exp_avg, optimizer.exp_avg_sq],
        "buffers: model buffers": list(model.buffers()),
    }


def padding_elements(optimizer, rank: int) -> int:
    """Elements of this rank's shards that are padding (zeros added so that N divides a flat
    vector): ZeRO-1 pads the whole model, ZeRO-2 each bucket, ZeRO-3 each unit; 0 for DDP."""
    groups = getattr(optimizer, "groups", None)
    if groups is None:
        if not hasattr(optimizer, "padding"):
            return 0
        groups = [optimizer]  # ZeroOptimizer: one flat vector with the same fields
    return sum(max(0, min(g.shard_numel, (rank + 1) * g.shard_numel - g.numel)) for g in groups)


def averaged_gradient_of(model: nn.Module, optimizer) -> torch.Tensor:
    """What this rank holds of the averaged gradient after the step, flat, in float64: every
    parameter's .grad under DDP (its all-reduce wrote the average back), the rank's averaged
    shard under ZeRO (its reduce-scatter's output). A gradient summed instead of averaged, or
    averaged into the wrong elements, shows here, where one Adam step from zero moments (a
    move of about lr * sign(g) per parameter) hides it."""
    shard = getattr(optimizer, "grad_shard", None)
    if shard is not None:
        return shard.detach().to(torch.float64).clone()
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()]).to(torch.float64)


def measure_step(rank: int, world_size: int, run: ScaleRun, shapes_only: bool = False,
                 profile: bool = False) -> dict:
    """One step of `run` on this rank: what it held after the step, its peaks, its traffic.

    Collective: call on every rank (or as one rank of `runtime.simulated.fake_rank`). With
    `shapes_only` the model lives on the meta device: no memory, no values, the same bytes.
    Returns a dict, chiefly "held" ({"kind: holder": bytes}), "peak" and "setup_peak" (bytes),
    where the peak fell ("peak_in", "peak_at", "peak_by_phase"), the bytes live at the end of
    the forward by the phase that made them ("forward_end_by_phase"), and this step's "sent",
    "messages_sent" and "ledger". With `profile` (real tensors, one rank per process) the rank
    also runs under torch's profiler, and "profiler_peak" is its allocator's step peak.
    """
    ledger = CommLedger()
    zero_run = run.zero_run(world_size)
    # The batch is made first, outside what is measured (it is not the strategy's).
    x, y = run.batch(rank, world_size, "meta" if shapes_only else current_device())
    if profile and shapes_only:
        raise ValueError("profile=True needs real tensors: the profiler sees no allocation on "
                         "the meta device; pass shapes_only=False")
    with AllocationTrace(current_device()) if profile else nullcontext() as trace, \
            StorageTracker() as tracker:
        model = build_model(run, rank, world_size, shapes_only)
        wrapper, optimizer = zero_lab.build_optimizer(zero_run, model, rank, world_size, ledger)
        setup_peak, setup_peak_at = tracker.peak, tracker.peak_at
        ledger.clear()  # the initial broadcast is setup, not the step
        tracker.reset_peak("forward")
        with record_function("step"):  # the step's range, for the profiler
            loss = wrapper(x, y)[1]
            forward_end_by_phase = tracker.live_by_phase()  # the activations the backward needs
            tracker.phase = "backward"
            loss.backward()
            tracker.phase = "optimizer"
            optimizer.step()
            del loss
    profiler_peak = None
    if profile:
        step = trace.ranges_named("step")[0]
        # Without kernels' scratch, which the tracker cannot see and only some CPUs' kernels take.
        profiler_peak = trace.peak(step.start_ns, step.end_ns, scratch=False)[0]
    held = held_bytes(held_tensors(model, wrapper, optimizer))
    traffic = {"sent": ledger.bytes_sent, "received": ledger.bytes_received,
               "messages_sent": sum(entry.messages_sent for entry in ledger.entries),
               "ledger": ledger.totals()}
    # Gathering ZeRO-3's shards is a collective of its own, after the step's traffic was read.
    params = None if shapes_only else zero_lab.gathered_parameters(model, optimizer)
    averaged_gradient = None if shapes_only else averaged_gradient_of(model, optimizer)
    for holder in (wrapper, optimizer):  # DDP's ring thread would otherwise wait on, idle
        if getattr(holder, "comm", None) is not None:
            holder.comm.close()
    return {"rank": rank, "world_size": world_size, "strategy": run.strategy, "held": held,
            "by_kind": {kind: sum(nbytes for name, nbytes in held.items()
                                  if name.startswith(kind)) for kind in KINDS},
            "peak": tracker.peak, "peak_in": tracker.peak_in, "peak_at": tracker.peak_at,
            "peak_by_phase": tracker.peak_by_phase, "forward_end_by_phase": forward_end_by_phase,
            "setup_peak": setup_peak,
            "setup_peak_at": setup_peak_at, "profiler_peak": profiler_peak,
            "averaged_gradient": averaged_gradient,
            "padding": padding_elements(optimizer, rank),
            "shard_numel": optimizer.master.numel(), **traffic,
            "scalar_reads": tracker.scalar_reads, "params": params}


def measure_steps(rank: int, world_size: int, runs: list[ScaleRun],
                  shapes_only: bool = False, profile: bool = False) -> list[dict]:
    """`measure_step` for each of `runs`, in order (one start of the ranks for several).
    Collective: call on every rank."""
    return [measure_step(rank, world_size, run, shapes_only, profile) for run in runs]

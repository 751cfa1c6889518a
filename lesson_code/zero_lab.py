"""Rank functions of lesson 78: train with ZeRO stages 1-3 and their rivals, measure memory
and traffic.

The notebook, the tests and the benchmark run these through `launch.spawn` (or torchrun). A
`ZeroRun` (a frozen `experiment.RunConfig`) says what to train; `train_single_process` is the
reference, and torch's own ZeroRedundancyOptimizer (stage 1) and FSDP2 (`fully_shard`, stage 3)
are the others. The loop and the timing are the shared harness's (`lesson_code.experiment`).
`stage_memory_table` measures the peak memory of a step under DDP and each stage beside the
formulas of `lesson_code.memory`; `stage3_timeline` shows one ZeRO-3 step, layer by layer.
What only the lesson's exercises run is in `lesson_code.zero_exercises`.

    python -m lesson_code.zero_lab                      # an MLP, 20 steps on 4 ranks, ZeRO-1
    python -m lesson_code.zero_lab --optimizer zero3    # the same with ZeRO-3, and its peak
    python -m lesson_code.zero_lab --lang fa            # reported in Persian
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace

import pandas as pd
import torch
from torch.nn.parallel import DistributedDataParallel
from torch.profiler import record_function

from lesson_code import language, launch, memory
from lesson_code.harness import cli_args
from lesson_code.collectives.ledger import CommLedger
from lesson_code.ddp import BucketedDDP, NaiveDDP, broadcast_parameters
from lesson_code.ddp_lab import each_run, timed_step
from lesson_code.runtime.devices import current_device
from lesson_code.experiment import DTYPES, RunConfig, flat_parameters, train
from lesson_code.harness.allocations import BEFORE, AllocationTrace
from lesson_code.harness.timing import PhaseClock
from lesson_code.models import GPTConfig, build_model, count_parameters
from lesson_code.harness.validate import require_choice, require_positive
from lesson_code.zero import (MasterAdam, NaiveZeroOptimizer, ZeroOptimizer, flat_gradient,
                              flatten_params, storage_bytes)
from lesson_code.zero2 import Zero2Optimizer
from lesson_code.zero3 import Zero3Optimizer, default_units

OPTIMIZERS = ("zero", "naive_zero", "torch_zero", "ddp", "naive_ddp", "zero2", "zero3", "fsdp2")
MODEL_DTYPES = ("float32", "bfloat16")  # of the model's parameters; the master copy is float32


@dataclass(frozen=True)
class ZeroRun(RunConfig):
    """A run of lesson 78: RunConfig's settings, plus optimizer variant, Adam's hyper-parameters,
    ZeRO stage and the model's precision. Raises ValueError for an unknown optimizer or dtype,
    or a learning rate of 0 or less."""

    batch_size: int = 24          # divisible by 1, 2, 3 and 4: equal slices on every rank
    optimizer: str = "zero"       # "zero" (ZeRO-1), "naive_zero", "torch_zero"
    #                               (ZeroRedundancyOptimizer), "ddp" (our bucketed DDP +
    #                               unsharded MasterAdam), "naive_ddp" (NaiveDDP + MasterAdam),
    #                               "zero2", "zero3", "fsdp2" (torch's fully_shard + Adam)
    lr: float = 1e-2
    weight_decay: float = 0.0
    max_grad_norm: float | None = None  # "zero", "naive_zero", "ddp", "naive_ddp" only
    stage: int = 1                # of "zero": 2 drops the full gradients in step() (lesson 78's
    #                               first cut; "zero2" is stage 2 as it runs, during backward)
    dtype: str = "float32"        # model parameters: "float32" or "bfloat16" (master is fp32)
    bucket_cap_mb: float = 25.0   # bucket size of "ddp" and "zero2"

    def __post_init__(self):
        super().__post_init__()
        require_choice("optimizer", self.optimizer, OPTIMIZERS)
        require_choice("dtype", self.dtype, MODEL_DTYPES)
        require_positive("lr", self.lr)
        require_positive("bucket_cap_mb", self.bucket_cap_mb)
        if self.max_grad_norm is not None and self.optimizer in ("zero2", "zero3", "fsdp2"):
            raise ValueError(f"max_grad_norm={self.max_grad_norm} is not supported with "
                             f"optimizer={self.optimizer!r}: clip with optimizer='zero' (ZeRO-1), "
                             "or leave max_grad_norm=None")


def run_model(run: ZeroRun, seed_offset: int = 0):
    """The model `run` trains ("mlp": 6922 parameters, not divisible by 3 or 4; or "gpt"),
    built from `run.seed + seed_offset`, in `run.dtype`, on this process's device. Ranks pass an
    offset (their rank) to start apart: only the optimizer's initial broadcast makes them equal."""
    return build_model(run.model, run.seed + seed_offset, run.gpt,
                       current_device()).to(DTYPES[run.dtype])


def run_loss(run: ZeroRun, model, step: int, rank: int = 0, world_size: int = 1):
    """`model`'s loss on this rank's slice of the global batch of `step` (the whole batch for one
    process); the MLP's features are cast to the model's dtype first."""
    x, y = run.local_batch(step, rank, world_size)
    if x.is_floating_point():
        x = x.to(DTYPES[run.dtype])  # the MLP's features, in the model's precision
    return model(x, y)[1]


def train_single_process(run: ZeroRun) -> dict:
    """The reference on one process and the full batch: torch.optim.Adam (float32 model, with
    clip_grad_norm_ before each step when asked) or MasterAdam, an fp32 master copy, for a
    bfloat16 model. Returns the final parameters (float64), the loss of each step and, when a
    float32 model is clipped, the gradient's norm before clipping at each step.

    Runs in a group of one: compute it with `reference.in_one_rank`, so that it also runs with
    the ranks' thread count.
    """
    model = run_model(run)
    norms = []  # the gradient's norm before clipping, at each step (when clipping)
    if run.dtype == "float32":
        optimizer = torch.optim.Adam(model.parameters(), lr=run.lr, weight_decay=run.weight_decay)
        if run.max_grad_norm is not None:
            def clip(*_) -> None:  # before every step, after backward
                norm = torch.nn.utils.clip_grad_norm_(model.parameters(), run.max_grad_norm)
                norms.append(norm.item())
            optimizer.register_step_pre_hook(clip)
    else:
        optimizer = MasterAdam(model, lr=run.lr, weight_decay=run.weight_decay,
                               max_grad_norm=run.max_grad_norm)
    losses = train(lambda step: run_loss(run, model, step), optimizer, range(run.steps))
    return {"params": flat_parameters(model), "losses": losses, "grad_norms": norms}


def build_optimizer(run: ZeroRun, model, rank: int, world_size: int, ledger=None, comm=None):
    """(model to call, optimizer) for `run.optimizer`; parameters equal rank 0's afterwards.
    `comm` (default: the run's communicator over `ledger`) carries our variants' traffic."""
    comm = comm if comm is not None else run.communicator(ledger)
    kwargs = {"lr": run.lr, "weight_decay": run.weight_decay}
    if run.optimizer == "torch_zero":
        return torch_zero1(model, **kwargs)
    if run.optimizer in ("ddp", "naive_ddp"):
        wrapped = (BucketedDDP(model, bucket_cap_mb=run.bucket_cap_mb, comm=comm)
                   if run.optimizer == "ddp" else NaiveDDP(model, comm=comm))
        return wrapped, MasterAdam(model, max_grad_norm=run.max_grad_norm, **kwargs)
    broadcast_parameters(model, comm=comm)
    if run.optimizer == "fsdp2":
        return model, fully_sharded_adam(model, world_size, **kwargs)
    if run.optimizer == "zero2":
        return model, Zero2Optimizer(model, world_size, rank, bucket_cap_mb=run.bucket_cap_mb,
                                     comm=comm, **kwargs)
    if run.optimizer == "zero3":
        return model, Zero3Optimizer(model, world_size, rank, comm=comm, **kwargs)
    variant = NaiveZeroOptimizer if run.optimizer == "naive_zero" else ZeroOptimizer
    return model, variant(model, world_size, rank, max_grad_norm=run.max_grad_norm,
                          stage=run.stage, comm=comm, **kwargs)


def torch_zero1(model: torch.nn.Module, **adam):
    """PyTorch's own ZeRO-1: (model to call, optimizer). Collective: call on every rank."""
    from torch.distributed.optim import ZeroRedundancyOptimizer  # here: it warns on import

    model = DistributedDataParallel(model)  # broadcasts rank 0's weights; all-reduces in backward
    return model, ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam,
                                          **adam)


def fully_sharded_adam(model, world_size: int, **adam) -> torch.optim.Adam:
    """torch's ZeRO-3: FSDP2's `fully_shard` on each of the units Zero3Optimizer gathers, then on
    the whole model, over all ranks on this rank's device; torch.optim.Adam on the DTensor
    shards. Collective: call on every rank, after the parameters were made equal."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(current_device().type, (world_size,))
    for unit in default_units(model):
        fully_shard(unit, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return torch.optim.Adam(model.parameters(), **adam)


def gathered_parameters(model, optimizer) -> torch.Tensor:
    """All trainable parameters in one float64 vector, whole on every rank: gathered from the
    shards under ZeRO-3 and FSDP2, which makes it a collective there (call on every rank)."""
    if isinstance(optimizer, Zero3Optimizer):
        return optimizer.full_parameters().detach().to(torch.float64)
    from torch.distributed.tensor import DTensor

    if any(isinstance(p, DTensor) for p in model.parameters()):
        return torch.cat([p.full_tensor().detach().reshape(-1) for p in model.parameters()
                          if p.requires_grad]).to(torch.float64)
    return flat_parameters(model)


def parameter_digest(model) -> str:
    """Short sha256 of the parameters' bytes: equal digests mean bitwise-equal parameters."""
    return digest(flatten_params(model).to(torch.float32))


def digest(flat: torch.Tensor) -> str:
    """Short sha256 of a tensor's bytes: equal digests mean bitwise-equal tensors."""
    return hashlib.sha256(flat.cpu().contiguous().numpy().tobytes()).hexdigest()[:16]


def train_on_rank(rank: int, world_size: int, run: ZeroRun) -> dict:
    """Train `run` on this rank's slice; return parameters, losses, memory and traffic.

    Collective: call on every rank. Models start from seed + rank: only the initial broadcast
    makes them equal. Returns the final parameters (float64), the global mean loss per step, a
    parameter digest per step, the global gradient norm before clipping per step (ZeRO-1 with
    max_grad_norm; otherwise empty), this rank's measured optimizer and gradient bytes after the
    last step, and its ledger totals of the last step (forward, backward and optimizer step).
    """
    ledger = CommLedger()
    model, optimizer = build_optimizer(run, run_model(run, seed_offset=rank), rank, world_size, ledger)
    inner = getattr(model, "module", model)
    digests, norms, last_step = [], [], {}

    def step_loss(step: int) -> torch.Tensor:
        ledger.clear()  # so that it holds the traffic of one step only
        return run_loss(run, model, step, rank, world_size)

    def after_step(done: int) -> None:
        last_step["ledger"] = ledger.totals()  # before the digest gathers sharded parameters
        if getattr(optimizer, "last_grad_norm", None) is not None:
            norms.append(optimizer.last_grad_norm)  # computed in this step, before clipping
        digests.append(digest(gathered_parameters(inner, optimizer).to(torch.float32)))

    losses = train(step_loss, optimizer, range(run.steps), after_step=after_step)
    measured = getattr(optimizer, "optimizer_state_bytes", lambda: None)()
    gradient = getattr(optimizer, "gradient_bytes", lambda: None)()
    return {"params": gathered_parameters(inner, optimizer), "losses": losses,
            "digests": digests, "grad_norms": norms, "optimizer_bytes": measured,
            "gradient_bytes": gradient,
            "shard_numel": getattr(optimizer, "shard_numel", None),
            "padding": getattr(optimizer, "padding", None), "ledger": last_step["ledger"]}


def resume_matches(rank: int, world_size: int, run: ZeroRun, stop_at: int) -> dict:
    """Train `run.steps` steps straight, and again stopping at `stop_at` to rebuild the optimizer
    from its state_dict; report whether both runs end with bitwise-equal parameters and moments.

    Collective: call on every rank (ZeRO variants only).
    """
    def train_steps(model, optimizer, steps: range) -> None:
        train(lambda step: run_loss(run, model, step, rank, world_size), optimizer, steps)

    finals = []
    for interrupted in (False, True):
        model, optimizer = build_optimizer(run, run_model(run), rank, world_size)
        train_steps(model, optimizer, range(stop_at if interrupted else run.steps))
        if interrupted:  # a fresh model and optimizer from another start, then the saved state
            saved = optimizer.state_dict()
            model, optimizer = build_optimizer(run, run_model(run, seed_offset=1 + rank),
                                               rank, world_size)
            optimizer.load_state_dict(saved)
            train_steps(model, optimizer, range(stop_at, run.steps))
        finals.append((flatten_params(model), optimizer.state_dict()))
    (a, state_a), (b, state_b) = finals
    return {"params_equal": torch.equal(a, b),
            "state_equal": all(torch.equal(state_a[k], state_b[k])
                               for k in ("master", "exp_avg", "exp_avg_sq")),
            "steps": (state_a["step"], state_b["step"])}


def load_mismatched_shard(rank: int, world_size: int) -> str:
    """The error a rank gets when it loads another rank's shard. Collective: every rank."""
    run = ZeroRun()
    model, optimizer = build_optimizer(run, run_model(run), rank, world_size)
    state = optimizer.state_dict()
    state["shard"]["rank"] = (rank + 1) % world_size
    try:
        optimizer.load_state_dict(state)
    except ValueError as error:
        return str(error)
    return "no error"


def time_steps(rank: int, world_size: int, run: ZeroRun, warmup: int = 2) -> dict:
    """Median seconds of forward, backward, optimizer step and communication, and the bytes
    this rank sent per step. Collective: call on every rank.

    "comm" is the time the communicator's calls themselves took in a step. For "ddp" they run on
    a background thread as each bucket fills, and backward waits for the last of them (with the
    default 25 MiB buckets a model under 25 MiB of gradients has one bucket, reduced after the
    last gradient: no overlap; lesson 77); for ZeRO-1 the reduce-scatter
    and all-gather run inside the optimizer step, so its computation alone is optimizer - comm;
    ZeRO-2 reduce-scatters during backward and ZeRO-3 also gathers during forward and backward.
    NaN for "torch_zero" and "fsdp2", whose gloo calls no ledger sees.
    """
    ledger = CommLedger()
    comm = run.communicator(ledger, record_events=True)
    model, optimizer = build_optimizer(run, run_model(run), rank, world_size, comm=comm)
    clock = PhaseClock()
    for step in range(warmup + run.steps):
        if step == warmup:
            clock.discard()
        ledger.clear()
        comm.events.clear()  # (op, bytes, start, end) of this step's calls only
        timed_step(clock, optimizer, lambda: run_loss(run, model, step, rank, world_size))
        stats = getattr(model, "stats", None)  # our DDP reads (and clears) its buckets' events
        seconds = stats["comm_s"] if stats else sum(end - start for _, _, start, end in comm.events)
        clock.samples.setdefault("comm", []).append(
            float("nan") if run.optimizer in ("torch_zero", "fsdp2") else seconds)
    return {**clock.medians(), "bytes_sent": ledger.bytes_sent}


def memory_profile(rank: int, world_size: int, run: ZeroRun) -> dict[str, int]:
    """Bytes this rank holds after one step's backward: parameters, gradients, optimizer state.

    Collective: call on every rank. Each figure is read from tensor storage, never computed.
    """
    model, optimizer = build_optimizer(run, run_model(run), rank, world_size)
    inner = getattr(model, "module", model)
    run_loss(run, model, 0, rank, world_size).backward()
    grads = storage_bytes(*(p.grad for p in inner.parameters() if p.grad is not None))
    optimizer.step()
    if run.optimizer == "torch_zero":
        state = optimizer.optim.state.values()
        held = storage_bytes(*(t for s in state for t in s.values()
                               if torch.is_tensor(t) and t.dim() > 0))
    else:
        held = optimizer.optimizer_state_bytes()
    return {"rank": rank, "parameters": storage_bytes(*inner.parameters()), "gradients": grads,
            "optimizer": held}


def reduction_precision(rank: int, world_size: int, run: ZeroRun) -> dict:
    """The same step's averaged gradient shard reduce-scattered in the gradients' dtype (as
    `ZeroOptimizer` does) and cast to fp32 first (as production systems often do).

    Collective: call on every rank. Returns this rank's largest absolute difference between the
    two shards, the largest magnitude of the fp32 one, and the two shards' relative L2 distance.
    """
    model, optimizer = build_optimizer(replace(run, optimizer="zero"), run_model(run), rank,
                                       world_size)
    run_loss(run, model, 0, rank, world_size).backward()
    flat = optimizer._padded(flat_gradient(optimizer.params))
    in_dtype = optimizer.comm.reduce_scatter(flat.clone(), op="avg").to(torch.float32)
    in_fp32 = optimizer.comm.reduce_scatter(flat.to(torch.float32), op="avg")
    gap = in_dtype - in_fp32
    return {"rank": rank, "largest_difference": gap.abs().max().item(),
            "largest_gradient": in_fp32.abs().max().item(),
            "relative_l2": (gap.norm() / in_fp32.norm()).item()}


STAGE_OPTIMIZERS = {"DDP": "naive_ddp", "ZeRO-1": "zero", "ZeRO-2": "zero2", "ZeRO-3": "zero3"}
PRECISIONS = {"float32": memory.FP32_MASTER_ADAM, "bfloat16": memory.MIXED_ADAM}
# A model whose gradients are a large share of a step's memory: 0.8M parameters (3.2 MB of
# float32 gradients) and few tokens (4 sequences of 8 in all), so that activations stay small.
# ZeRO-2's buckets of 0.5 MB hold about a third of a block each.
MEMORY_RUN = ZeroRun(model="gpt", gpt=GPTConfig(context=8, n_layer=4, n_embd=128, n_head=4),
                     batch_size=4, steps=2, bucket_cap_mb=0.5)
# Who allocated the bytes live at a step's peak, by the marked range they were allocated in.
PARTS = {BEFORE: "held", "forward": "forward", "backward": "backward", "gather": "gathered",
         "reduce-scatter": "reduce-scatter", "optimizer": "optimizer"}


def traced_steps(rank: int, world_size: int, run: ZeroRun):
    """(trace, the last step's range, bytes of the model's buffers): `run.steps` training steps
    of `run` under an AllocationTrace begun before the model was built; each step marked
    "step <i>", with its "forward", "backward" and "optimizer" inside, and ended by zero_grad()
    (so that a step begins holding no gradient). The steps before the last warm up.
    Collective: call on every rank."""
    with AllocationTrace(current_device()) as trace:
        model, optimizer = build_optimizer(run, run_model(run, seed_offset=rank), rank, world_size)
        for step in range(run.steps):
            with record_function(f"step {step}"):
                with record_function("forward"):
                    loss = run_loss(run, model, step, rank, world_size)
                with record_function("backward"):
                    loss.backward()
                with record_function("optimizer"):
                    optimizer.step()
                optimizer.zero_grad()
                del loss
        buffers = storage_bytes(*getattr(model, "module", model).buffers())
    return trace, trace.ranges_named(f"step {run.steps - 1}")[0], buffers


def peak_memory(rank: int, world_size: int, run: ZeroRun) -> dict:
    """Bytes this rank allocated over the last step of `run`, measured by an AllocationTrace:
    the peak of the step and of each phase, the phase the peak fell in, the bytes live at the
    step's start, the activations (what forward left allocated), what backward left beyond the
    step's start (the gradients the rank holds, and the loss), the largest unit gathered
    (ZeRO-3), the model's buffers, and the bytes live at the peak by the part of the step that
    allocated them (`PARTS`: "held" since before the step, then "forward", "backward",
    "gathered", "reduce-scatter", "optimizer").

    Collective: call on every rank.
    """
    trace, step, buffers = traced_steps(rank, world_size, run)
    inside = [r for r in trace.ranges if step.contains(r.start_ns) and r is not step]
    phases = {r.name: r for r in inside if r.name in ("forward", "backward", "optimizer")}
    peak, when = trace.peak(step.start_ns, step.end_ns)
    at_peak = dict.fromkeys(PARTS.values(), 0)
    for name, nbytes in trace.live_by_range(when, since_ns=step.start_ns).items():
        at_peak[PARTS.get(name if name == BEFORE else name.split()[0], "held")] += nbytes
    gathers = [r for r in inside if r.name.startswith("gather")]
    return {"rank": rank, "peak": peak, "at_start": trace.live_at(step.start_ns),
            "peak_in": next((name for name, r in phases.items() if r.contains(when)), "step"),
            **{f"peak_{name}": trace.peak(r.start_ns, r.end_ns)[0] for name, r in phases.items()},
            "activations": (trace.live_at(phases["forward"].end_ns)
                            - trace.live_at(phases["forward"].start_ns)),
            "after_backward": (trace.live_at(phases["backward"].end_ns)
                               - trace.live_at(step.start_ns)),
            "largest_gather": max((trace.live_at(r.end_ns) - trace.live_at(r.start_ns)
                                   for r in gathers), default=0),
            "buffers": buffers, "at_peak": at_peak}


def stage_memory_table(run: ZeroRun = MEMORY_RUN, world_sizes=(1, 2, 4)) -> pd.DataFrame:
    """Measured peak bytes per rank of a training step under DDP and ZeRO stages 1-3, beside
    the formula of `lesson_code.memory`, for each world size; one spawn per world size.

    Rows (N, stage); columns: formula (parameters, gradients and optimizer state per rank),
    peak (the highest of the ranks' measured peaks), gap (peak - formula), then that rank's
    peak_in (the phase), the peak of each phase, at_start, activations, after_backward,
    largest_gather, buffers, and at_peak_<part>: the bytes live at the peak by the part of the
    step that allocated them (`PARTS`). DDP is `NaiveDDP` here, whose all-reduces run on
    the rank's own thread, where the trace sees their buffers.
    """
    parameters = count_parameters(run_model(run))
    rows = []
    for world_size in world_sizes:
        runs = [replace(run, optimizer=name) for name in STAGE_OPTIMIZERS.values()]
        per_rank = launch.spawn(each_run, peak_memory, runs, world_size=world_size)
        for index, stage in enumerate(STAGE_OPTIMIZERS):
            worst = max((ranks[index] for ranks in per_rank), key=lambda r: r["peak"])
            formula = memory.total_bytes(stage, parameters, world_size, PRECISIONS[run.dtype])
            rows.append({"N": world_size, "stage": stage, "formula": int(formula),
                         "peak": worst["peak"], "gap": worst["peak"] - int(formula),
                         **{key: worst[key] for key in (
                             "peak_in", "peak_forward", "peak_backward", "peak_optimizer",
                             "at_start", "activations", "after_backward", "largest_gather",
                             "buffers")},
                         **{f"at_peak_{part}": nbytes
                            for part, nbytes in worst["at_peak"].items()}})
    return pd.DataFrame(rows).set_index(["N", "stage"])


def stage3_timeline(rank: int, world_size: int, run: ZeroRun = MEMORY_RUN) -> dict:
    """One ZeRO-3 step of `run` as it ran on this rank: what each unit did when, and the bytes
    live on the rank meanwhile (the last of `run.steps` steps, measured by an AllocationTrace).

    Collective: call on every rank. Returns {"events": in time order, each {"unit", "pass"
    ("forward" or "backward"), "action" ("gather", "compute", "reduce-scatter" or "free"),
    "start_ms", "end_ms" (from the step's start), "live_start", "live_end" (bytes)}, "memory":
    [(ms, bytes live)] at the step's start and at each allocation and free, "peak": bytes,
    "units": the units' names in forward order}. A unit's "compute" is the time between its
    gather and its next action (the free in forward, the reduce-scatter in backward). The
    times are taken under the profiler, which slows every operation: their order and shares
    are the step's, their sum is more than its time (`time_steps` measures that).
    """
    trace, step, _ = traced_steps(rank, world_size, replace(run, optimizer="zero3"))
    ms = lambda time_ns: (time_ns - step.start_ns) / 1e6  # noqa: E731 - a unit conversion
    events = []
    for r in trace.ranges:
        words = r.name.split()
        if not (step.contains(r.start_ns) and words[0] in ("gather", "reduce-scatter", "free")):
            continue
        action, unit = words[0], words[-1]
        events.append({"unit": unit, "pass": "backward" if action == "reduce-scatter" else words[1],
                       "action": action, "start_ns": r.start_ns, "end_ns": r.end_ns})
    for gather in [e for e in events if e["action"] == "gather"]:
        after = min((e for e in events if (e["unit"], e["pass"]) == (gather["unit"], gather["pass"])
                     and e["start_ns"] >= gather["end_ns"]), key=lambda e: e["start_ns"])
        events.append({**gather, "action": "compute", "start_ns": gather["end_ns"],
                       "end_ns": after["start_ns"]})
    events.sort(key=lambda e: (e["start_ns"], e["end_ns"]))
    rows = [{"unit": e["unit"], "pass": e["pass"], "action": e["action"],
             "start_ms": ms(e["start_ns"]), "end_ms": ms(e["end_ns"]),
             "live_start": trace.live_at(e["start_ns"]), "live_end": trace.live_at(e["end_ns"])}
            for e in events]
    units = list(dict.fromkeys(row["unit"] for row in rows if row["pass"] == "forward"))
    return {"events": rows, "units": units, "peak": trace.peak(step.start_ns, step.end_ns)[0],
            "memory": [(ms(t), live) for t, live in trace.series(step.start_ns, step.end_ns)]}


def stage3_units(run: ZeroRun = MEMORY_RUN) -> list[tuple[str, int]]:
    """(name, trainable parameters) of each unit Zero3Optimizer gathers for `run`'s model, in
    forward order: what `memory.stage3_step` models (lesson 78a)."""
    model = run_model(run)
    names = {id(module): name for name, module in model.named_modules()}
    return [(names[id(unit)], sum(p.numel() for p in unit.parameters() if p.requires_grad))
            for unit in default_units(model)]


# What the command prints, in each language of --lang (`language.fill`: numbers by the Persian
# rule in Persian).
SAY = {
    "en": {"title": "lesson 78: ZeRO-1 on {ranks} ranks, MLP with {params} parameters (padded by "
                    "{padding} to {shard} per rank), Adam lr {lr}",
           "stage_title": "lesson 78: {stage} on {ranks} ranks, MLP with {params} parameters, Adam "
                          "lr {lr}",
           "step": "  step {step:2d}  loss {loss:.4f}",
           "identical": "parameters identical on all ranks after every step: {identical}",
           "header": "bytes per rank   parameters  gradients  optimizer (DDP)  optimizer (ZeRO-1)  "
                     "12 x shard",
           "row": "  rank {rank}        {parameters:10d} {gradients:10d} {ddp:16d} {zero:19d} "
                  "{formula:11d}",
           "formula": "one step of a MiniGPT with {parameters} parameters, bytes per rank: formula "
                      "{formula:,.0f} (parameters, gradients, optimizer state)",
           "peak": "  rank {rank}  measured peak {peak:,} (during {peak_in}), activations "
                   "{activations:,}"},
    "fa": {"title": "درس ۷۸: ZeRO-1 روی {ranks} رتبه، MLP با {params} پارامتر (با {padding} عنصر "
                    "پدینگ، {shard} عنصر برای هر رتبه)، Adam با نرخ یادگیری {lr}",
           "stage_title": "درس ۷۸: {stage} روی {ranks} رتبه، MLP با {params} پارامتر، Adam با نرخ "
                          "یادگیری {lr}",
           "step": "  گام {step}  زیان {loss:.4f}",
           "identical": "پارامترها پس از هر گام در همهٔ رتبه‌ها یکسان‌اند: {identical}",
           "header": "بایت در هر رتبه: پارامترها، گرادیان‌ها، بهینه‌ساز (DDP)، بهینه‌ساز (ZeRO-1)، "
                     "۱۲ × شارد",
           "row": "  رتبهٔ {rank}: {parameters}، {gradients}، {ddp}، {zero}، {formula}",
           "formula": "یک گام MiniGPT با {parameters} پارامتر، بایت در هر رتبه: فرمول {formula:,.0f} "
                      "(پارامترها، گرادیان‌ها، وضعیت بهینه‌ساز)",
           "peak": "  رتبهٔ {rank}: بیشینهٔ اندازه‌گیری‌شده {peak:,} (در {peak_in})، فعال‌سازی‌ها "
                   "{activations:,}"},
}
PHASE_WORDS = {"forward": "گذر رفت", "backward": "گذر برگشت", "optimizer": "بهینه‌ساز", "step": "گام"}


def say(key: str, lang: str, **values) -> str:
    """Line `key` of SAY in `lang`, filled with `values` (`language.fill`)."""
    return language.fill(SAY[language.check_language(lang)][key], lang, **values)


def main(argv: list[str] | None = None) -> int:
    """The lesson's demo: an MLP trained 20 steps on N ranks with ZeRO-1 (or --optimizer);
    losses, then memory."""
    args = cli_args.lab_arguments(argv, "zero_lab", main.__doc__, steps=20,
                                  batch_size=ZeroRun().batch_size,
                                  choices={"optimizer": ("zero", "zero2", "zero3")})
    if args.optimizer != "zero":
        return show_stage(args.optimizer, args.steps, args.world_size, args.lang)
    run = ZeroRun(steps=args.steps)
    results = launch.run(train_on_rank, run, world_size=args.world_size)
    zero = launch.run(memory_profile, run, world_size=args.world_size)
    ddp = launch.run(memory_profile, replace(run, optimizer="ddp"), world_size=args.world_size)
    if not launch.is_reporting_process():
        return 0
    n, first, lang = len(results), results[0], args.lang
    print(say("title", lang, ranks=n, params=first["params"].numel(), padding=first["padding"],
              shard=first["shard_numel"], lr=run.lr))
    for step, loss in enumerate(first["losses"]):
        print(say("step", lang, step=step, loss=loss))
    identical = all(r["digests"] == first["digests"] for r in results)
    print(say("identical", lang, identical=identical))
    print(say("header", lang))
    for z, d in zip(zero, ddp):
        print(say("row", lang, rank=z["rank"], parameters=z["parameters"], gradients=z["gradients"],
                  ddp=d["optimizer"], zero=z["optimizer"], formula=12 * first["shard_numel"]))
    return 0 if identical else 1


def show_stage(optimizer: str, steps: int, world_size: int, lang: str = "en") -> int:
    """The demo under ZeRO-2 or ZeRO-3: the MLP's losses, then the measured peak memory of a
    step of MEMORY_RUN's MiniGPT beside the formula, per rank; printed in `lang`."""
    stage = {name: stage for stage, name in STAGE_OPTIMIZERS.items()}[optimizer]
    results = launch.run(train_on_rank, ZeroRun(steps=steps, optimizer=optimizer),
                         world_size=world_size)
    peaks = launch.run(peak_memory, replace(MEMORY_RUN, optimizer=optimizer), world_size=world_size)
    if not launch.is_reporting_process():
        return 0
    print(say("stage_title", lang, stage=stage, ranks=len(results),
              params=results[0]["params"].numel(), lr=ZeroRun().lr))
    for step, loss in enumerate(results[0]["losses"]):
        print(say("step", lang, step=step, loss=loss))
    identical = all(r["digests"] == results[0]["digests"] for r in results)
    print(say("identical", lang, identical=identical))
    parameters = count_parameters(run_model(MEMORY_RUN))
    formula = memory.total_bytes(stage, parameters, len(peaks), memory.FP32_MASTER_ADAM)
    print(say("formula", lang, parameters=parameters, formula=formula))
    for row in peaks:
        peak_in = PHASE_WORDS.get(row["peak_in"], row["peak_in"]) if lang == "fa" else row["peak_in"]
        print(say("peak", lang, rank=row["rank"], peak=row["peak"], peak_in=peak_in,
                  activations=row["activations"]))
    return 0 if identical else 1


if __name__ == "__main__":
    raise SystemExit(main())

"""What lesson 79 runs: one pipelined step, its references, torch's pipelining, the bubble.

The notebook, tests and command run these rank functions through `launch.spawn` (or torchrun).
A `PipeRun` says what to run; `reference_step` is the unsplit model on the whole batch in one
process, and `torch_pipelining_step` the same split under torch.distributed.pipelining;
`fsdp_pipeline_step` runs torch's pipeline over FSDP2-sharded stages on a data x pipeline grid;
`train_after_flush` finishes each step with the whole model's gradient clipping, each stage's
optimizer step and the loss broadcast to every stage. The algorithm itself is
`lesson_code.pipeline`.

    python -m lesson_code.pipeline_lab                  # 4 stages, GPipe and 1F1B, checked
    python -m lesson_code.pipeline_lab --world-size 2
    python -m lesson_code.pipeline_lab --lang fa       # the same, reported in Persian
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.utils.checkpoint
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from lesson_code import language
from lesson_code.collectives.comm import Communicator
from lesson_code.collectives.ledger import CommLedger
from lesson_code.runtime.devices import current_device
from lesson_code.experiment import RunConfig
from lesson_code.harness.timing import PhaseClock
from lesson_code.models import GPTConfig, as_layers, build_model, loss_function
from lesson_code.pipeline import (SCHEDULES, PipelineStage, bubble_fraction, gpipe_step,
                                  ideal_timeline, imbalance_floor, partition_layers,
                                  schedule_order, split_micro_batches)
from lesson_code.harness.validate import require_choice, require_positive_int


# The lesson's wide MiniGPT: 6 blocks of width 256, enough compute per micro-batch to time.
WIDE_GPT = GPTConfig(n_embd=256, n_layer=6, n_head=8, context=32)
# GPT-3's shape (Brown et al., 2020), for the lesson's modelled sizes at scale.
GPT3 = {"parameters": 175e9, "layers": 96, "width": 12288, "tokens": 2048}


def layer_activation_bytes(tokens: int, width: int, sequences: int = 1) -> float:
    """Bytes of activations one transformer layer keeps from its forward to its backward, for a
    micro-batch of `sequences` sequences of `tokens` tokens and width `width`: 34 s b h, the
    model of Korthikanti et al. (2023, "Reducing activation recomputation in large transformer
    models") for 16-bit training without tensor parallelism when the attention matrix is
    recomputed rather than stored. A model, not a measurement."""
    return 34 * tokens * sequences * width


@dataclass(frozen=True)
class PipeRun(RunConfig):
    """One pipelined run: a `RunConfig` with a schedule, micro-batches and an optional partition.

    `steps` counts the steps `timed_steps` runs (the first `warmup` warm up, the rest are measured);
    `partition` gives the layers per stage (balanced by parameters when None). Raises ValueError
    for an unknown schedule, a micro-batch count below 1 or a partition entry below 1.
    """

    model: str = "gpt"
    steps: int = 2
    schedule: str = "1f1b"
    micro_batches: int = 4
    partition: tuple[int, ...] | None = None

    def __post_init__(self):
        super().__post_init__()
        require_choice("schedule", self.schedule, SCHEDULES)
        require_positive_int("micro_batches", self.micro_batches,
                             f"a divisor of the batch size {self.batch_size}")
        for layers in self.partition or ():
            require_positive_int("every entry of partition", layers, "the layers of each stage")


def stage_module(run: PipeRun, stage: int, num_stages: int) -> tuple[nn.Module, tuple[int, int]]:
    """This stage's layers as one module, and its [start, end) layer range.

    The whole model is built from the seed, so the stage's weights equal the unsplit model's,
    and all other layers are dropped: the rank keeps only its stage. (At scale one would build
    on the meta device and load just the stage's weights.)
    """
    layers = as_layers(build_model(run.model, run.seed, run.gpt, current_device()))
    bounds = partition_layers(layers, num_stages, list(run.partition) if run.partition else None)
    start, end = bounds[stage]
    return nn.Sequential(*layers[start:end]), (start, end)


def held_activation_bytes(run: PipeRun, stage: int, num_stages: int, schedule: str,
                          recompute: bool = False) -> dict[str, int]:
    """Measured bytes one stage keeps for its pending backwards, running its schedule alone.

    Runs stage `stage` (not the first, whose input is token ids) of `num_stages` in one process,
    on random activations of the micro-batch's shape, in `schedule_order`'s order; a backward is
    fed a gradient of ones, since only memory is counted here. Every tensor a forward saves for
    its backward passes through `torch.autograd.graph.saved_tensors_hooks` and is counted once
    per storage, the stage's weights not at all, and so is the stage's output, which the stage
    keeps to call `backward` on it (as `PipelineStage` and torch's stage do; Megatron-LM frees
    its data after the send); a micro-batch's bytes are held from its forward to its backward.
    With `recompute`, each forward runs under `torch.utils.checkpoint` (re-materialization, the
    reentrant variant, `use_reentrant=True`): only the stage's input is saved, besides the
    output, and the backward runs the forward again, whose saved tensors (counted by the same
    hooks) are all alive, on top of what the stage holds, when the recomputation ends, then
    freed as that backward proceeds; a storage the stage already holds (the rerun saves the
    input again) is not counted twice. Returns
    "held_bytes" (the most held between passes), "peak_bytes" (the most alive at once: the held
    bytes plus, during a backward, the micro-batch it rebuilds), "micro_batch_bytes" (one
    micro-batch's held bytes) and "forwards" (how many times the stage's forward ran,
    recomputations included).
    """
    if not 0 < stage < num_stages:
        raise ValueError(f"stage {stage!r}: pass a stage from 1 to {num_stages - 1} (stage 0's input "
                         f"is token ids, not an activation that can be re-materialized)")
    module, _ = stage_module(run, stage, num_stages)
    weights = {param.untyped_storage().data_ptr() for param in module.parameters()}
    forwards = []
    module.register_forward_pre_hook(lambda *_: forwards.append(1))
    shape = (run.batch_size // run.micro_batches, run.gpt.context, run.gpt.n_embd)
    saved: dict[int, int] = {}  # storage -> bytes, for the forward running now
    skipped = weights  # storages pack does not count: the weights, and during a backward the held

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in skipped:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    outputs, held, first, most_held, peak = {}, {}, 0, 0, 0  # held: micro-batch -> its `saved`
    for kind, index in schedule_order(schedule, stage, num_stages, run.micro_batches):
        saved.clear()
        live = sum(sum(storages.values()) for storages in held.values())
        if kind == "B":
            output = outputs.pop(index)
            skipped = weights.union(*held.values())  # alive already, counted in `live`
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
                output.backward(torch.ones_like(output))  # frees what the forward saved
            skipped = weights
            peak = max(peak, live + sum(saved.values()))  # a recomputed forward saved these
            del held[index]
            continue
        x = torch.randn(shape, generator=torch.Generator().manual_seed(index)).to(current_device())
        x.requires_grad_(True)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            outputs[index] = (torch.utils.checkpoint.checkpoint(module, x, use_reentrant=True)
                              if recompute else module(x))
        output_storage = outputs[index].untyped_storage()
        saved[output_storage.data_ptr()] = output_storage.nbytes()  # once, if autograd saved it too
        held[index], first = dict(saved), first or sum(saved.values())
        live += sum(saved.values())
        most_held, peak = max(most_held, live), max(peak, live)
    return {"held_bytes": most_held, "peak_bytes": peak, "micro_batch_bytes": first,
            "forwards": len(forwards)}


def build_stage(run: PipeRun, comm: Communicator) -> tuple[PipelineStage, tuple[int, int]]:
    """The pipeline stage of this rank of `comm`'s group, and its [start, end) layer range."""
    module, bounds = stage_module(run, comm.rank, comm.world_size)
    return PipelineStage(module, comm, loss_function(run.model)), bounds


def layer_gradients(module: nn.Module, first_layer: int,
                    sharded: bool = False) -> dict[str, torch.Tensor]:
    """Gradients keyed by the parameter's name in the *unsplit* layer list ("3.attn.qkv.weight").

    With `sharded` (FSDP's gradients are DTensors), each is gathered whole: a collective over
    the ranks that share it.
    """
    return {_unsplit_name(name, first_layer): param.grad.full_tensor() if sharded
            else param.grad.clone() for name, param in module.named_parameters()}


def layer_weights(module: nn.Module, first_layer: int) -> dict[str, torch.Tensor]:
    """A copy of the weights, keyed by the parameter's name in the unsplit layer list."""
    return {_unsplit_name(name, first_layer): param.detach().clone()
            for name, param in module.named_parameters()}


def _unsplit_name(name: str, first_layer: int) -> str:
    """"1.attn.qkv.weight" of a stage that starts at layer 2 is "3.attn.qkv.weight"."""
    index, rest = name.split(".", 1)
    return f"{first_layer + int(index)}.{rest}"


def reference_step(run: PipeRun) -> dict:
    """The unsplit model, one process, the whole batch: loss and every layer's gradients.

    Compute it with `reference.in_one_rank`, so that it runs with the ranks' thread count.
    """
    layers = nn.Sequential(*as_layers(build_model(run.model, run.seed, run.gpt, current_device())))
    x, y = run.batch(0)
    loss = loss_function(run.model)(layers(x), y)
    loss.backward()
    return {"loss": loss.item(), "grads": layer_gradients(layers, 0)}


def pipeline_step(rank: int, world_size: int, run: PipeRun) -> dict:
    """One training step of our pipeline, one stage per rank of the default group.

    Collective: call on every rank. Returns this stage's gradients (named as in the unsplit
    model), its layer range, the loss (last stage), its timed events, peak stored activations,
    the most bytes it kept only for sends in flight (`PipelineStats.peak_sent_bytes`), and its traffic as the ledger counted it ({"calls", "bytes_sent", "bytes_received", ...}).
    """
    comm = run.communicator(CommLedger())
    stage, (start, end) = build_stage(run, comm)
    x, y = run.batch(0)
    stats = stage.train_step(x, y, run.micro_batches, run.schedule)
    return {"grads": layer_gradients(stage.layers, start), "layers": (start, end),
            "loss": stats.loss, "events": stats.events, "peak_stored": stats.peak_stored,
            "peak_sent_bytes": stats.peak_sent_bytes, "traffic": comm.ledger.totals()["pipeline"]}


def simple_pipeline_step(rank: int, world_size: int, run: PipeRun) -> dict:
    """One step of `pipeline.gpipe_step`, the stage without bookkeeping, on MiniGPT (GPipe).

    Collective: call on every rank. Returns this stage's gradients (named as in the unsplit
    model) and the loss (last stage; None elsewhere). Raises ValueError for a model other than
    "gpt", whose every activation between stages has the shape (sequences, context, width).
    """
    if run.model != "gpt":
        raise ValueError(f"model={run.model!r}: gpipe_step needs one activation shape between "
                         "every two stages; pass model='gpt'")
    module, (start, _) = stage_module(run, rank, world_size)
    x, y = run.batch(0)
    shape = (run.batch_size // run.micro_batches, run.gpt.context, run.gpt.n_embd)
    loss = gpipe_step(module, loss_function(run.model), x, y, run.micro_batches, shape)
    return {"grads": layer_gradients(module, start), "loss": loss}


def ours_and_torch_steps(rank: int, world_size: int, runs: list[PipeRun]) -> list[dict]:
    """For each run, {"ours": `pipeline_step`, "torch": `torch_pipelining_step`}, in one launch.

    Collective: call on every rank."""
    return [{"ours": pipeline_step(rank, world_size, run),
             "torch": torch_pipelining_step(rank, world_size, run)} for run in runs]


def torch_pipelining_step(rank: int, world_size: int, run: PipeRun) -> dict:
    """The same step with torch.distributed.pipelining (PipelineStage, ScheduleGPipe/1F1B).

    Collective: call on every rank. Returns this stage's gradients and, on the last stage, the
    mean loss over micro-batches (torch scales the gradients by 1/m where our pipeline divides
    the loss by m).
    """
    from torch.distributed.pipelining import PipelineStage as TorchStage

    module, (start, _) = stage_module(run, rank, world_size)
    stage = TorchStage(module, rank, world_size, current_device())
    schedule = _torch_schedule(run.schedule)(stage, run.micro_batches,
                                             loss_fn=loss_function(run.model))
    x, y = run.batch(0)  # the whole batch: the schedule cuts the micro-batches
    losses = step_torch_schedule(schedule, x, y, rank == 0, rank == world_size - 1)
    loss = sum(l.item() for l in losses) / len(losses) if losses else None
    return {"grads": layer_gradients(module, start), "loss": loss}


def _torch_schedule(schedule: str):
    """torch's class for one of `pipeline.SCHEDULES`."""
    from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe

    return ScheduleGPipe if schedule == "gpipe" else Schedule1F1B


def step_torch_schedule(schedule, x: torch.Tensor, y: torch.Tensor, first: bool,
                        last: bool) -> list[torch.Tensor]:
    """One `schedule.step` as torch wants it: the inputs on the first stage, the targets on the
    last; returns the last stage's micro-batch losses (empty elsewhere)."""
    losses: list[torch.Tensor] = []
    schedule.step(*([x] if first else []), **({"target": y, "losses": losses} if last else {}))
    return losses


class CollectiveCounter(TorchDispatchMode):
    """Counts the communication ops this rank calls while active, by torch's op name (c10d's
    `_allgather_base_`, `_reduce_scatter_base_`, `send`, ...); `count` adds them up."""

    def __init__(self):
        super().__init__()
        self.calls: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "c10d":
            self.calls[func.__name__] = self.calls.get(func.__name__, 0) + 1
        return func(*args, **(kwargs or {}))

    def count(self, kind: str) -> int:
        """Calls whose op name contains `kind` ("allgather", "reduce_scatter", "send", ...)."""
        return sum(n for name, n in self.calls.items() if kind in name)


def fsdp_pipeline_step(rank: int, world_size: int, run: PipeRun, data_parallel: int,
                       reshard_after_forward: bool) -> dict:
    """One step of torch's pipeline over FSDP2 stages, on a `data_parallel` x pipeline grid.

    Collective: call on every rank. The grid is `torch.arange(world).view(dp, pp)`, as in
    `pipeline_exercises.data_and_pipeline_step`, built as a DeviceMesh ("dp", "pp"). Every
    layer of this rank's stage that has parameters is one FSDP unit (`fully_shard` over the
    rank's column, with `reshard_after_forward`), and so is the stage; torch's ScheduleGPipe or
    Schedule1F1B drives the stage, which turns FSDP's gradient reduction off for every micro-batch's backward and
    reduce-scatters once after the last (PipelineStage.backward_maybe_with_nosync and
    perform_reduce_grad). Returns the collectives counted during the step, the gradient
    elements this rank keeps against its stage's parameter count, and the stage's gradients
    (gathered whole after the count), named as in the unsplit model. Raises ValueError unless
    `data_parallel` divides the world size.
    """
    require_positive_int("data_parallel", data_parallel, f"a divisor of {world_size}")
    if world_size % data_parallel:
        raise ValueError(f"data_parallel={data_parallel} does not divide the world size "
                         f"{world_size}: use a divisor of {world_size}")
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.pipelining import PipelineStage as TorchStage

    pipeline_size = world_size // data_parallel
    mesh = init_device_mesh(current_device().type, (data_parallel, pipeline_size),
                            mesh_dim_names=("dp", "pp"))
    replica, stage_index = mesh["dp"].get_local_rank(), mesh["pp"].get_local_rank()
    layers = as_layers(build_model(run.model, run.seed, run.gpt, current_device()))
    start, end = partition_layers(layers, pipeline_size,
                                  list(run.partition) if run.partition else None)[stage_index]
    x, y = run.local_batch(0, replica, data_parallel)
    # Without example tensors, torch 2.13 infers a stage's shapes inside the first step(), by a
    # real forward and backward of the first micro-batch, whose gathers the counter below would
    # count with the step's. Given one micro-batch's input and output (computed here by the
    # unsplit layers), the stage takes its shapes from them and the step runs only the schedule.
    module = nn.Sequential(*layers[start:end])
    with torch.no_grad():
        inputs = nn.Sequential(*layers[:start])(split_micro_batches(x, run.micro_batches)[0])
        outputs = module(inputs)
    units = [layer for layer in module if any(True for _ in layer.parameters())]
    for unit in [*units, module]:
        fully_shard(unit, mesh=mesh["dp"], reshard_after_forward=reshard_after_forward)
    stage = TorchStage(module, stage_index, pipeline_size, current_device(),
                       input_args=inputs.requires_grad_(inputs.is_floating_point()),
                       output_args=outputs.requires_grad_(), group=mesh["pp"].get_group())
    schedule = _torch_schedule(run.schedule)(stage, run.micro_batches,
                                             loss_fn=loss_function(run.model))
    with CollectiveCounter() as counter:
        step_torch_schedule(schedule, x, y, stage_index == 0, stage_index == pipeline_size - 1)
    return {"replica": replica, "stage": stage_index, "units": len(units),
            "all_gathers": counter.count("allgather"),
            "reduce_scatters": counter.count("reduce_scatter"),
            "gradient_elements_kept": sum(p.grad.to_local().numel() for p in module.parameters()),
            "stage_parameters": sum(p.numel() for p in module.parameters()),
            "grads": layer_gradients(module, start, sharded=True)}


def timed_steps(rank: int, world_size: int, run: PipeRun, warmup: int = 1) -> dict:
    """Run `run.steps` pipelined steps; the bubble of each after the first `warmup`, and its median.

    Collective: call on every rank. Every step starts on all ranks together (`PhaseClock`), and
    after each step (outside its timing) the events of all stages are gathered, so every rank
    returns the same figures: "bubbles" (one per measured step), "bubble" (their median, which
    one slow step cannot move), "floor" (the median `imbalance_floor`, the least bubble these
    stages' unequal busy times allow), "events" (those of the measured step of median length,
    the lower middle one for an even count, for a Gantt chart: one disturbed step cannot be the
    one drawn), "events_step" (that step's index in "bubbles"), "steps_seconds" (every measured
    step's length) and their median "step_seconds". With `run.steps <= warmup` the last step is
    measured anyway.
    """
    stage, _ = build_stage(run, run.communicator())
    x, y = run.batch(0)
    clock, measured = PhaseClock(), []
    for index in range(run.steps):
        stage.layers.zero_grad()
        clock.start()
        stats = stage.train_step(x, y, run.micro_batches, run.schedule)
        clock.stop()
        gathered: list = [None] * world_size
        dist.all_gather_object(gathered, stats.events)
        if index >= warmup or index == run.steps - 1:
            measured.append([event for stage_events in gathered for event in stage_events])
    step_seconds = clock.samples["step"][-len(measured):]
    bubbles = [bubble_fraction(events, world_size) for events in measured]
    drawn = sorted(range(len(measured)), key=step_seconds.__getitem__)[(len(measured) - 1) // 2]
    origin = min(event[3] for event in measured[drawn])  # perf_counter: one clock for local ranks
    events = [(s, i, kind, begin - origin, end - origin) for s, i, kind, begin, end in measured[drawn]]
    floor = statistics.median(imbalance_floor(events, world_size) for events in measured)
    return {"events": events, "events_step": drawn, "bubble": statistics.median(bubbles), "bubbles": bubbles,
            "floor": floor, "peak_stored": stats.peak_stored, "steps_seconds": step_seconds,
            "step_seconds": statistics.median(step_seconds)}


def timed_sweep(rank: int, world_size: int, runs: list[PipeRun], warmup: int = 1) -> list[dict]:
    """`timed_steps` for each run in turn (one launch for a whole sweep of m). Collective."""
    return [timed_steps(rank, world_size, run, warmup) for run in runs]


def fsdp_pipeline_steps(rank: int, world_size: int, run: PipeRun, data_parallel: int,
                        settings: tuple[bool, ...] = (False, True)) -> list[dict]:
    """`fsdp_pipeline_step` for each `reshard_after_forward` in `settings`, in one launch."""
    return [fsdp_pipeline_step(rank, world_size, run, data_parallel, reshard_after_forward)
            for reshard_after_forward in settings]


def simple_pipeline_steps(rank: int, world_size: int, runs: list[PipeRun]) -> list[dict]:
    """`simple_pipeline_step` for each run in turn (one launch for many checks). Collective."""
    return [simple_pipeline_step(rank, world_size, run) for run in runs]


def pipeline_steps(rank: int, world_size: int, runs: list[PipeRun]) -> list[dict]:
    """`pipeline_step` for each run in turn (one launch for many checks). Collective."""
    return [pipeline_step(rank, world_size, run) for run in runs]


def max_grad_diff(results: list[dict], reference: dict) -> float:
    """Largest |gradient difference| from `reference` over the "grads" of all `results`."""
    return max((grad - reference["grads"][name]).abs().max().item()
               for stage in results for name, grad in stage["grads"].items())


def compare_with_reference(results: list[dict], reference: dict) -> dict[str, float]:
    """Largest |gradient difference| over all stages, |loss difference|, and layer coverage."""
    covered = sorted(name for stage in results for name in stage["grads"])
    return {"max_grad_diff": max_grad_diff(results, reference),
            "loss_diff": abs(results[-1]["loss"] - reference["loss"]),
            "all_layers_once": covered == sorted(reference["grads"])}


def train_after_flush(rank: int, world_size: int, run: PipeRun, max_norm: float,
                      norm_over: str = "pipeline", lr: float = 0.1) -> dict:
    """`run.steps` steps of our pipeline, each finished as the unsplit model's: clip by the whole
    model's norm (one all-reduce of each stage's sum of squares), step each stage's SGD, and
    broadcast the last stage's loss. Collective: call on every rank. Returns the losses and norms
    (the same on every rank) and this stage's weights, named as in the unsplit model.
    `norm_over="stage"` skips the all-reduce: the mistake of clipping each stage by its own norm.
    """
    require_choice("norm_over", norm_over, ("pipeline", "stage"))
    comm = run.communicator()
    stage, (start, _) = build_stage(run, comm)
    optimizer = torch.optim.SGD(stage.layers.parameters(), lr=lr)
    losses, norms = [], []
    for step in range(run.steps):
        x, y = run.batch(step)
        optimizer.zero_grad()
        stats = stage.train_step(x, y, run.micro_batches, run.schedule)
        grads = [param.grad for param in stage.layers.parameters()]
        squares = torch.stack([grad.double().pow(2).sum() for grad in grads]).sum()
        if norm_over == "pipeline":
            dist.all_reduce(squares, group=comm.group)  # this stage's share of the norm, summed
        norm = squares.sqrt()
        scale = (max_norm / (norm + 1e-6)).clamp(max=1.0)
        for grad in grads:
            grad.mul_(scale.to(grad.dtype))
        optimizer.step()
        loss = torch.tensor(stats.loss if stage.is_last else 0.0, dtype=torch.float64,
                            device=current_device())
        dist.broadcast(loss, group=comm.group, group_src=comm.world_size - 1)
        losses.append(loss.item())
        norms.append(norm.item())
    return {"losses": losses, "norms": norms, "weights": layer_weights(stage.layers, start)}


def reference_train(run: PipeRun, max_norm: float, lr: float = 0.1) -> dict:
    """`train_after_flush` on the unsplit model in one process: `clip_grad_norm_`, then SGD.

    Compute it with `reference.in_one_rank`, so that it runs with the ranks' thread count.
    """
    layers = nn.Sequential(*as_layers(build_model(run.model, run.seed, run.gpt, current_device())))
    optimizer = torch.optim.SGD(layers.parameters(), lr=lr)
    losses, norms = [], []
    for step in range(run.steps):
        x, y = run.batch(step)
        optimizer.zero_grad()
        loss = loss_function(run.model)(layers(x), y)
        loss.backward()
        norms.append(nn.utils.clip_grad_norm_(layers.parameters(), max_norm).item())
        optimizer.step()
        losses.append(loss.item())
    return {"losses": losses, "norms": norms, "weights": layer_weights(layers, 0)}


# What lesson 79 prints (the command's report) in each edition, filled by `language.fill`.
SAY = {
    "en": {"title": "lesson 79: MiniGPT on {stages} pipeline stages vs the unsplit model",
           "row": "  {schedule:5s} m={m}: max |grad diff| {grad_diff:.1e}, |loss diff| "
                  "{loss_diff:.1e}, activations stored at most {stored}, bytes sent {sent} per stage"},
    "fa": {"title": "درس ۷۹: MiniGPT روی {stages} مرحلهٔ پایپلاین در برابر مدل تقسیم‌نشده",
           "row": "  {schedule} با m = {m}: بیشینهٔ |اختلاف گرادیان| {grad_diff:.1e}، |اختلاف زیان| "
                  "{loss_diff:.1e}، فعال‌سازی‌های نگه‌داشته در هر مرحله حداکثر {stored}، بایت‌های "
                  "فرستادهٔ هر مرحله {sent}"},
}
SCHEDULE_NAMES = {"gpipe": "GPipe", "1f1b": "1F1B"}


def message_delay(schedule: str, num_stages: int, micro_batches: int, forward: float,
                  backward: float, message: float, extra_warmup: int = 0) -> float:
    """How much longer `pipeline.ideal_timeline`'s step gets when every message between stages
    takes `message` instead of nothing (same units as `forward` and `backward`).

    GPipe waits for messages only while the pipeline fills and drains, 2 (P - 1) of them.
    In 1F1B's steady state, stage s (warmed up with k = P - 1 - s forwards) does k (f + b) of
    work between its F_j and its B_j, while B_j's input needs that plus 2 k messages: the loop
    through stage 0 adds 2 (P - 1) / P messages per micro-batch. `extra_warmup` gives slack
    between the last two stages only: it hides the messages of a short step, not of a long one.
    The model of lesson 79b's cluster section.
    """
    def span(delay: float) -> float:
        events = ideal_timeline(schedule, num_stages, micro_batches, forward, backward,
                                delay, extra_warmup)
        return max(event[4] for event in events) - min(event[3] for event in events)
    return span(message) - span(0.0)


def main(argv: list[str] | None = None) -> int:
    """Check both schedules on N stages against the unsplit model; print what each stage stored."""
    import argparse

    from lesson_code import launch
    from lesson_code.harness import cli_args
    from lesson_code.harness.reference import in_one_rank

    parser = argparse.ArgumentParser(prog="python -m lesson_code.pipeline_lab",
                                     description=main.__doc__)
    parser.add_argument("--world-size", type=cli_args.positive_int, default=4,
                        help="pipeline stages, one per rank")
    cli_args.add_language(parser)
    args = parser.parse_args(argv)
    layers = len(as_layers(build_model("gpt", 0, PipeRun().gpt)))
    cli_args.check_world_size(parser, args.world_size, layers,
                              f"each stage needs at least one of MiniGPT's {layers} layers")
    runs = [PipeRun(schedule=s, micro_batches=m) for s in SCHEDULES for m in (1, 2, 4, 8)]
    per_rank = launch.run(pipeline_steps, runs, world_size=args.world_size)
    if not launch.is_reporting_process():
        return 0
    ok = True
    print(language.fill(SAY[args.lang]["title"], args.lang, stages=args.world_size))
    for index, run in enumerate(runs):
        stages = [rank_results[index] for rank_results in per_rank]
        check = compare_with_reference(stages, in_one_rank(reference_step, run))
        ok &= check["max_grad_diff"] < 1e-5 and check["all_layers_once"]
        print(report_line(run, check, stages, args.lang))
    return 0 if ok else 1


def report_line(run: PipeRun, check: dict[str, float], stages: list[dict], lang: str = "en") -> str:
    """One line of the command's report in `lang`: the check against the reference, and each
    stage's peak stored activations and bytes sent."""
    schedule = SCHEDULE_NAMES[run.schedule] if lang == "fa" else run.schedule
    return language.fill(SAY[language.check_language(lang)]["row"], lang, schedule=schedule,
                         m=run.micro_batches, grad_diff=check["max_grad_diff"],
                         loss_diff=check["loss_diff"],
                         stored=[stage["peak_stored"] for stage in stages],
                         sent=[stage["traffic"]["bytes_sent"] for stage in stages])


if __name__ == "__main__":
    raise SystemExit(main())

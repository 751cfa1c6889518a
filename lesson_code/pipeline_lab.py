"""What lesson 79 runs: one pipelined step, its references, torch's pipelining, the bubble.

The notebook, tests and command run these rank functions through `launch.spawn` (or torchrun).
A `PipeRun` says what to run; `reference_step` is the unsplit model on the whole batch in one
process, and `torch_pipelining_step` the same split under torch.distributed.pipelining. The
algorithm itself is `lesson_code.pipeline`.

    python -m lesson_code.pipeline_lab                  # 4 stages, GPipe and 1F1B, checked
    python -m lesson_code.pipeline_lab --world-size 2
    python -m lesson_code.pipeline_lab --lang fa       # the same, reported in Persian
"""

from __future__ import annotations

import statistics
import traceback
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from lesson_code import language
from lesson_code.collectives.comm import Communicator
from lesson_code.collectives.ledger import CommLedger
from lesson_code.runtime.devices import current_device
from lesson_code.experiment import RunConfig, global_mean
from lesson_code.harness.timing import PhaseClock
from lesson_code.models import GPTConfig, as_layers, build_model, loss_function
from lesson_code.pipeline import (SCHEDULES, PipelineStage, bubble_fraction, imbalance_floor,
                                  partition_layers)
from lesson_code.harness.validate import require_choice, require_positive_int


# The lesson's wide MiniGPT: 6 blocks of width 256, enough compute per micro-batch to time.
WIDE_GPT = GPTConfig(n_embd=256, n_layer=6, n_head=8, context=32)


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


def build_stage(run: PipeRun, comm: Communicator) -> tuple[PipelineStage, tuple[int, int]]:
    """The pipeline stage of this rank of `comm`'s group, and its [start, end) layer range."""
    module, bounds = stage_module(run, comm.rank, comm.world_size)
    return PipelineStage(module, comm, loss_function(run.model)), bounds


def layer_gradients(module: nn.Module, first_layer: int) -> dict[str, torch.Tensor]:
    """Gradients keyed by the parameter's name in the *unsplit* layer list ("3.attn.qkv.weight")."""
    grads = {}
    for name, param in module.named_parameters():
        index, rest = name.split(".", 1)
        grads[f"{first_layer + int(index)}.{rest}"] = param.grad.clone()
    return grads


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
    and its traffic as the ledger counted it ({"calls", "bytes_sent", "bytes_received", ...}).
    """
    comm = run.communicator(CommLedger())
    stage, (start, end) = build_stage(run, comm)
    x, y = run.batch(0)
    stats = stage.train_step(x, y, run.micro_batches, run.schedule)
    return {"grads": layer_gradients(stage.layers, start), "layers": (start, end),
            "loss": stats.loss, "events": stats.events, "peak_stored": stats.peak_stored,
            "traffic": comm.ledger.totals()["pipeline"]}


def torch_pipelining_step(rank: int, world_size: int, run: PipeRun) -> dict:
    """The same step with torch.distributed.pipelining (PipelineStage, ScheduleGPipe/1F1B).

    Collective: call on every rank. Returns this stage's gradients and, on the last stage, the
    mean loss over micro-batches (torch scales gradients by 1/m, as our pipeline does).
    """
    from torch.distributed.pipelining import PipelineStage as TorchStage
    from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe

    module, (start, _) = stage_module(run, rank, world_size)
    stage = TorchStage(module, rank, world_size, current_device())
    schedule_class = ScheduleGPipe if run.schedule == "gpipe" else Schedule1F1B
    schedule = schedule_class(stage, run.micro_batches, loss_fn=loss_function(run.model))
    x, y = run.batch(0)
    losses: list[torch.Tensor] = []
    if rank == 0:
        schedule.step(x)
    elif rank == world_size - 1:
        schedule.step(target=y, losses=losses)
    else:
        schedule.step()
    loss = sum(l.item() for l in losses) / len(losses) if losses else None
    return {"grads": layer_gradients(module, start), "loss": loss}


def timed_steps(rank: int, world_size: int, run: PipeRun, warmup: int = 1) -> dict:
    """Run `run.steps` pipelined steps; the bubble of each after the first `warmup`, and its median.

    Collective: call on every rank. Every step starts on all ranks together (`PhaseClock`), and
    after each step (outside its timing) the events of all stages are gathered, so every rank
    returns the same figures: "bubbles" (one per measured step), "bubble" (their median, which
    one slow step cannot move), "floor" (the median `imbalance_floor`, the least bubble these
    stages' unequal busy times allow), "events" (the last step's, for a Gantt chart) and the
    median "step_seconds". With `run.steps <= warmup` the last step is measured anyway.
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
    origin = min(event[3] for event in measured[-1])  # perf_counter: one clock for local ranks
    events = [(s, i, kind, begin - origin, end - origin) for s, i, kind, begin, end in measured[-1]]
    floor = statistics.median(imbalance_floor(events, world_size) for events in measured)
    return {"events": events, "bubble": statistics.median(bubbles), "bubbles": bubbles,
            "floor": floor, "peak_stored": stats.peak_stored, "step_seconds": statistics.median(step_seconds)}


def timed_sweep(rank: int, world_size: int, runs: list[PipeRun], warmup: int = 1) -> list[dict]:
    """`timed_steps` for each run in turn (one launch for a whole sweep of m). Collective."""
    return [timed_steps(rank, world_size, run, warmup) for run in runs]


def pipeline_steps(rank: int, world_size: int, runs: list[PipeRun]) -> list[dict]:
    """`pipeline_step` for each run in turn (one launch for many checks). Collective."""
    return [pipeline_step(rank, world_size, run) for run in runs]


def compare_with_reference(results: list[dict], reference: dict) -> dict[str, float]:
    """Largest |gradient difference| over all stages, |loss difference|, and layer coverage."""
    worst = max((grad - reference["grads"][name]).abs().max().item()
                for stage in results for name, grad in stage["grads"].items())
    covered = sorted(name for stage in results for name in stage["grads"])
    return {"max_grad_diff": worst, "loss_diff": abs(results[-1]["loss"] - reference["loss"]),
            "all_layers_once": covered == sorted(reference["grads"])}


def data_and_pipeline_step(rank: int, world_size: int, run: PipeRun,
                           data_parallel: int) -> dict:
    """Exercise solution: a 2-D grid of `data_parallel` pipeline replicas of world/dp stages.

    Collective: call on every rank. Ranks form `torch.arange(world).view(dp, pp)` (as picotron
    and torchtitan do: the pipeline dimension varies fastest, so a replica's stages are
    neighbours). Each row is a process group that runs the pipeline on its share of the batch;
    then each stage averages its gradients with the same stage of the other replicas, inside its
    column's group (`run.comm`: lesson 76's ring by default). Returns this stage's gradients and
    the loss on the whole batch (the mean of the replicas' losses, on the last stages).
    """
    pipeline_size = world_size // data_parallel
    grid = torch.arange(world_size).view(data_parallel, pipeline_size)
    replica = rank // pipeline_size
    # Every rank creates every group, in the same order (a torch.distributed requirement).
    rows = [dist.new_group(grid[r].tolist()) for r in range(data_parallel)]
    columns = [dist.new_group(grid[:, s].tolist()) for s in range(pipeline_size)]
    pipeline, (start, _) = build_stage(run, run.communicator(group=rows[replica]))
    x, y = run.local_batch(0, replica, data_parallel)
    stats = pipeline.train_step(x, y, run.micro_batches, run.schedule)
    column = run.communicator(group=columns[pipeline.stage])
    for param in pipeline.layers.parameters():
        column.all_reduce(param.grad, op="avg")
    loss = global_mean(stats.loss, group=column.group) if pipeline.is_last else None
    return {"grads": layer_gradients(pipeline.layers, start), "replica": replica,
            "stage": pipeline.stage, "loss": loss}


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


def _refused_partition(facts: dict) -> str:
    if facts["num_stages"] > facts["count"]:
        return ("{num_stages} مرحله ولی فقط {count} لایه: هر مرحله دست‌کم یک لایه لازم دارد، پس "
                "حداکثر {count} مرحله (رتبه) به کار ببرید")
    return "تقسیم {partition} باید {num_stages} شمار مثبت از لایه‌ها بدهد که جمعشان {count} شود"


# Why lesson 79's functions refuse their arguments, in Persian, from the values each checked.
REFUSALS = {
    "partition_layers": _refused_partition,
    "split_micro_batches": lambda facts: ("{micro_batches} میکرودسته دستهٔ {size}تایی را به "
                                          "بخش‌های برابر تقسیم نمی‌کند: یکی از مقسوم‌علیه‌های {size} "
                                          "را به کار ببرید"),
}


def explain_refusal(error: ValueError, lang: str = "fa") -> str:
    """Why `pipeline.partition_layers` or `pipeline.split_micro_batches` refused its arguments,
    in `lang`: the error's message in English; in Persian a sentence made from the values the
    refusing function checked (the locals of the innermost frame of the error's traceback, the
    facts its English message states). Another error keeps its message."""
    frames = traceback.extract_tb(error.__traceback__) if error.__traceback__ else []
    if language.check_language(lang) == "en" or not frames or frames[-1].name not in REFUSALS:
        return str(error)
    innermost = error.__traceback__
    while innermost.tb_next is not None:
        innermost = innermost.tb_next
    facts = {name: value for name, value in innermost.tb_frame.f_locals.items()
             if _is_count(value) or isinstance(value, tuple) and all(map(_is_count, value))}
    return language.fill(REFUSALS[frames[-1].name](facts), "fa", **facts)


def _is_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


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

"""Lesson 79's exercise code and its companion page's (79a): the solutions of lesson 79's
exercise 2 (a refusal explained in the page's language) and exercise 4 (two neighbouring stages
that send to each other at once, with and without waiting for their sends), and of 79a's
exercise 1 (a grid of pipeline replicas, data parallelism across the pipelines) and exercise 3
(a pipeline whose first and last stage share a tied matrix, with the tied unsplit model to check
it against); and torch's schedules with several stages per rank (interleaved 1F1B and the
zero-bubble ones), their orders and the bubble those orders give on ideal stages.

The lesson's main line runs `lesson_code.pipeline_lab`; the cells that use this module run its
rank functions through the launcher, as the lesson does:

    from lesson_code import launch, pipeline_exercises
    launch.spawn(pipeline_exercises.tied_pipeline_step, PipeRun(micro_batches=4), world_size=2)
    launch.spawn(pipeline_exercises.neighbours_exchange, False, world_size=2)
    launch.spawn(pipeline_exercises.torch_virtual_stages_steps, PipeRun(), world_size=2)
"""

from __future__ import annotations

import itertools
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

from lesson_code import language
from lesson_code.experiment import global_mean
from lesson_code.harness.validate import require_choice
from lesson_code.models import as_layers, build_model, loss_function
from lesson_code.pipeline import partition_layers
from lesson_code.pipeline_lab import PipeRun, build_stage, layer_gradients
from lesson_code.runtime.devices import current_device


def tied_pipeline_step(rank: int, world_size: int, run: PipeRun) -> dict:
    """One step of our pipeline of MiniGPT, its head tied to its token embedding (79a, exercise 3).

    Collective: call on every rank. The first stage holds the embedding's copy of the matrix and
    the last stage the head's copy, given the embedding's values, as one tied matrix would be.
    Each copy's gradient after the flush is only its own use's share; one all-reduce over a group
    of just the first and the last stage adds the two, as the tied matrix's gradient is the sum.
    Returns this stage's gradients after that all-reduce ("grads") and before it ("own_grads"),
    named as in the unsplit layer list.
    """
    if run.model != "gpt":
        raise ValueError(f"model={run.model!r}: only MiniGPT has an embedding and a head to tie; use 'gpt'")
    comm = run.communicator()
    if comm.world_size < 2:
        raise ValueError(f"world_size={comm.world_size}: a tie between stages needs at least 2 stages")
    stage, (start, _) = build_stage(run, comm)
    embedding = as_layers(build_model(run.model, run.seed, run.gpt, current_device()))[0].tokens.weight
    ends = dist.new_group([0, comm.world_size - 1])  # collective: every rank creates it
    tied = None
    if stage.is_first:
        tied = stage.layers[0].tokens.weight
    elif stage.is_last:
        tied = stage.layers[-1].lm_head.weight
        with torch.no_grad():
            tied.copy_(embedding)
    x, y = run.batch(0)
    stage.train_step(x, y, run.micro_batches, run.schedule)
    own_grads = layer_gradients(stage.layers, start)
    if tied is not None:
        dist.all_reduce(tied.grad, group=ends)  # after the flush, before any clipping or step
    return {"grads": layer_gradients(stage.layers, start), "own_grads": own_grads}


def neighbours_exchange(rank: int, world_size: int, wait_for_send: bool,
                        timeout_s: float = 2.0) -> bool:
    """Lesson 79, exercise 4: neighbouring stages in 1F1B's steady state, at the moment rank 0 sends
    an activation to rank 1 while rank 1 sends a gradient back; each then receives the other's.

    Collective: call on 2 ranks. A gloo send completes only once the peer has posted the
    matching receive. With `wait_for_send`, each rank waits for its send before posting its
    receive, as a `_send` that waited would: neither send can complete, and the bounded wait
    raises TimeoutError naming the rank. Without, each posts its send, then waits for its
    receive and only then for its send, as `PipelineStage` does; returns whether the tensor
    received is the neighbour's."""
    if world_size != 2:
        raise ValueError(f"world_size={world_size}: the exchange is between 2 neighbours; run it "
                         "on 2 ranks")
    neighbour, timeout = 1 - rank, timedelta(seconds=timeout_s)
    mine = torch.full((4,), float(rank), device=current_device())  # an activation or a gradient
    theirs = torch.empty(4, device=current_device())
    send = dist.isend(mine, dst=neighbour)
    if wait_for_send:
        try:
            send.wait(timeout)
        except RuntimeError as error:
            raise TimeoutError(f"rank {rank} of 2 waited {timeout_s:g} s for its send to rank "
                               f"{neighbour}, which waits for its own send and so never posts "
                               "the receive") from error
    dist.irecv(theirs, src=neighbour).wait(timeout)
    send.wait(timeout)
    return bool((theirs == neighbour).all())


def tied_reference_step(run: PipeRun) -> dict:
    """`reference_step` of MiniGPT with its head's matrix the embedding's own parameter: the
    gradients of the tied model, the tied matrix's listed under both the embedding's name and
    the head's, as the two stages of `tied_pipeline_step` hold it.

    Compute it with `reference.in_one_rank`, so that it runs with the ranks' thread count.
    """
    layers = nn.Sequential(*as_layers(build_model(run.model, run.seed, run.gpt, current_device())))
    layers[-1].lm_head.weight = layers[0].tokens.weight
    x, y = run.batch(0)
    loss = loss_function(run.model)(layers(x), y)
    loss.backward()
    grads = layer_gradients(layers, 0)  # a shared parameter is named once, as the embedding's
    grads[f"{len(layers) - 1}.lm_head.weight"] = grads["0.tokens.weight"]
    return {"loss": loss.item(), "grads": grads}


def data_and_pipeline_step(rank: int, world_size: int, run: PipeRun,
                           data_parallel: int) -> dict:
    """79a, exercise 1: `data_parallel` replicas of a pipeline of world/dp stages, on a 2-D grid.

    Collective: call on every rank. Rank r sits at row r // pp (its replica) and column r % pp
    (its stage) of `torch.arange(world).view(dp, pp)`, as picotron orders them. Each row runs
    the pipeline on its share of the batch; then each stage averages its gradients over its
    column (`run.comm`: lesson 76's ring by default). Returns this stage's gradients and the
    loss on the whole batch (the mean of the replicas' losses, on the last stages).
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


def torch_order(schedule, rank: int) -> list[tuple[int, str, int]]:
    """The compute actions a torch schedule with several stages per rank runs on `rank`, in
    order (its `pipeline_order`, which its runtime executes): (stage, kind, micro-batch), kind
    "F" (forward), "B" (full backward), "I" (backward to the input only) or "W" (backward to the
    weights only). Idle time steps and the final gradient reduction are left out."""
    return [(action.stage_index, action.computation_type.value, action.microbatch_index)
            for action in schedule.pipeline_order[rank]
            if action is not None and action.computation_type.value in ("F", "B", "I", "W")]


def deferred_weight_grads(order: list[tuple[int, str, int]]) -> int:
    """How many weight gradients ("W") in a `torch_order` do not come right after the input
    gradient ("I") of their own stage and micro-batch: the ones a zero-bubble schedule moved
    later, into time the stage would otherwise spend idle."""
    return sum(kind == "W" and order[j - 1] != (stage, "I", micro)
               for j, (stage, kind, micro) in enumerate(order))


def modelled_events(orders: list[list[tuple[int, str, int]]],
                    virtual: int) -> list[tuple[int, int, str, int, float, float]]:
    """The actions of torch's `orders` (one `torch_order` per rank) on ideal stages with free
    messages, as (rank, stage, kind, micro-batch, start, end): each rank runs its order one
    action at a time, each as soon as its input exists; a rank's `virtual` stages share its
    layers equally, so a stage's forward, I and W each take 1 / virtual and a full backward
    2 / virtual (a backward twice a forward, split evenly between I and W).

    Forward i of stage s needs forward i of s - 1; the backward (B, or I) of s needs its own
    forward and the backward of s + 1; W needs its own I. Raises ValueError for orders that
    leave an action waiting forever."""
    cost = {"F": 1 / virtual, "B": 2 / virtual, "I": 1 / virtual, "W": 1 / virtual}
    last = max(stage for order in orders for stage, _, _ in order)
    done: dict[tuple[int, str, int], float] = {}  # (stage, F / B / W, micro-batch) -> end
    free, position = [0.0] * len(orders), [0] * len(orders)
    events = []
    while any(position[r] < len(order) for r, order in enumerate(orders)):
        moved = False
        for rank, order in enumerate(orders):
            while position[rank] < len(order):
                stage, kind, micro = order[position[rank]]
                needs = ([(stage - 1, "F", micro)] if kind == "F" and stage > 0 else [] if kind == "F"
                         else [(stage, "B", micro)] if kind == "W"
                         else [(stage, "F", micro)] + ([(stage + 1, "B", micro)] if stage < last else []))
                if any(need not in done for need in needs):
                    break
                start = max([free[rank]] + [done[need] for need in needs])
                free[rank] = start + cost[kind]
                done[(stage, "W" if kind == "W" else "F" if kind == "F" else "B", micro)] = free[rank]
                events.append((rank, stage, kind, micro, start, free[rank]))
                position[rank] += 1
                moved = True
        if not moved:
            raise ValueError(f"these orders deadlock: ranks stop at actions {position}")
    return events


def modelled_bubble(orders: list[list[tuple[int, str, int]]], virtual: int) -> float:
    """The idle fraction of the step that torch's `orders` give on ideal stages with free
    messages (`modelled_events`): 1 - busy / (ranks x step)."""
    return _idle_fraction(modelled_events(orders, virtual), len(orders))


def _idle_fraction(events: list[tuple[int, int, str, int, float, float]], ranks: int) -> float:
    """1 - busy / (ranks x step) of `modelled_events`' answer."""
    busy = sum(end - start for *_, start, end in events)
    return 1 - busy / (ranks * max(end for *_, end in events))


def modelled_peak_held(order: list[tuple[int, str, int]], virtual: int) -> float:
    """The most micro-batches of a rank's layers that `order` keeps activations of at once: a
    forward adds 1 / virtual, a whole backward (B) frees it, and a split backward frees it only
    at its W (the W still needs the layer's input and output gradient)."""
    change = {"F": 1 / virtual, "B": -1 / virtual, "I": 0.0, "W": -1 / virtual}
    return max(itertools.accumulate(change[kind] for _, kind, _ in order))


def compare_schedules(torch_orders: list[list[dict]], micro_batches: int):
    """Lesson 79a's comparison of the course's 1F1B with torch's schedules, on ideal stages with
    free messages: `torch_orders` is `torch_schedule_orders`' answer on every rank (2 stages
    each). Returns ({schedule: `modelled_events`}, a table with, per schedule, its stages per
    rank, modelled idle fraction, the most micro-batches of a rank's layers held on rank 0 and
    on the last rank (`modelled_peak_held`), and the boundaries between stages on two ranks that
    each micro-batch crosses each way)."""
    import pandas as pd

    from lesson_code.pipeline import schedule_order

    ranks = len(torch_orders)
    plain = [[(s, kind, i) for kind, i in schedule_order("1f1b", s, ranks, micro_batches)]
             for s in range(ranks)]
    runs = {"1F1B": (plain, 1, list(range(ranks)))}
    for k, first in enumerate(torch_orders[0]):
        rank_of = [rank for stage in range(2 * ranks) for rank, results in enumerate(torch_orders)
                   if stage in results[k]["stages"]]
        runs[first["schedule"]] = ([results[k]["order"] for results in torch_orders], 2, rank_of)
    events = {name: modelled_events(orders, v) for name, (orders, v, _) in runs.items()}
    table = pd.DataFrame({name: {
        "stages_per_rank": v, "modelled_idle": _idle_fraction(events[name], ranks),
        "held_on_rank_0": modelled_peak_held(orders[0], v),
        "held_on_last_rank": modelled_peak_held(orders[-1], v),
        "messages_each_way": sum(a != b for a, b in zip(rank_of, rank_of[1:]))}
        for name, (orders, v, rank_of) in runs.items()}).T.rename_axis("schedule")
    return events, table.astype({"stages_per_rank": int, "messages_each_way": int})


# torch's schedules that give each rank several stages, and where rank r's stages sit among
# world x virtual: interleaved ones loop over the ranks (r, r + world, ...), the V-shaped ZBV
# goes down the ranks and back up (r and 2 world - 1 - r; exactly two per rank).
VIRTUAL_SCHEDULES = ("ScheduleInterleaved1F1B", "ScheduleInterleavedZeroBubble",
                     "ScheduleZBVZeroBubble")


def virtual_stage_indices(schedule: str, rank: int, world_size: int, virtual: int) -> list[int]:
    """The stages rank `rank` holds under `schedule` (one of VIRTUAL_SCHEDULES)."""
    require_choice("schedule", schedule, VIRTUAL_SCHEDULES)
    if schedule == "ScheduleZBVZeroBubble":
        if virtual != 2:
            raise ValueError(f"ScheduleZBVZeroBubble places exactly 2 stages on each rank, "
                             f"not {virtual}: pass virtual=2")
        return [rank, 2 * world_size - 1 - rank]
    return [rank + k * world_size for k in range(virtual)]


def _virtual_schedule(name: str, rank: int, world_size: int, run: PipeRun, virtual: int):
    """torch's schedule `name` over this rank's `virtual` stages of the model cut into
    world_size x virtual stages: (schedule, {stage: module}, stage bounds, this rank's stages)."""
    import torch.distributed.pipelining as pipelining

    total = world_size * virtual
    layers = as_layers(build_model(run.model, run.seed, run.gpt, current_device()))
    bounds = partition_layers(layers, total)
    mine = virtual_stage_indices(name, rank, world_size, virtual)
    modules = {s: nn.Sequential(*layers[slice(*bounds[s])]) for s in mine}
    stages = [pipelining.PipelineStage(modules[s], s, total, current_device()) for s in mine]
    schedule = getattr(pipelining, name)(stages, run.micro_batches, loss_fn=loss_function(run.model))
    return schedule, modules, bounds, mine


def torch_virtual_stages_steps(rank: int, world_size: int, run: PipeRun,
                               schedules: tuple[str, ...] = VIRTUAL_SCHEDULES,
                               virtual: int = 2) -> list[dict]:
    """One step under each of torch's `schedules`, with `virtual` stages per rank.

    Collective: call on every rank. The model is cut into world_size x virtual stages and this
    rank builds a torch PipelineStage for each of its own (`virtual_stage_indices`). Returns, per
    schedule, this rank's stages, their gradients named as in the unsplit model, and this rank's
    order as torch's schedule lists it (`torch_order`).
    """
    results = []
    for name in schedules:
        schedule, modules, bounds, mine = _virtual_schedule(name, rank, world_size, run, virtual)
        x, y = run.batch(0)
        schedule.step(x, target=y, losses=[])  # each rank's stages take what they need
        grads = {}
        for s in mine:
            grads.update(layer_gradients(modules[s], bounds[s][0]))
        results.append({"schedule": name, "stages": mine, "grads": grads,
                        "order": torch_order(schedule, rank)})
    return results


def torch_schedule_orders(rank: int, world_size: int, run: PipeRun,
                          schedules: tuple[str, ...] = VIRTUAL_SCHEDULES,
                          virtual: int = 2) -> list[dict]:
    """The order each of torch's `schedules` gives this rank, as the schedule computes it when
    it is built (`torch_order`), without running a step: {"schedule", "stages", "order"}.

    Collective: call on every rank (building torch's stages takes the group)."""
    results = []
    for name in schedules:
        schedule, _, _, mine = _virtual_schedule(name, rank, world_size, run, virtual)
        results.append({"schedule": name, "stages": mine, "order": torch_order(schedule, rank)})
    return results


def _refused_partition(facts: dict) -> str:
    if facts["num_stages"] > facts["count"]:
        return ("{num_stages} مرحله اما فقط {count} لایه: هر مرحله دست‌کم یک لایه لازم دارد، پس "
                "حداکثر {count} مرحله (رتبه) به کار ببرید")
    return "تقسیم {partition} باید {num_stages} شمار مثبت از لایه‌ها بدهد که جمعشان {count} شود"


# Why lesson 79's functions refuse their arguments, in Persian, from the values each checked.
REFUSALS = {
    "partition_layers": _refused_partition,
    "split_micro_batches": lambda facts: ("دستهٔ {size}تایی به {micro_batches} میکرودستهٔ برابر "
                                          "تقسیم نمی‌شود: یکی از مقسوم‌علیه‌های {size} را به کار "
                                          "ببرید"),
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

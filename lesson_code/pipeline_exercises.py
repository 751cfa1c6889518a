"""Lesson 79's exercise code: the solutions of exercise 6, a pipeline whose first and last stage
share a tied matrix, with the tied unsplit model to check it against, and of exercise 7, two
neighbouring stages that send to each other at once, with and without waiting for their sends,
and exercise 3's grid of pipeline replicas, data parallelism across the pipelines.

The lesson's own rank functions are `lesson_code.pipeline_lab`; the solutions' cells run these
through the launcher, as the lesson does:

    from lesson_code import launch, pipeline_exercises
    launch.spawn(pipeline_exercises.tied_pipeline_step, PipeRun(micro_batches=4), world_size=2)
    launch.spawn(pipeline_exercises.neighbours_exchange, False, world_size=2)
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

from lesson_code.experiment import global_mean
from lesson_code.models import as_layers, build_model, loss_function
from lesson_code.pipeline_lab import PipeRun, build_stage, layer_gradients
from lesson_code.runtime.devices import current_device


def tied_pipeline_step(rank: int, world_size: int, run: PipeRun) -> dict:
    """One step of our pipeline of MiniGPT with its head tied to its token embedding (exercise 6).

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
    """Exercise 7: two neighbouring stages in 1F1B's steady state, at the moment rank 0 sends
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
    """Exercise 3: `data_parallel` replicas of a pipeline of world/dp stages, on a 2-D grid.

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

"""A learner's lesson 81 file, written as a learner would: the capstone's loop with its resume.

It builds the model and the ZeRO-1 optimizer from the course's parts, resumes from a checkpoint
(weights, optimizer shard, step and data position), trains, saves after the checkpoint step and
returns what the grader reads. The practice tests grade it as it is (every check passes) and
with one mistake each (tests/practice/test_capstone_resume.py).
"""

from pathlib import Path

import torch

from lesson_code.capstone.checkpointer import state_copy
from lesson_code.checkpoint_lab import load_zero, save_zero
from lesson_code.data import batch_for_step
from lesson_code.ddp import broadcast_parameters
from lesson_code.runtime.devices import current_device
from lesson_code.experiment import flat_parameters, global_mean
from lesson_code.models import MiniGPT
from lesson_code.zero import ZeroOptimizer


def run_rank(rank, world_size, config, start_from=None):
    torch.manual_seed(config.seed + rank)
    model = MiniGPT(config.gpt).to(current_device())
    broadcast_parameters(model)
    optimizer = ZeroOptimizer(model, world_size, rank, lr=config.lr)
    corpus = config.corpus()
    step, position = 0, 0
    if start_from is not None:
        extra = load_zero(start_from, model, optimizer)
        step, position = extra["next_step"], extra["data_position"]
    records, checkpoints = [], {}
    while step < config.steps:
        optimizer.zero_grad()
        x, y = batch_for_step(corpus, position, rank, world_size, config.batch_per_rank,
                              config.gpt.context)
        local = model(x.to(current_device()), y.to(current_device()))[1]
        local.backward()
        loss = global_mean(local.detach())
        optimizer.step()
        step, position = step + 1, position + 1
        records.append({"step": step, "loss": loss})
        if step == config.checkpoint_step:
            folder = save_zero(Path(config.out_dir) / "checkpoints", model, optimizer, step=step,
                               extra={"next_step": step, "data_position": position})
            checkpoints[step] = str(folder)
    return {"rank": rank, "records": records, "params": flat_parameters(model),
            "final_state": {**state_copy(model, optimizer), "optimizer_step": optimizer.step_count},
            "checkpoints": checkpoints}

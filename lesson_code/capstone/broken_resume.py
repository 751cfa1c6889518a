"""Resumes that each leave one piece of the resume out, as a bug would (lesson 81, exercise 6).

`resume_without(rank, world_size, config, folder, piece)` runs the real `run_rank` from the
checkpoint `folder` with one piece of what a resume restores left out (`PIECES`):

- "data position": the data loader starts again at the corpus's first batch, while the step
  count goes on from the checkpoint's, as a loader rebuilt without its saved state would;
- "optimizer state": Adam's moments and step count start at zero; only the weights and the fp32
  master shard are loaded;
- "RNG state": the generator keeps the state the fresh build left in it.

Compare a result with the run that never stopped with `train.compare_resumed` (check (e)).
The piece is left out by replacing `train.load_zero` (its first call only, the resume's own load;
`verify_resume` still loads whole checkpoints) or `train.batch_for_step` with `mock.patch`,
inside this rank process and only for the length of the call.

    launch.spawn(resume_without, config, folder, "data position", world_size=4)
"""

from __future__ import annotations

from unittest import mock

import torch

from lesson_code.capstone import train
from lesson_code.capstone.config import CapstoneConfig
from lesson_code.checkpoint import read_manifest

PIECES = ("data position", "optimizer state", "RNG state")


def resume_without(rank: int, world_size: int, config: CapstoneConfig, folder: str,
                   piece: str) -> dict:
    """`run_rank` resumed from the checkpoint `folder` with `piece` (one of PIECES) left out;
    returns its result. Collective: call on every rank. Raises ValueError for another piece."""
    if piece not in PIECES:
        raise ValueError(f"piece must be one of {', '.join(PIECES)}, not {piece!r}")
    load, batches = train.load_zero, train.batch_for_step
    restart = read_manifest(folder)["step"]  # the batch a correct resume reads first
    loads = []

    def load_without(folder, model, optimizer):  # the resume's load, with `piece` left out
        loads.append(folder)
        rng = torch.get_rng_state()  # the state the fresh build left
        extra = load(folder, model, optimizer)
        if len(loads) == 1 and piece == "optimizer state":
            state = optimizer.state_dict()
            optimizer.load_state_dict({**state, "step": 0,
                                       "exp_avg": torch.zeros_like(state["exp_avg"]),
                                       "exp_avg_sq": torch.zeros_like(state["exp_avg_sq"])})
        if len(loads) == 1 and piece == "RNG state":
            torch.set_rng_state(rng)
        return extra

    def from_the_first_batch(corpus, step, *rest):  # batch `restart` is read as batch 0, ...
        return batches(corpus, step - restart, *rest)

    replaced = {"load_zero": load_without}
    if piece == "data position":
        replaced["batch_for_step"] = from_the_first_batch
    with mock.patch.multiple(train, **replaced):  # put back when the run returns or raises
        return train.run_rank(rank, world_size, config, folder)

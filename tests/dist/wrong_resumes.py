"""Resumes that are wrong in plausible ways, to show that `compare_resumed` catches them.

Each runs the real `run_rank` from a checkpoint with one step of the resume left out, the way a
bug would leave it out: the optimizer's Adam state is not restored (only the weights are), the
data loader starts again from the corpus's first batch instead of the saved position, or the
divergence guard starts afresh (it forgets the last accepted loss and its rollbacks).
"""

import torch

from lesson_code.capstone import run_rank, train
from lesson_code.checkpoint_lab import load_zero
from lesson_code.data import batch_for_step
from wrong_variants import replaced


def load_weights_only(folder, model, optimizer):
    """Load the checkpoint, then forget Adam's moments and step count (a fresh optimizer)."""
    extra = load_zero(folder, model, optimizer)
    state = optimizer.state_dict()
    optimizer.load_state_dict({**state, "step": 0, "exp_avg": torch.zeros_like(state["exp_avg"]),
                               "exp_avg_sq": torch.zeros_like(state["exp_avg_sq"])})
    return extra


def resume_without_optimizer_state(rank, world_size, config, folder):
    """Collective: `run_rank` resumed from `folder` with Adam's state left fresh."""
    with replaced(train, "load_zero", load_weights_only):
        return run_rank(rank, world_size, config, folder)


def resume_from_the_first_batch(rank, world_size, config, folder):
    """Collective: `run_rank` resumed from `folder` whose data loader restarts at batch 0."""
    restart = config.checkpoint_step

    def from_the_start(corpus, step, *rest):
        return batch_for_step(corpus, step - restart, *rest)

    with replaced(train, "batch_for_step", from_the_start):
        return run_rank(rank, world_size, config, folder)


def resume_without_guard_state(rank, world_size, config, folder):
    """Collective: `run_rank` resumed from `folder` with a fresh divergence guard."""
    restore = train.restore_run_state

    def without_the_guard(extra, guard):
        found = restore(extra, guard)
        guard.previous, guard.retries = None, {}
        return found

    with replaced(train, "restore_run_state", without_the_guard):
        return run_rank(rank, world_size, config, folder)

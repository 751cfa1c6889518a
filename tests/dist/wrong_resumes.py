"""A resume that is wrong in a plausible way, to show that `compare_resumed` catches it.

It runs the real `run_rank` from a checkpoint with the divergence guard started afresh (it
forgets the last accepted loss and its rollbacks), as a bug would. The resumes that leave out
the data position, Adam's state or the RNG state are lesson_code's own
(`lesson_code.capstone.broken_resume`, lesson 81's exercise 6).
"""

from lesson_code.capstone import run_rank, train
from wrong_variants import replaced


def resume_without_guard_state(rank, world_size, config, folder):
    """Collective: `run_rank` resumed from `folder` with a fresh divergence guard."""
    restore = train.restore_run_state

    def without_the_guard(extra, guard):
        found = restore(extra, guard)
        guard.previous, guard.retries = None, {}
        return found

    with replaced(train, "restore_run_state", without_the_guard):
        return run_rank(rank, world_size, config, folder)

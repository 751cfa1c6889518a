"""The capstone's settings (lesson 81): one frozen dataclass, a kind of `experiment.RunConfig`.

Vary a run with dataclasses.replace; `python -m lesson_code.capstone --help` lists what the
command line sets.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from lesson_code import data
from lesson_code.runtime.devices import current_device
from lesson_code.experiment import RunConfig
from lesson_code.harness.validate import require_positive_int


@dataclass(frozen=True)
class CapstoneConfig(RunConfig):
    """One capstone run: 20 steps of MiniGPT on 4 ranks, ZeRO-1, a checkpoint after step 10.

    What every run says (steps, seed, comm, gpt) comes from `RunConfig`. The model is always
    MiniGPT ("gpt"), and the global batch is not set but derived: `batch_size` = world_size x
    batch_per_rank sequences of the corpus (`data.make_corpus`), which `batch(step)` returns.

    Faults for the lesson: `lr_spike_step` (numbered from 1, as in the loss table) multiplies the
    learning rate by `lr_spike_factor` for that one step (once; a replay after a rollback does
    not repeat it). `bad_batch_step` (numbered from 1) mislabels that step's batch every time it
    is read, so its loss spikes again on every replay: the guard rolls back `guard_retries` times,
    then skips the batch. `skip_after_rollback` skips at the first rollback instead: the batches
    from the checkpoint to the rejected step are not replayed. Raises ValueError for settings
    that contradict each other.
    """

    model: str = field(default="gpt", init=False)       # MiniGPT, always
    steps: int = 20
    batch_size: int = field(default=16, init=False)     # derived: world_size * batch_per_rank
    world_size: int = 4
    checkpoint_step: int = 10
    out_dir: str = "capstone-run"
    batch_per_rank: int = 4
    corpus_tokens: int = 4 * 4 * 17   # one global batch of sequences: every step sees the corpus
    lr: float = 3e-3
    accumulation: int = 1             # micro-batches per step (exercise 2)
    spike_factor: float = 2.0         # the divergence guard's limit on loss growth between steps
    lr_spike_step: int | None = None
    lr_spike_factor: float = 1000.0
    bad_batch_step: int | None = None
    guard_retries: int = 1            # rollbacks for one step before its batch is skipped
    skip_after_rollback: bool = False  # a rollback skips the batches up to the rejected step
    keep_last: int = 2

    def __post_init__(self):
        require_positive_int("world_size", self.world_size, "the number of ranks, such as 4")
        require_positive_int("batch_per_rank", self.batch_per_rank, "sequences per rank, such as 4")
        object.__setattr__(self, "batch_size", self.world_size * self.batch_per_rank)
        super().__post_init__()
        if self.guard_retries < 0:
            raise ValueError(f"guard_retries={self.guard_retries} must be 0 or more: the rollbacks "
                             "one step may cause before its batch is skipped")
        if not 0 < self.checkpoint_step <= self.steps:
            raise ValueError(f"checkpoint_step={self.checkpoint_step} must be in 1..steps={self.steps}")
        if self.batch_per_rank % self.accumulation:
            raise ValueError(f"accumulation={self.accumulation} must divide batch_per_rank="
                             f"{self.batch_per_rank}")

    def corpus(self) -> torch.Tensor:
        """The run's token stream: `data.make_corpus(seed, corpus_tokens, vocab)`, on the CPU."""
        return data.make_corpus(self.seed, self.corpus_tokens, self.gpt.vocab_size)

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The global batch of `step` from the corpus, on this process's device.

        `local_batch(step, rank, world_size)` (from RunConfig) slices it: rank r's part equals
        `data.batch_for_step(corpus, step, r, world_size, batch_per_rank, context)`.
        """
        x, y = data.batch_for_step(self.corpus(), step, 0, 1, self.batch_size, self.gpt.context)
        return x.to(current_device()), y.to(current_device())

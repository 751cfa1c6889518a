"""The capstone's settings, one frozen dataclass (vary it with dataclasses.replace)."""

from __future__ import annotations

from dataclasses import dataclass, field

from lesson_code.models import GPTConfig


@dataclass(frozen=True)
class CapstoneConfig:
    """One capstone run: 20 steps of MiniGPT on 4 ranks, ZeRO-1, a checkpoint after step 10.

    Faults for the lesson: `lr_spike_step` (numbered from 1, as in the loss table) multiplies the
    learning rate by `lr_spike_factor` for that one step (once; a replay after a rollback does
    not repeat it). `bad_batch_step` (numbered from 1) mislabels that step's batch every time it
    is read, so its loss spikes again on every replay: the guard rolls back `guard_retries` times,
    then skips the batch.
    """

    world_size: int = 4
    steps: int = 20
    checkpoint_step: int = 10
    out_dir: str = "capstone-run"
    seed: int = 0
    gpt: GPTConfig = field(default_factory=GPTConfig)  # 2 blocks, width 32, 4 heads, vocab 64, context 16
    batch_per_rank: int = 4
    corpus_tokens: int = 4 * 4 * 17   # one global batch of sequences: every step sees the corpus
    lr: float = 3e-3
    accumulation: int = 1             # micro-batches per step (exercise 2)
    comm: str = "ring"                # "ring" (lesson 76) or "builtin" (gloo / NCCL)
    spike_factor: float = 2.0         # the divergence guard's limit on loss growth between steps
    lr_spike_step: int | None = None
    lr_spike_factor: float = 1000.0
    bad_batch_step: int | None = None
    guard_retries: int = 1            # rollbacks for one step before its batch is skipped
    keep_last: int = 2

    def __post_init__(self):
        if self.guard_retries < 0:
            raise ValueError(f"guard_retries={self.guard_retries} must be 0 or more: the rollbacks "
                             "one step may cause before its batch is skipped")
        if not 0 < self.checkpoint_step <= self.steps:
            raise ValueError(f"checkpoint_step={self.checkpoint_step} must be in 1..steps={self.steps}")
        if self.batch_per_rank % self.accumulation:
            raise ValueError(f"accumulation={self.accumulation} must divide batch_per_rank="
                             f"{self.batch_per_rank}")

"""The capstone's settings (lesson 81): one frozen dataclass, a kind of `experiment.RunConfig`.

Vary a run with dataclasses.replace; `python -m lesson_code.capstone --help` lists what the
command line sets.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

from lesson_code import data
from lesson_code.runtime.devices import current_device
from lesson_code.experiment import RunConfig
from lesson_code.harness.validate import require_positive_int


@dataclass(frozen=True)
class CapstoneConfig(RunConfig):
    """One capstone run: 20 steps of MiniGPT on 4 ranks, ZeRO-1, checkpoints after steps 10, 20.

    What every run says (steps, seed, comm, gpt) comes from `RunConfig`. The model is always
    MiniGPT ("gpt"), and the global batch is not set but derived: `batch_size` = world_size x
    batch_per_rank sequences of the corpus (`data.make_corpus`), which `batch(step)` returns.
    The corpus is derived too: `corpus_batches` distinct global batches (`corpus_tokens` =
    corpus_batches x batch_size x (context + 1)), so it grows with the world size and step s
    reads batch s mod corpus_batches: by default every step of the 20 reads another batch, and a
    resume that restarts the data at batch 0 trains on other data than the run it continues.

    Checkpoints are saved after `checkpoint_step` (the one the command's resume check reloads),
    after every multiple of `checkpoint_every` if set, after the steps in `save_also`, and after
    the last step (`save_steps()`).

    Faults for the lesson: `lr_spike_step` (numbered from 1, as in the loss table) multiplies the
    learning rate by `lr_spike_factor` for that one step (once; a replay after a rollback does
    not repeat it). `bad_batch_step` (numbered from 1) mislabels that step's batch every time it
    is read, so its loss spikes again on every replay: the guard rolls back `guard_retries` times,
    then skips the batch. `skip_after_rollback` skips at the first rollback instead: the batches
    from the checkpoint to the rejected step are not replayed. `kill_at_step` makes rank
    `kill_rank` (default: the last) kill its own process with SIGKILL right after that step, or,
    with `kill_during_save`, half-way through writing its shard of that step's checkpoint: a
    crash to resume from (`run_rank` fires it; the command arms it only in a run that starts
    fresh on torchrun's first attempt). `optimizer_before_broadcast` builds the optimizer before
    the broadcast, the wrong order of the lesson's table: each rank's master shard then holds its
    own random initialisation. `max_grad_norm` clips the global gradient norm (lesson 81's
    exercise 4).
    Raises ValueError for settings that contradict each other.
    """

    model: str = field(default="gpt", init=False)       # MiniGPT, always
    steps: int = 20
    batch_size: int = field(default=16, init=False)     # derived: world_size * batch_per_rank
    world_size: int = 4
    checkpoint_step: int = 10
    checkpoint_every: int | None = None  # also save after every multiple of this step count
    save_also: tuple[int, ...] = ()   # and after these steps (the check of a continued run)
    out_dir: str = "capstone-run"
    batch_per_rank: int = 4
    corpus_batches: int = 20          # distinct global batches: each of the 20 steps reads its own
    corpus_tokens: int = field(default=0, init=False)  # derived from corpus_batches
    lr: float = 3e-3
    accumulation: int = 1             # micro-batches per step, their gradients summed
    spike_factor: float = 2.0         # the divergence guard's limit on loss growth between steps
    lr_spike_step: int | None = None
    lr_spike_factor: float = 1000.0
    bad_batch_step: int | None = None
    guard_retries: int = 1            # rollbacks for one step before its batch is skipped
    skip_after_rollback: bool = False  # a rollback skips the batches up to the rejected step
    keep_last: int = 2
    kill_at_step: int | None = None   # a crash for the lesson: see the docstring
    kill_rank: int | None = None      # None: the last rank
    kill_during_save: bool = False
    optimizer_before_broadcast: bool = False  # the wrong order, to show what it does
    max_grad_norm: float | None = None  # clip the global gradient norm to this (exercise 4)

    def __post_init__(self):
        require_positive_int("world_size", self.world_size, "the number of ranks, such as 4")
        require_positive_int("batch_per_rank", self.batch_per_rank, "sequences per rank, such as 4")
        require_positive_int("corpus_batches", self.corpus_batches,
                             "the distinct global batches of the corpus, such as 20")
        object.__setattr__(self, "batch_size", self.world_size * self.batch_per_rank)
        object.__setattr__(self, "corpus_tokens",
                           self.corpus_batches * self.batch_size * (self.gpt.context + 1))
        super().__post_init__()
        if self.guard_retries < 0:
            raise ValueError(f"guard_retries={self.guard_retries} must be 0 or more: the rollbacks "
                             "one step may cause before its batch is skipped")
        if not 0 < self.checkpoint_step <= self.steps:
            raise ValueError(f"checkpoint_step={self.checkpoint_step} must be in 1..steps={self.steps}")
        if self.batch_per_rank % self.accumulation:
            raise ValueError(f"accumulation={self.accumulation} must divide batch_per_rank="
                             f"{self.batch_per_rank}")
        if self.checkpoint_every is not None:
            require_positive_int("checkpoint_every", self.checkpoint_every,
                                 "the steps between checkpoints, such as 10, or None")
        if self.max_grad_norm is not None and not self.max_grad_norm > 0:
            raise ValueError(f"max_grad_norm={self.max_grad_norm} must be positive, such as 1.0, "
                             "or None for no clipping")
        self._check_kill()

    def _check_kill(self) -> None:
        if self.kill_at_step is None:
            if self.kill_rank is not None or self.kill_during_save:
                raise ValueError("kill_rank and kill_during_save need kill_at_step: the step after "
                                 "which (or during whose save) the rank is killed")
            return
        if not 0 < self.kill_at_step <= self.steps:
            raise ValueError(f"kill_at_step={self.kill_at_step} must be in 1..steps={self.steps}")
        if self.kill_rank is not None and not 0 <= self.kill_rank < self.world_size:
            raise ValueError(f"kill_rank={self.kill_rank} must be a rank of the world: 0.."
                             f"{self.world_size - 1}")
        if self.kill_during_save and self.kill_at_step not in self.save_steps():
            raise ValueError(f"kill_during_save: no checkpoint is saved after step "
                             f"{self.kill_at_step}; saves follow steps {sorted(self.save_steps())}")

    def save_steps(self) -> set[int]:
        """The steps after which a checkpoint is saved: `checkpoint_step`, every multiple of
        `checkpoint_every` (if set), those of `save_also`, and the last step, so that a finished
        run can be continued."""
        every = range(self.checkpoint_every, self.steps + 1, self.checkpoint_every) \
            if self.checkpoint_every else ()
        return {self.checkpoint_step, *every, *self.save_also, self.steps}

    def disarmed(self) -> CapstoneConfig:
        """This run without its injected crash (for the attempts and checks after the first)."""
        return dataclasses.replace(self, kill_at_step=None, kill_rank=None, kill_during_save=False)

    def victim(self) -> int | None:
        """The rank that `kill_at_step` kills (`kill_rank`, or the last rank), or None."""
        if self.kill_at_step is None:
            return None
        return self.world_size - 1 if self.kill_rank is None else self.kill_rank

    def trajectory(self) -> dict:
        """The settings that decide every number of a run, as JSON: a checkpoint stores them, and
        a run may continue from it only if its own are equal (`steps`, the save schedule, the
        folder and the kill are free to change between attempts; the world size is checked apart)."""
        return {"seed": self.seed, "gpt": dataclasses.asdict(self.gpt),
                "batch_per_rank": self.batch_per_rank, "corpus_batches": self.corpus_batches,
                "lr": self.lr, "accumulation": self.accumulation, "comm": self.comm,
                "all_reduce": self.all_reduce, "spike_factor": self.spike_factor,
                "lr_spike_step": self.lr_spike_step, "lr_spike_factor": self.lr_spike_factor,
                "bad_batch_step": self.bad_batch_step, "guard_retries": self.guard_retries,
                "skip_after_rollback": self.skip_after_rollback,
                "optimizer_before_broadcast": self.optimizer_before_broadcast,
                "max_grad_norm": self.max_grad_norm}

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

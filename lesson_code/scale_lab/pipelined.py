"""Lesson 79's pipeline on 1 to 512 stages, each a simulated rank (lesson 78's scale lab).

A pipeline of P stages needs at least P layers, and a stage's messages carry real activations
whose shape the next stage reads from a header: it cannot run where messages move nothing. So
its stages run as threads of this process that pass real tensors (`runtime.simulated.
run_threads`), on a deep, narrow MiniGPT built once and cut with the course's own
`pipeline.partition_layers`; every stage runs the course's `pipeline.PipelineStage` unchanged.

    from lesson_code.scale_lab import pipelined
    table = pipelined.sweep()          # P = 1, 16, 512 stages: bytes held and sent per stage
    check = pipelined.compare_with_real()   # lesson 79's step: 4 threads against 4 real ranks

Per stage it reports the bytes of its layers' parameters and of their gradients after the step
(read from storage), the most micro-batches whose activations it kept at once (the stage's own
count), and the bytes and messages it sent and received (its ledger).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd
import torch
from torch import nn

from lesson_code import data, launch, pipeline_lab
from lesson_code.collectives.comm import Communicator
from lesson_code.collectives.ledger import CommLedger
from lesson_code.harness.validate import require_choice, require_positive_int
from lesson_code.models import GPTConfig, as_layers, build_model, count_parameters, loss_function
from lesson_code.pipeline import HEADER_LENGTH, SCHEDULES, PipelineStage, partition_layers
from lesson_code.pipeline_lab import PipeRun
from lesson_code.runtime.simulated import one_torch_thread, run_threads
from lesson_code.scale_lab.storages import held_bytes

# Each P is a whole step of 512 layers, 3 to 5 s of one core here: the whole model on one stage
# (the reference), 32 layers per stage, one layer per stage. Three keep the command under a
# minute (python -m lesson_code.scale_lab --stages 1,4,16,64,256,512 runs more).
STAGE_COUNTS = (1, 16, 512)
# 510 blocks between the embedding and the head: 512 layers, one per stage at P = 512.
DEEP_GPT = GPTConfig(vocab_size=64, context=16, n_layer=510, n_embd=32, n_head=4)


@dataclass(frozen=True)
class PipelineScaleRun:
    """One pipelined step of a MiniGPT of shape `gpt` (float32, as lesson 79's) on a batch of
    `sequences`, cut into `micro_batches` under `schedule`. Raises ValueError for an unknown
    schedule, counts below 1, or micro-batches that do not divide the batch."""

    gpt: GPTConfig = field(default_factory=lambda: DEEP_GPT)
    sequences: int = 8
    micro_batches: int = 4
    schedule: str = "1f1b"
    seed: int = 0

    def __post_init__(self):
        require_choice("schedule", self.schedule, SCHEDULES)
        require_positive_int("sequences", self.sequences)
        require_positive_int("micro_batches", self.micro_batches,
                             f"a divisor of the batch of {self.sequences} sequences")
        if self.sequences % self.micro_batches:
            raise ValueError(f"{self.micro_batches} micro-batches do not divide the batch of "
                             f"{self.sequences} sequences: pass a divisor of {self.sequences}")

    @property
    def activation_bytes(self) -> int:
        """Bytes of one micro-batch's activation between two blocks: (B/m, T, C) floats."""
        return self.sequences // self.micro_batches * self.gpt.context * self.gpt.n_embd * 4


def stage_step(rank: int, world_size: int, stages: list[nn.Module], run: PipelineScaleRun,
               batch: tuple[torch.Tensor, torch.Tensor]) -> dict:
    """One step of lesson 79's pipeline as stage `rank` of `world_size`, on its layers
    `stages[rank]`. Collective: call on every stage. Returns its bytes of parameters and of
    gradients after the step, its most activations kept at once, and its ledger's traffic."""
    ledger = CommLedger()
    module = stages[rank]
    stage = PipelineStage(module, Communicator("ring", ledger), loss_function("gpt"))
    stats = stage.train_step(*batch, run.micro_batches, run.schedule)
    params = list(module.parameters())
    held = held_bytes({"parameters": params, "gradients": [p.grad for p in params]})
    traffic = ledger.totals().get("pipeline", {})
    return {"stage": rank, **held, "peak_stored": stats.peak_stored, "loss": stats.loss,
            "sent": traffic.get("bytes_sent", 0), "received": traffic.get("bytes_received", 0),
            "messages_sent": traffic.get("messages_sent", 0)}


def bytes_sent(stage: int, num_stages: int, run: PipelineScaleRun) -> int:
    """What stage `stage` of `num_stages` sends in a step, by lesson 79's protocol: every
    micro-batch's activation forward (after a header of HEADER_LENGTH int64s) except from the
    last stage, and its gradient back except from the first; nothing on one stage."""
    forward = 0 if stage == num_stages - 1 else run.activation_bytes + 8 * HEADER_LENGTH
    backward = 0 if stage == 0 else run.activation_bytes
    return run.micro_batches * (forward + backward)


def sweep(run: PipelineScaleRun = PipelineScaleRun(), stage_counts=STAGE_COUNTS,
          timeout_s: float = 300.0) -> pd.DataFrame:
    """One pipelined step on each number of stages P, every stage measured: one row per
    (P, stage) with its layers [first, end), `parameters` and `gradients` (bytes), `peak_stored`
    (micro-batches), `sent` beside `formula_sent` (`bytes_sent`), `received`, `messages_sent`.
    The model is built once (from `run.seed`) and cut anew for each P; `table.attrs` holds its
    number of layers and of parameters. Raises ValueError for more stages than the model has
    layers."""
    with one_torch_thread():
        layers = as_layers(build_model("gpt", run.seed, run.gpt))
    batch = data.make_batch("gpt", run.sequences, 0, run.seed, run.gpt)
    rows = []
    for num_stages in stage_counts:
        bounds = partition_layers(layers, num_stages)
        stages = [nn.Sequential(*layers[start:end]) for start, end in bounds]
        for module in stages:
            module.zero_grad(set_to_none=True)  # each P starts from no gradient
        results = run_threads(stage_step, stages, run, batch, world_size=num_stages,
                              timeout_s=timeout_s)
        for (start, end), result in zip(bounds, results):
            rows.append({"P": num_stages, **result, "first_layer": start, "end_layer": end,
                         "formula_sent": bytes_sent(result["stage"], num_stages, run)})
    table = pd.DataFrame(rows)
    table.attrs.update(layers=len(layers), parameters=sum(map(count_parameters, layers)))
    return table


def summary(table: pd.DataFrame) -> pd.DataFrame:
    """A `sweep` per number of stages P, to show: layers per stage (fewest, most), MB of
    parameters per stage (least, most), the most bytes a stage sent beside what lesson 79's
    protocol sends, the most micro-batches whose activations a stage kept at once, the loss."""
    by = table.groupby("P")
    layers = table.end_layer - table.first_layer
    return pd.DataFrame({
        "layers per stage, fewest": layers.groupby(table.P).min(),
        "layers per stage, most": layers.groupby(table.P).max(),
        "parameter MB per stage, least": (by.parameters.min() / 1e6).round(3),
        "parameter MB per stage, most": (by.parameters.max() / 1e6).round(3),
        "bytes sent, most": by.sent.max(), "protocol's bytes, most": by.formula_sent.max(),
        "activations kept, most": by.peak_stored.max(),
        "loss": by.loss.max().round(4)})


def compare_with_real(run: PipeRun = PipeRun(), world_size: int = 4) -> pd.DataFrame:
    """Lesson 79's own rank function (`pipeline_lab.pipeline_step`) on `world_size` stages that
    are threads of this process, beside the same on real ranks (`launch.spawn` with gloo): one
    row per stage with `traffic_equal` (every count of its ledger), `max_grad_diff` (largest
    |difference| of its layers' gradients) and the losses of the last stage."""
    real = launch.spawn(pipeline_lab.pipeline_step, run, world_size=world_size, backend="gloo")
    threads = run_threads(pipeline_lab.pipeline_step, run, world_size=world_size)
    rows = []
    for stage, (ours, theirs) in enumerate(zip(threads, real)):
        rows.append({"stage": stage, "layers": ours["layers"],
                     "traffic_equal": ours["traffic"] == theirs["traffic"],
                     "sent": ours["traffic"]["bytes_sent"],
                     "max_grad_diff": max((ours["grads"][name] - grad).abs().max().item()
                                          for name, grad in theirs["grads"].items()),
                     "loss_simulated": ours["loss"], "loss_real": theirs["loss"]})
    return pd.DataFrame(rows).set_index("stage")

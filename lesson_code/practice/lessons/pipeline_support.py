"""What lesson 79's grader needs inside a rank: its tolerance, sub-groups, references, recorders.

Tolerance (the course's own, tests/dist/test_pipeline.py): every gradient and the loss within
1e-6 absolute of the unsplit model on the whole batch, per step taken (measured: below 4e-8).
The pipeline adds m micro-batch gradients, each scaled by 1/m, where one process sums the whole
batch at once: the same terms in another order, float32 rounding only. A loss not divided by m,
a micro-batch left out or a gradient sent to the wrong stage moves them by far more.

The reference runs in the grading rank itself (one thread, the ranks' conditions), and the
stages' inputs used to tell micro-batches apart are computed there too, from the same seed.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch
import torch.distributed as dist
from torch import nn

from lesson_code.runtime.devices import current_device
from lesson_code.models import as_layers, build_model, loss_function
from lesson_code.pipeline import HEADER_LENGTH, split_micro_batches
from lesson_code.pipeline_lab import PipeRun
from lesson_code.practice.grading import Failure
from lesson_code.practice.messages import Phrase, distinct_numbers, phrase
from lesson_code.practice.rank_checks import compare

GRADIENT_BOUND = 1e-6
LOSS_BOUND = 1e-6
HEADER_BYTES = HEADER_LENGTH * 8  # the course's shape header, int64s, before each activation
STAGE_COUNTS = (1, 2, 3, 4)       # stages of the step checks: ranks 0..P-1 of four


def stage_groups(world_size: int) -> dict[int, dist.ProcessGroup | None]:
    """{P: the group of ranks 0..P-1} for each P in STAGE_COUNTS; None (the default) for all.

    Collective: every rank creates every group, in the same order (torch requires it).
    """
    return {p: None if p == world_size else dist.new_group(list(range(p))) for p in STAGE_COUNTS}


def _unsplit_layers(run: PipeRun) -> nn.Sequential:
    return nn.Sequential(*as_layers(build_model(run.model, run.seed, run.gpt, current_device())))


def activation_shape(run: PipeRun) -> tuple[int, ...]:
    """The shape of one micro-batch's activation between two stages (the same at every cut)."""
    x, _ = run.batch(0)
    with torch.no_grad():
        return tuple(_unsplit_layers(run)[0](split_micro_batches(x, run.micro_batches)[0]).shape)


def stage_inputs(run: PipeRun, start: int) -> list[torch.Tensor]:
    """What the stage beginning at layer `start` receives for each micro-batch, in order."""
    x, _ = run.batch(0)
    prefix = _unsplit_layers(run)[:start]
    with torch.no_grad():
        return [prefix(part) for part in split_micro_batches(x, run.micro_batches)]


def _which(received, inputs: list[torch.Tensor]) -> int | str:
    """The micro-batch whose input `received` is (the nearest one), or "?" for another shape."""
    if not isinstance(received, torch.Tensor) or received.shape != inputs[0].shape:
        return "?"
    distances = [(received.detach().double() - x.double()).abs().max().item() for x in inputs]
    return distances.index(min(distances))


@contextmanager
def recorded_order(module: nn.Module, inputs: list[torch.Tensor]) -> Iterator[list[tuple]]:
    """Record ("F", i) at each forward of `module` and ("B", i) when its output's gradient arrives.

    Micro-batch i is recognised by its input (`inputs[i]`), so a forward of the wrong
    micro-batch is seen as such. The backward hook sits on the forward's output, so it fires
    when the stage's backward of that micro-batch starts, however the learner calls it.
    """
    order: list[tuple] = []

    def forward_hook(_module, args, output):
        index = _which(args[0] if args else None, inputs)
        order.append(("F", index))
        if isinstance(output, torch.Tensor) and output.requires_grad:
            output.register_hook(lambda grad: order.append(("B", index)))

    handle = module.register_forward_hook(forward_hook)
    try:
        yield order
    finally:
        handle.remove()


def order_text(order) -> str:
    """A schedule as text, "F0 F1 B0 ...", whatever the learner returned."""
    try:
        return " ".join(f"{kind}{index}" for kind, index in order) or "(empty)"
    except (TypeError, ValueError):
        return repr(order)[:80]


def schedule_problem(got, schedule: str, stage: int, stages: int, m: int) -> tuple | None:
    """(what, got, expected) of the first property a stage's order breaks, or None.

    Properties: a list of ("F", i)/("B", i); one forward and one backward of each micro-batch;
    each forward before its backward; under 1F1B at most P - stage activations in flight.
    """
    if not isinstance(got, (list, tuple)):
        return (phrase("the returned value", "مقدار برگشتی"), type(got).__name__,
                phrase("a list of ('F', i) and ('B', i)", "فهرستی از `('F', i)` و `('B', i)`"))
    steps = []
    for step in got:
        if not (isinstance(step, (list, tuple)) and len(step) == 2 and step[0] in ("F", "B")
                and isinstance(step[1], int)):
            return (phrase("a step", "یک گام"), repr(step),
                    phrase("('F', i) or ('B', i), i an `int`", "`('F', i)` یا `('B', i)` با `i` از نوع `int`"))
        steps.append(tuple(step))
    wanted = sorted((kind, i) for kind in "FB" for i in range(m))
    if sorted(steps) != wanted:
        return (phrase("the steps", "گام‌ها"), order_text(sorted(steps)),
                phrase("one F and one B of each micro-batch from {first} to {last}",
                       "یک F و یک B برای هر میکرودسته از {first} تا {last}", first=0, last=m - 1))
    for i in range(m):
        if steps.index(("B", i)) < steps.index(("F", i)):
            return (phrase("the place of {b}", "جای `{b}`", b=f"B{i}"),
                    phrase("before {f}", "پیش از `{f}`", f=f"F{i}"),
                    phrase("after {f}", "پس از `{f}`", f=f"F{i}"))
    in_flight = peak = 0
    for kind, _ in steps:
        in_flight += 1 if kind == "F" else -1
        peak = max(peak, in_flight)
    if schedule == "1f1b" and peak > stages - stage:
        return (phrase("the most activations in flight", "بیشترین شمار فعال‌سازی‌های نگه‌داشته"),
                peak, phrase("at most {most} (num_stages - stage)",
                             "حداکثر {most} (`num_stages - stage`)", most=stages - stage))
    return None


def unsplit_reference(run: PipeRun, steps: int) -> tuple[float, dict[str, torch.Tensor]]:
    """The unsplit model on batches 0..steps-1 without zeroing: (last loss, gradients by name).

    Names are those of the layer list ("3.attn.qkv.weight"), as in `pipeline_lab`.
    """
    layers = _unsplit_layers(run)
    for step in range(steps):
        x, y = run.batch(step)
        loss = loss_function(run.model)(layers(x), y)
        loss.backward()
    return loss.item(), {name: p.grad for name, p in layers.named_parameters()}


def gradient_failures(module: nn.Module, start: int, loss, run: PipeRun, steps: int,
                      is_last: bool, *, case: Phrase, case_index: int, rank: int) -> list[Failure]:
    """Failures of this stage's gradients (and, on the last stage, its loss) against the reference."""
    expected_loss, reference = unsplit_reference(run, steps)
    where = {"case": case, "case_index": case_index, "rank": rank}
    failures = []
    returned = phrase("the loss returned by the last stage", "زیانی که مرحلهٔ آخر برگرداند")
    if is_last:
        if isinstance(loss, torch.Tensor) and loss.numel() == 1:
            loss = loss.item()
        if isinstance(loss, bool) or not isinstance(loss, (int, float)):
            failures.append(Failure("value", {**where, "what": returned, "got": repr(loss)[:60],
                                              "expected": expected_loss}))
        elif abs(loss - expected_loss) > LOSS_BOUND:
            got, expected = distinct_numbers(float(loss), expected_loss)
            failures.append(Failure("value", {**where, "what": returned, "got": got,
                                              "expected": expected}))
    for name, param in module.named_parameters():
        layer, rest = name.split(".", 1)
        full_name = f"{start + int(layer)}.{rest}"
        expected = reference[full_name]
        if param.grad is None:
            failures.append(Failure("value", {**where, "got": None,
                                              "what": phrase("the gradient of {name}", "گرادیان `{name}`",
                                                             name=full_name),
                                              "expected": phrase("a tensor", "یک تنسور")}))
            continue
        found = compare(param.grad, expected, torch.full_like(expected, GRADIENT_BOUND * steps),
                        case=case, case_index=case_index, rank=rank,
                        reference=phrase("the unsplit model on the whole batch",
                                         "مدل تقسیم‌نشده روی کل دسته"),
                        element_of=phrase("the gradient of {name}, flattened",
                                          "گرادیان تخت‌شدهٔ `{name}`", name=full_name))
        failures += [found] if found else []
    return failures

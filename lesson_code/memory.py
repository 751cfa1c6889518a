"""Memory and traffic of plain DDP and ZeRO stages 1-3 per rank (lesson 78). Pure arithmetic.

Mixed-precision Adam keeps, per parameter, 2 bytes of bf16/fp16 weights, 2 bytes of gradient and
K = 12 bytes of optimizer state (a 4-byte fp32 master copy and two 4-byte moments). With Psi
parameters on N ranks (Rajbhandari et al., 2020, section 5):

| scheme | bytes per rank               | what is sharded                          | traffic per step |
|--------|------------------------------|------------------------------------------|------------------|
| DDP    | (2 + 2 + K) Psi = 16 Psi     | nothing                                  | 2 Psi            |
| ZeRO-1 | (2 + 2) Psi + K Psi / N      | optimizer state                          | 2 Psi            |
| ZeRO-2 | 2 Psi + (2 + K) Psi / N      | optimizer state and gradients            | 2 Psi            |
| ZeRO-3 | (2 + 2 + K) Psi / N          | optimizer state, gradients, parameters   | 3 Psi            |

Traffic is in units of the parameters' size (Psi elements of the communication dtype, sent and
received per rank, up to the factor (N-1)/N that the paper rounds to 1).

    python -c "from lesson_code import memory; print(memory.memory_table(7.5e9, [8, 64]))"
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from lesson_code.harness.validate import require_choice, require_positive_int

STAGES = ("DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3")


@dataclass(frozen=True)
class Precision:
    """Bytes per parameter: of the model's weights, of its gradients, and of optimizer state (K)."""

    params: float = 2
    grads: float = 2
    optimizer: float = 12


MIXED_ADAM = Precision()                     # bf16/fp16 weights and gradients, fp32 master + moments
FP32_ADAM = Precision(params=4, grads=4, optimizer=8)  # plain fp32: the weights are the master
# What lesson 78's optimizers hold for a float32 model: its weights and gradients, and beside
# them a float32 master copy and two moments (they keep the master whatever the model's dtype).
FP32_MASTER_ADAM = Precision(params=4, grads=4, optimizer=12)


def bytes_per_rank(stage: str, params: float, world_size: int,
                   precision: Precision = MIXED_ADAM) -> dict[str, float]:
    """Bytes one rank holds for parameters, gradients and optimizer state under `stage`.

    Raises ValueError for an unknown stage or a world size below 1.
    """
    n = _check(stage, world_size)
    shard = {"DDP": (1, 1, 1), "ZeRO-1": (1, 1, n), "ZeRO-2": (1, n, n), "ZeRO-3": (n, n, n)}[stage]
    return {
        "params": precision.params * params / shard[0],
        "grads": precision.grads * params / shard[1],
        "optimizer": precision.optimizer * params / shard[2],
    }


def total_bytes(stage: str, params: float, world_size: int, precision: Precision = MIXED_ADAM) -> float:
    """The sum of `bytes_per_rank`: everything one rank holds, activations aside."""
    return sum(bytes_per_rank(stage, params, world_size, precision).values())


def memory_table(params: float, world_sizes: list[int],
                 precision: Precision = MIXED_ADAM) -> pd.DataFrame:
    """Bytes per rank of every stage for each N, with bytes per parameter and saving vs DDP.

    Columns: N, stage, params/grads/optimizer/total (bytes), bytes_per_param, saving_percent.
    """
    rows = []
    for n in world_sizes:
        ddp = total_bytes("DDP", params, n, precision)
        for stage in STAGES:
            parts = bytes_per_rank(stage, params, n, precision)
            total = sum(parts.values())
            rows.append({"N": n, "stage": stage, **parts, "total": total,
                         "bytes_per_param": total / params,
                         "saving_percent": 100 * (1 - total / ddp)})
    return pd.DataFrame(rows)


def capstone_bytes(params: int, world_size: int) -> dict[str, int]:
    """Bytes each rank of lesson 81's run holds: fp32 weights and gradients whole (4 + 4 bytes
    per parameter), and ZeRO-1's fp32 master copy and two moments (12 bytes) for its shard of
    ceil(P / N) parameters, the last shard padded to the others' length. The capstone measures
    the same from its tensors' storage (tests/dist/test_capstone.py compares them)."""
    require_positive_int("world_size", world_size, "the number of ranks, such as 4")
    shard = -(-int(params) // world_size)
    return {"parameters": 4 * int(params), "gradients": 4 * int(params), "optimizer": 12 * shard}


def traffic_per_step(stage: str, params: float, world_size: int, dtype_bytes: float = 2,
                     exact: bool = True) -> float:
    """Bytes each rank sends per training step (and receives as many) under `stage`.

    DDP: one all-reduce of the gradients; ZeRO-1/2: a reduce-scatter of the gradients plus an
    all-gather of the parameters, the same bytes; ZeRO-3: a second all-gather of the parameters
    for the backward pass. With exact=False the ring's factor (N-1)/N is rounded to 1, as in the
    paper's 2 Psi and 3 Psi. Raises ValueError for an unknown stage or a world size below 1.
    """
    _check(stage, world_size)
    factor = (world_size - 1) / world_size if exact else 1.0
    volumes = {"DDP": 2, "ZeRO-1": 2, "ZeRO-2": 2, "ZeRO-3": 3}
    return volumes[stage] * factor * params * dtype_bytes


def stage3_step(units: list[tuple[str, int]], world_size: int,
                precision: Precision = FP32_MASTER_ADAM) -> list[dict]:
    """The bytes one ZeRO-3 rank holds through a training step, event by event, as
    `lesson_code.zero3` allocates them (lesson 78a); activations and temporaries aside.

    `units`: (name, parameters) of each unit in forward order. Unit u is padded to
    N * ceil(P_u / N) elements and the rank keeps ceil(P_u / N) of them: its parameter shard
    (`precision.params` bytes each) and the fp32 master and moments (`precision.optimizer`).
    Forward gathers each unit whole, computes and frees it; backward, in reverse, gathers it again, fills
    its gradient bucket (`precision.grads` bytes per padded element), reduce-scatters it into
    the rank's gradient shard (allocated whole at the first reduce-scatter, 1/N of all
    gradients) and frees the bucket, then frees the unit. Returns the events in order, each
    {"unit", "pass", "action" ("start", "gather", "compute", "reduce-scatter", "free"),
    "change" (bytes), "held" (bytes after it)}; the first is the step's start.
    Raises ValueError for a world size below 1 or a unit without parameters.
    """
    require_positive_int("world_size", world_size, "the number of ranks, such as 8")
    shards = {}
    for name, numel in units:
        require_positive_int(f"parameters of unit {name!r}", numel, "a unit's parameter count")
        shards[name] = -(-numel // world_size)
    gradient_shard = precision.grads * sum(shards.values())
    held = (precision.params + precision.optimizer) * sum(shards.values())
    events = [{"unit": "", "pass": "", "action": "start", "change": 0, "held": held}]

    def add(name: str, when: str, action: str, change: float) -> None:
        events.append({"unit": name, "pass": when, "action": action, "change": change,
                       "held": events[-1]["held"] + change})

    for name, _ in units:
        gathered = precision.params * shards[name] * world_size
        add(name, "forward", "gather", gathered)
        add(name, "forward", "compute", 0)  # activations are not modelled
        add(name, "forward", "free", -gathered)
    for index, (name, _) in enumerate(reversed(units)):
        gathered = precision.params * shards[name] * world_size
        bucket = precision.grads * shards[name] * world_size
        add(name, "backward", "gather", gathered)
        add(name, "backward", "compute", bucket)
        add(name, "backward", "reduce-scatter", (gradient_shard if index == 0 else 0) - bucket)
        add(name, "backward", "free", -gathered)
    return events


def stage3_working_bytes(unit_params: float, precision: Precision = MIXED_ADAM,
                         reduce_bytes: float | None = None) -> float:
    """Bytes ZeRO-3 holds whole, beyond its shards, for a largest unit of `unit_params`.

    In backward, FSDP2 holds two units gathered (the one computing and the next, prefetched)
    in `precision.params`, the computing unit's unsharded gradient in `precision.grads`, and
    the previous unit's reduce-scatter input in `reduce_bytes` per element (None: the
    gradient's own `precision.grads`). That input is a copy whatever the reduction's type:
    `foreach_reduce` allocates it in `reduce_dtype` and copies the unsharded gradients into it,
    and `post_backward` keeps it until the next unit's reduction (one buffer by default). So
    bf16 weights and gradients cost 2 + 2 + 2 + 2 bytes per element with a bf16 reduction,
    2 + 2 + 2 + 4 with `MixedPrecisionPolicy(reduce_dtype=torch.float32)`. Raises ValueError
    for a negative count or a `reduce_bytes` that is not positive.
    """
    if unit_params < 0:
        raise ValueError(f"unit_params={unit_params!r} is negative: give 0 or more")
    if reduce_bytes is not None and not reduce_bytes > 0:
        raise ValueError(f"reduce_bytes={reduce_bytes!r} must be positive: the bytes per element "
                         "of the gradient's reduction, such as 4 for float32")
    copy = precision.grads if reduce_bytes is None else reduce_bytes
    return (2 * precision.params + precision.grads + copy) * unit_params


def step_bytes_per_parameter(precision: Precision = MIXED_ADAM, step_temp_bytes: float = 0.0) -> float:
    """What the optimizer step holds for a while per parameter it updates, beyond the states: an
    fp32 gradient for the fp32 master when the model's gradients are narrower (`precision.grads`
    < 4), plus `step_temp_bytes` (4 for torch.optim.Adam's default foreach path, 0 for a fused
    Adam). `choose_stage` and `stage3_peaks` both charge it. Raises ValueError for a negative
    `step_temp_bytes`."""
    if step_temp_bytes < 0:
        raise ValueError(f"step_temp_bytes={step_temp_bytes!r} is negative: give 0 for a fused "
                         "Adam, 4 for torch.optim.Adam's default foreach path")
    return (4.0 if precision.grads < 4 else 0.0) + step_temp_bytes


def stage3_peaks(params: float, world_size: int, unit_params: float, activation_bytes: float = 0.0,
                 precision: Precision = MIXED_ADAM, *, gathered_bytes: float | None = None,
                 reduce_bytes: float | None = None, step_temp_bytes: float = 0.0) -> dict[str, float]:
    """A ZeRO-3 rank's bytes at its two peaks, backward's and the optimizer step's (lesson 78a).

    Returns {"states", "backward", "step"}. "states" is `total_bytes("ZeRO-3", ...)`, the shards
    in `precision`. "backward" adds `activation_bytes` and `stage3_working_bytes` for a unit of
    `unit_params`, gathered, with its unsharded gradient, in `gathered_bytes` per element (None:
    `precision.params`, as in the ZeRO paper's 2 + 2 + 12). FSDP2 with
    `MixedPrecisionPolicy(param_dtype=torch.bfloat16)` keeps fp32 shards (`FP32_ADAM`, 4 + 4 + 8)
    but gathers in bf16 and computes bf16 gradients: `gathered_bytes=2`. "step" adds, per
    parameter the rank updates, `choose_stage`'s rule: an fp32 gradient for the master when the
    sharded gradients are narrower, plus `step_temp_bytes`. The rank fits a device when the larger
    peak does. Raises ValueError as `stage3_working_bytes` does, for a `gathered_bytes` that is not
    positive, or for negative `activation_bytes` or `step_temp_bytes`.
    """
    if activation_bytes < 0:
        raise ValueError(f"activation_bytes={activation_bytes!r} is negative: give 0 or more")
    if gathered_bytes is not None and not gathered_bytes > 0:
        raise ValueError(f"gathered_bytes={gathered_bytes!r} must be positive: the bytes per "
                         "element of a gathered unit, such as 2 for bf16")
    per_parameter = step_bytes_per_parameter(precision, step_temp_bytes)
    states = total_bytes("ZeRO-3", params, world_size, precision)
    gathered = precision.params if gathered_bytes is None else gathered_bytes
    working = stage3_working_bytes(unit_params, Precision(gathered, gathered, 0), reduce_bytes)
    return {"states": states, "backward": states + activation_bytes + working,
            "step": states + per_parameter * params / world_size}


def choose_stage(params: float, world_size: int, device_bytes: float,
                 activation_bytes: float = 0.0, precision: Precision = MIXED_ADAM, *,
                 headroom: float = 0.0, unit_params: float = 0.0,
                 reduce_bytes: float | None = None, step_temp_bytes: float = 0.0) -> str:
    """The lowest stage whose per-rank memory fits in `device_bytes`; a rule of thumb, not a law.

    A stage fits when its model states (`total_bytes`), plus `activation_bytes`, plus, under
    ZeRO-3, its working set of gathered parameters fit in (1 - headroom) * device_bytes.
    `headroom` is the fraction kept free for what no formula counts (the CUDA context, the
    allocator's fragmentation, temporaries), such as 0.1. `unit_params` is the parameter count of
    the largest unit ZeRO-3 gathers whole (a decoder layer), and `reduce_bytes` the bytes per
    element its gradient is reduced in: `stage3_working_bytes` counts what it holds whole.
    The step runs after backward has freed the activations and the gathered units, so a stage
    needs the larger of the two. Per parameter it updates (all of them under DDP, 1/N under
    ZeRO), the step holds an fp32 gradient whenever the model's gradients are narrower than
    fp32 (`precision.grads` < 4), as under MIXED_ADAM: the fp32 master copy is updated from an
    fp32 gradient, 4 bytes, whatever the kernel. torch 2.13's `_fused_adam` (optim/adam.py) groups
    parameters, gradients and moments by device and dtype and hands each group to one
    `torch._fused_adam_` kernel, which reads the gradient in the parameter's dtype (an fp32
    parameter with a bf16 gradient raises "expected scalar type Float but found BFloat16"), and
    autograd refuses a bf16 `.grad` on an fp32 parameter. So the fused step allocates nothing
    more but still needs the cast gradient. Our `ZeroOptimizer.step` makes it with
    `grad.to(torch.float32)`, and DeepSpeed's stages 1 and 2 likewise cast the rank's partition
    inside `step()` and free it after the update (stage_1_and_2.py; it stays only under CPU
    offload); Megatron-LM keeps its gradient buffer, `main_grad`, for the whole run (fp32 under
    `--accumulate-allreduce-grads-in-fp32`). An implementation that casts and steps one bucket
    at a time would hold only a bucket's worth; it is not modelled. `step_temp_bytes` is what the optimizer's kernels allocate on top, per
    parameter they update: 4 for `torch.optim.Adam`'s default multi-tensor (foreach) path, whose
    `torch._foreach_sqrt` copies the fp32 second moment, 0 (the default) for `Adam(fused=True)`.
    Stages 1 and 2 cost no extra traffic in a step of one backward pass, so the first that fits
    is taken; stage 3 adds half as much traffic again. Returns "none fits" when even ZeRO-3 does
    not fit. Raises ValueError for a headroom outside [0, 1), a negative size or a `reduce_bytes`
    that is not positive.
    """
    per_parameter = step_bytes_per_parameter(precision, step_temp_bytes)
    if not 0 <= headroom < 1:
        raise ValueError(f"headroom={headroom!r} is the fraction of device memory kept free: "
                         "give a number in [0, 1), such as 0.1")
    if activation_bytes < 0:
        raise ValueError(f"activation_bytes={activation_bytes!r} is negative: give 0 or more")
    usable = (1 - headroom) * device_bytes
    gathered_unit = stage3_working_bytes(unit_params, precision, reduce_bytes)
    for stage in STAGES:
        working = gathered_unit if stage == "ZeRO-3" else 0.0
        updated = params if stage == "DDP" else params / world_size
        step_temp = per_parameter * updated
        transient = max(activation_bytes + working, step_temp)
        if total_bytes(stage, params, world_size, precision) + transient <= usable:
            return stage
    return "none fits"


def _check(stage: str, world_size: int) -> int:
    """Return `world_size` if `stage` is one of STAGES and it is a positive int; else ValueError."""
    require_choice("stage", stage, STAGES)
    return require_positive_int("world_size", world_size, "the number of ranks, such as 8")

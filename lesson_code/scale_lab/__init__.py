"""Lesson 78 at scale: the course's DDP and ZeRO stages 1-3 on 1 to 512 simulated ranks.

A reader's machine runs 4 ranks, so whatever the lessons say of 64 or 512 ranks would be a
formula. Here the course's own code runs, unchanged, as rank r of a world of N ranks inside
this one process (`runtime.simulated.fake_rank`: torch's fake process group, where every
message completes at once without moving a byte) with its model on the meta device (tensors
with shapes and bytes but no memory and no values). What each rank holds is read from its
tensors' storage, what it sends from lesson 76's ledger (`scale_lab.step.measure_step`).

    from lesson_code import scale_lab
    table = scale_lab.sweep()                 # MiniGPT (4.8M), N = 1 ... 512, every strategy
    paper = scale_lab.paper_table()           # 7.5B parameters on 64 ranks: the ZeRO paper's
    check = scale_lab.compare_with_real()     # N = 4: simulated against 4 real gloo ranks

    python -m lesson_code.scale_lab [--lang fa]

What the simulation measures: the bytes of parameters, gradients, optimizer state and buffers
each rank keeps, the peak of what it holds at once (`scale_lab.storages`), and the bytes and
messages it sends. What it cannot: time, bandwidth, contention, and the buffers NCCL or gloo
allocate for themselves; and values: under the fake group nothing a rank receives is real.
`compare_with_real` checks it at N = 4 against real ranks: the same bytes exactly, and (ranks
on threads of this process, `runtime.simulated.run_threads`, which move real data) the same
parameters after a step.
"""

from __future__ import annotations

from dataclasses import replace

import pandas as pd
import torch

from lesson_code import launch, memory, zero_lab
from lesson_code.ddp import bucket_groups
from lesson_code.experiment import DTYPES, flat_parameters
from lesson_code.models import GPTConfig, MiniGPT
from lesson_code.runtime import simulated
from lesson_code.scale_lab.step import (KINDS, STRATEGIES, SWEEP_GPT, ScaleRun, measure_step,
                                        measure_steps)
from lesson_code.zero3 import default_units

SWEEP_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
PHASES = ("building", "forward", "backward", "optimizer")  # as measure_step names them
PEAK_PARTS = {"building": "made before the step GB", "forward": "made in the forward GB",
              "backward": "made in the backward GB", "optimizer": "made in the optimizer GB"}
RANK_CHOICES = ("last", "ends", "all")
# A GPT shape with 7,499,636,736 parameters (the paper's 7.5B to 0.005%): 36 blocks of width
# 4096 with 32 heads of 128, a vocabulary of 30,000 and a context of 1024 tokens.
PAPER_GPT = GPTConfig(vocab_size=30000, context=1024, n_layer=36, n_embd=4096, n_head=32)
PAPER_WORLD_SIZE = 64
# One sequence per rank; buckets of 5e8 bf16 elements (1e9 bytes, in the MiB that bucket_cap_mb
# counts), DeepSpeed's default reduce_bucket_size: fewer, larger messages than torch's 25 MB,
# which the simulation also runs faster. No byte held after the step depends on the bucket
# size; the step's peak does (a bucket being filled is one of its parts).
PAPER_RUN = ScaleRun(gpt=PAPER_GPT, bucket_cap_mb=5e8 * 2 / 2 ** 20)
# Rajbhandari et al. 2020, Figure 1: GB per rank (1 GB = 1e9 bytes) for
# Psi = 7.5B, N = 64, mixed-precision Adam (K = 12), and the decimals the paper prints.
PAPER_GB = {"DDP": 120.0, "ZeRO-1": 31.4, "ZeRO-2": 16.6, "ZeRO-3": 1.9}
PAPER_DECIMALS = {"DDP": 0, "ZeRO-1": 1, "ZeRO-2": 1, "ZeRO-3": 1}
# What the paper, and `memory`'s formulas, count per rank, as the course's tensors: the
# weights (ZeRO-3: the rank's shards of them), one gradient (whole under DDP and ZeRO-1, the
# rank's shard under ZeRO-2 and 3) and the optimizer's fp32 master and moments. Whatever else
# a rank holds is beyond the formulas.
FORMULA_ITEMS = {
    "DDP": ("parameters: weights", "gradients: .grad", "optimizer: fp32 master",
            "optimizer: moments"),
    "ZeRO-1": ("parameters: weights", "gradients: .grad", "optimizer: fp32 master",
               "optimizer: moments"),
    "ZeRO-2": ("parameters: weights", "gradients: shard", "optimizer: fp32 master",
               "optimizer: moments"),
    "ZeRO-3": ("parameters: shards", "gradients: shard", "optimizer: fp32 master",
               "optimizer: moments"),
}


def chosen_ranks(world_size: int, ranks: str | list[int]) -> list[int]:
    """The ranks to simulate: "last" (it holds the padding, if any), "ends" (0 and N-1, the
    longest and shortest chunk of an unpadded ring), "all", or a list of ranks.
    Raises ValueError for another choice or a rank outside 0..N-1."""
    if isinstance(ranks, str):
        choice = {"last": [world_size - 1], "ends": sorted({0, world_size - 1}),
                  "all": list(range(world_size))}
        if ranks not in choice:
            raise ValueError(f"unknown ranks {ranks!r}: use one of {', '.join(RANK_CHOICES)}, "
                             "or a list of ranks")
        return choice[ranks]
    outside = [r for r in ranks if not 0 <= r < world_size]
    if outside:
        raise ValueError(f"ranks {outside} are not in 0..{world_size - 1}: pass ranks of the "
                         f"{world_size} simulated ranks")
    return list(ranks)


def simulate(run: ScaleRun, world_size: int, ranks: str | list[int] = "last") -> list[dict]:
    """`measure_step` of `run` as each of `ranks` of `world_size` simulated ranks, one after
    another in this process (`fake_rank`, meta device): what each held, its peak, its traffic.
    Raises ValueError for a bad world size or ranks; RuntimeError inside a real rank."""
    rows = []
    for rank in chosen_ranks(world_size, ranks):
        with simulated.fake_rank(world_size, rank):
            rows.append(measure_step(rank, world_size, run, shapes_only=True))
    return rows


def precision_of(run: ScaleRun) -> memory.Precision:
    """The bytes per parameter `memory`'s formulas take for `run`'s model dtype."""
    return memory.MIXED_ADAM if run.dtype == "bfloat16" else memory.FP32_MASTER_ADAM


def dtype_bytes_of(run: ScaleRun) -> int:
    """Bytes of one element of `run`'s model dtype: what its gradients travel in."""
    return torch.finfo(DTYPES[run.dtype]).bits // 8


def counted_bytes(strategy: str, row: dict) -> dict[str, int]:
    """The bytes of `row` (a `measure_step` result) that `memory`'s formulas count, by their
    parts: {"params", "grads", "optimizer"} (`FORMULA_ITEMS`)."""
    parts = {"params": "parameters", "grads": "gradients", "optimizer": "optimizer"}
    return {part: sum(row["held"][item] for item in FORMULA_ITEMS[strategy]
                      if item.startswith(kind)) for part, kind in parts.items()}


def exact_formula(strategy: str, parameters: int, world_size: int, shard_numel: int,
                  precision: memory.Precision) -> dict[str, float]:
    """`memory.bytes_per_rank` with each part the stage shards taken over the rank's real shard
    (`shard_numel` elements: ceil(Psi / N), or a sum of such per bucket or unit, the flat
    vectors padded so that N divides them) instead of Psi / N; the other parts over Psi. What
    a rank that holds exactly what the formula says, and nothing else, holds."""
    whole = memory.bytes_per_rank(strategy, parameters, 1, precision)
    split = memory.bytes_per_rank(strategy, parameters, world_size, precision)
    return {part: getattr(precision, part) * (shard_numel if split[part] != whole[part]
                                               else parameters) for part in whole}


def padded_shard(run: ScaleRun, strategy: str, world_size: int) -> int:
    """Elements of one rank's optimizer state as each stage's formula pads it, from the model's
    parameter sizes and N alone (never from the optimizer being checked): every parameter under
    DDP; ceil(Psi / N) of ZeRO-1's one flat vector; ceil(size / N) summed over ZeRO-2's buckets
    (lesson 77's rule, in reverse registration order) and over ZeRO-3's units."""
    with torch.device("meta"):
        model = MiniGPT(run.gpt)
    sizes = [p.numel() for p in model.parameters() if p.requires_grad]
    if strategy == "DDP":
        return sum(sizes)
    if strategy == "ZeRO-1":
        flat = [sum(sizes)]
    elif strategy == "ZeRO-2":
        sizes = sizes[::-1]
        flat = [sum(sizes[i] for i in bucket) for bucket in bucket_groups(
            [size * dtype_bytes_of(run) for size in sizes], int(run.bucket_cap_mb * 2 ** 20))]
    else:
        flat = [sum(p.numel() for p in unit.parameters() if p.requires_grad)
                for unit in default_units(model)]
    return sum(-(-size // world_size) for size in flat)


def mismatches(table: pd.DataFrame) -> pd.DataFrame:
    """The rows of a `sweep` where what the formulas count differs from what the rank holds of
    it (`counted` != `expected`, part by part): an optimizer that keeps more state than its
    stage shards, a gradient kept whole where the stage shards it. Empty when all agree."""
    return table[~table["matches"]]


def sweep(run: ScaleRun = ScaleRun(), world_sizes=SWEEP_SIZES, strategies=tuple(STRATEGIES),
          ranks: str | list[int] = "last") -> pd.DataFrame:
    """Every strategy on each world size, measured, beside `memory`'s formulas: one row per
    (N, strategy, rank simulated).

    Columns: N, strategy, rank; measured bytes held after the step by kind (parameters,
    gradients, optimizer, buffers) and `model_states` (the first three); `counted` (what of
    them the formulas count: `FORMULA_ITEMS`), `expected` (`exact_formula`: the formula over
    the padded shard `padded_shard` computes from the model and N, not the optimizer's) and
    `matches` (every part of counted equals expected);
    `formula` (memory.total_bytes: weights, gradients and optimizer state), `peak` (bytes live at once during
    the step) with `peak_in` (its phase) and `setup_peak`; `sent` (bytes this rank sent in the step) beside
    `formula_sent` (memory.traffic_per_step, exact ring factor), `messages_sent`, `padding`
    (elements of this rank's shards that are padding), `shard_numel` (elements of its
    optimizer state: the padded shard, or every parameter) and `scalar_reads` (values read
    from meta tensors, which have none: answered 0). One rank by default: the last.
    """
    parameters, precision, dtype_bytes = run.parameters, precision_of(run), dtype_bytes_of(run)
    rows = []
    for world_size in world_sizes:
        for strategy in strategies:
            for row in simulate(replace(run, strategy=strategy), world_size, ranks):
                kinds = row["by_kind"]
                counted = counted_bytes(strategy, row)
                expected = exact_formula(strategy, parameters, world_size,
                                         padded_shard(run, strategy, world_size), precision)
                rows.append({
                    "N": world_size, "strategy": strategy, "rank": row["rank"], **kinds,
                    "model_states": kinds["parameters"] + kinds["gradients"] + kinds["optimizer"],
                    "counted": sum(counted.values()), "expected": sum(expected.values()),
                    "matches": counted == expected,
                    "formula": memory.total_bytes(strategy, parameters, world_size, precision),
                    "peak": row["peak"], "peak_in": row["peak_in"],
                    "setup_peak": row["setup_peak"], "sent": row["sent"],
                    "formula_sent": memory.traffic_per_step(strategy, parameters, world_size,
                                                            dtype_bytes),
                    "messages_sent": row["messages_sent"], "padding": row["padding"],
                    "shard_numel": row["shard_numel"], "scalar_reads": row["scalar_reads"]})
    return pd.DataFrame(rows)


def paper_table(world_size: int = PAPER_WORLD_SIZE, run: ScaleRun = PAPER_RUN,
                rank: int | None = None) -> pd.DataFrame:
    """The ZeRO paper's Figure 1 row (7.5B parameters, 64 ranks) from running code: each
    strategy's step on rank `rank` (the last by default) of `world_size` simulated ranks.

    One row per strategy, indexed by it: `paper_GB` (the paper's figure), `formula_GB`
    (memory.total_bytes), `measured_GB` (the tensors the paper counts: `FORMULA_ITEMS`),
    `agrees` (measured rounded as the paper rounds equals the paper), `held_GB` (everything
    the rank keeps after the step), `beyond` ({held item: bytes} the paper does not count),
    `peak_GB` with `peak_in` (its phase), `peak_at` (the course's functions running then) and
    `at_peak_<phase>_GB` (what was live then, by the phase that made it: `PHASES`),
    `forward_end_GB` (the bytes made in the forward and live when it ends: the activations
    the backward will need, the logits and the loss's temporaries),
    `setup_peak_GB` with `setup_peak_at`, `sent_GB` beside `formula_sent_GB`, and `padding`
    (elements).
    GB are 1e9 bytes, as the paper's.
    """
    parameters, precision, dtype_bytes = run.parameters, precision_of(run), dtype_bytes_of(run)
    rank = world_size - 1 if rank is None else rank
    rows = {}
    for strategy in STRATEGIES:
        row = simulate(replace(run, strategy=strategy), world_size, [rank])[0]
        counted = sum(counted_bytes(strategy, row).values())
        decimals = PAPER_DECIMALS[strategy]
        rows[strategy] = {
            "paper_GB": PAPER_GB[strategy],
            "formula_GB": memory.total_bytes(strategy, parameters, world_size, precision) / 1e9,
            "measured_GB": counted / 1e9,
            "agrees": round(counted / 1e9, decimals) == PAPER_GB[strategy],
            "held_GB": sum(row["held"].values()) / 1e9,
            "beyond": {item: nbytes for item, nbytes in row["held"].items()
                       if nbytes and item not in FORMULA_ITEMS[strategy]},
            "peak_GB": row["peak"] / 1e9, "peak_in": row["peak_in"], "peak_at": row["peak_at"],
            **{f"at_peak_{phase}_GB": row["peak_by_phase"].get(phase, 0) / 1e9
               for phase in PHASES},
            "forward_end_GB": row["forward_end_by_phase"].get("forward", 0) / 1e9,
            "setup_peak_GB": row["setup_peak"] / 1e9, "setup_peak_at": row["setup_peak_at"],
            "sent_GB": row["sent"] / 1e9,
            "formula_sent_GB": memory.traffic_per_step(strategy, parameters, world_size,
                                                       dtype_bytes) / 1e9,
            "padding": row["padding"]}
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "strategy"
    table.attrs.update(parameters=parameters, world_size=world_size, rank=rank)
    return table


def paper_summary(table: pd.DataFrame) -> pd.DataFrame:
    """`paper_table` as a table to show: GB per rank by the paper, by the formula and measured
    (what the paper counts), whether they agree, what the rank holds beyond the paper's count,
    and the peaks in the step and while building (numbers and booleans only)."""
    return pd.DataFrame({
        "paper GB": table.paper_GB, "formula GB": table.formula_GB.round(2),
        "measured GB": table.measured_GB.round(2), "agrees": table.agrees,
        "beyond the paper GB": table.beyond.map(lambda items: sum(items.values()) / 1e9).round(3),
        "peak in the step GB": table.peak_GB.round(1),
        "peak during setup GB": table.setup_peak_GB.round(1)})


def peak_summary(table: pd.DataFrame) -> pd.DataFrame:
    """The step's peak of each strategy of `paper_table` taken apart (GB): the bytes live at the
    peak by the phase that made their storage (made before the step, while building, and still
    there; made in the forward: the activations not yet freed; in the backward; in the
    optimizer's step), the peak, and the innermost of the course's functions running at it
    (the last of `peak_at`)."""
    shown = pd.DataFrame({label: table[f"at_peak_{phase}_GB"].round(2)
                          for phase, label in PEAK_PARTS.items()})
    shown["peak in the step GB"] = table.peak_GB.round(2)
    shown["peak at"] = table.peak_at.str.split(" > ").str[-1]
    return shown


def sweep_summary(table: pd.DataFrame) -> pd.DataFrame:
    """A `sweep` as a table to show, one row per (N, strategy): MB of model state held after
    the step beside the formula's, MB and messages sent in the step beside the formula's MB,
    whether the tensors the formulas count hold exactly the formula over the rank's real shard
    (`matches`, shown as "formula's tensors exact"), and the MB
    live at once at the peak of the step and while building (all a rank holds: model state,
    buffers, activations, temporaries)."""
    shown = pd.DataFrame({
        "N": table.N, "strategy": table.strategy,
        "MB model state": (table.model_states / 1e6).round(2),
        "formula MB": (table.formula / 1e6).round(2),
        "MB sent": (table.sent / 1e6).round(2), "formula MB sent": (table.formula_sent / 1e6).round(2),
        "messages sent": table.messages_sent, "formula's tensors exact": table.matches,
        "MB peak in the step": (table.peak / 1e6).round(2),
        "MB peak during setup": (table.setup_peak / 1e6).round(2)})
    return shown.set_index(["N", "strategy"])


def check_summary(check: pd.DataFrame) -> pd.DataFrame:
    """`compare_with_real` per strategy, over its ranks: whether every rank's held bytes, sent
    bytes, messages and peak equal the real rank's, the largest peak difference (bytes), the
    largest |profiler's peak - tracker's peak| / tracker's peak on the real ranks, and
    on threads the largest difference and the `grad_distance` of the averaged gradient, and the
    largest parameter difference and `distance` (shown as `parameter distance`) after the step."""
    check = check.assign(profiler_difference=(check.profiler_peak - check.real_peak).abs()
                         / check.real_peak)
    by = check.groupby(level="strategy", sort=False)
    return pd.DataFrame({
        "held equal": by.held_equal.all(), "sent equal": by.sent_equal.all(),
        "messages equal": by.messages_equal.all(), "peak equal": by.peak_equal.all(),
        "peak difference, bytes": by.peak_difference.max(),
        "profiler's peak, largest relative difference": by.profiler_difference.max(),
        "largest gradient difference": by.max_grad_diff.max(),
        "gradient distance": by.grad_distance.max(),
        "largest parameter difference": by.max_param_diff.max(),
        "parameter distance": by.distance.max()})


def value_run(run: ScaleRun) -> ScaleRun:
    """`run` as the values check runs it: DDP with torch's all-reduce. Lesson 77's DDP runs
    its ring on a thread of its own, which a simulated rank's thread cannot lend its process
    group to; ZeRO's rings run on the rank's own thread."""
    return replace(run, comm="builtin") if run.strategy == "DDP" else run


# A small MiniGPT for the check against real ranks: real ranks compute, so keep it quick.
CHECK_RUN = ScaleRun(gpt=GPTConfig(n_embd=64, n_layer=2, n_head=4, context=16),
                     sequences_per_rank=2)


def compare_with_real(run: ScaleRun = CHECK_RUN, world_size: int = 4,
                      strategies=tuple(STRATEGIES)) -> pd.DataFrame:
    """The simulation against `world_size` real ranks (`launch.spawn` with gloo, on the CPU as
    the simulation is) for each strategy of `run`, one row per (strategy, rank), indexed by them.

    Bytes: every rank simulated with `simulate` (fake group, meta device) beside the same
    rank of the real run: `held_equal` (every held item), `peak_equal`, `sent_equal`,
    `messages_equal`, with the simulated figures (`held`, `peak`, `sent`, `messages_sent`) and
    `peak_difference` (simulated - real), and the phase each peak fell in (`peak_in`,
    `real_peak_in`); `real_peak` beside `profiler_peak`, the real rank's step peak as torch's
    profiler saw it (a second instrument: what torch's allocator allocates on the rank's own
    thread, without kernels' scratch, which the tracker cannot see; it never sees the batch's
    targets allocated, which the tracker counts from the forward on, and it sees small
    allocations no operation returns). A bfloat16 run's peaks may
    differ when activations are live at the peak: torch's meta kernel keeps LayerNorm's mean
    and 1/std in float32, as its CUDA kernel does, where its CPU kernel keeps them in bfloat16
    (2 bytes more per token for each, for each LayerNorm).
    Values: the same step on ranks that are threads of this process moving real data
    (`run_threads`, DDP with torch's all-reduce: `value_run`) beside the real ranks running
    that same step: `max_grad_diff` and `grad_distance` (the largest |difference| of the
    averaged gradient the rank holds, `step.averaged_gradient_of`, and ||simulated - real|| /
    ||real||: a gradient summed instead of averaged ends 3 away on 4 ranks, which one Adam step
    from zero moments would hide), `max_param_diff` (the largest |difference| of the parameters
    after the step), `moved` (the largest |change| of a parameter in the real step), `distance`
    (||simulated - real|| / ||real - start||: how far apart the two end, as a fraction of how
    far the real step went; the course's tests bound it), and the flat parameters
    `params_simulated`, `params_real`, `params_start` for a closer look.
    """
    runs = [replace(run, strategy=s) for s in strategies]
    values = [value_run(r) for r in runs]
    real = launch.spawn(measure_steps, runs + values, False, True, world_size=world_size,
                        backend="gloo")  # real tensors, and the profiler on every rank
    threads = simulated.run_threads(measure_steps, values, world_size=world_size)
    start = flat_parameters(zero_lab.run_model(run.zero_run(world_size))).to(torch.float64)
    rows = {}
    for index, current in enumerate(runs):
        for rank, fake in enumerate(simulate(current, world_size, "all")):
            ours, theirs = real[rank][index], real[rank][len(runs) + index]
            simulated_params = threads[rank][index]["params"]
            simulated_grad = threads[rank][index]["averaged_gradient"]
            rows[(current.strategy, rank)] = {
                "held_equal": fake["held"] == ours["held"], "peak_equal": fake["peak"] == ours["peak"],
                "sent_equal": fake["sent"] == ours["sent"],
                "messages_equal": fake["messages_sent"] == ours["messages_sent"],
                "held": sum(fake["held"].values()), "peak": fake["peak"],
                "peak_in": fake["peak_in"], "real_peak_in": ours["peak_in"],
                "real_peak": ours["peak"], "profiler_peak": ours["profiler_peak"],
                "peak_difference": fake["peak"] - ours["peak"], "sent": fake["sent"],
                "messages_sent": fake["messages_sent"],
                "max_param_diff": (simulated_params - theirs["params"]).abs().max().item(),
                "moved": (theirs["params"] - start).abs().max().item(),
                "distance": ((simulated_params - theirs["params"]).norm()
                             / (theirs["params"] - start).norm()).item(),
                "max_grad_diff": (simulated_grad - theirs["averaged_gradient"]).abs().max().item(),
                "grad_distance": ((simulated_grad - theirs["averaged_gradient"]).norm()
                                  / theirs["averaged_gradient"].norm()).item(),
                "params_simulated": simulated_params, "params_real": theirs["params"],
                "params_start": start}
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.names = ["strategy", "rank"]
    return table


def measured_points(table: pd.DataFrame | None = None, run: ScaleRun = ScaleRun()) -> dict:
    """Plain data for lesson 78's memory calculator to show beside its formulas: the model
    simulated (its shape and parameter count, the dtype), and per strategy the measured points
    [{"N", "model_states", "held", "peak", "sent"}] (bytes) of `table` (default: `sweep()` of
    `run`, the last rank of each N)."""
    table = sweep(run) if table is None else table
    points = {strategy: [{"N": int(row.N), "model_states": int(row.model_states),
                          "held": int(row.model_states + row.buffers), "peak": int(row.peak),
                          "sent": int(row.sent)}
                         for row in rows.sort_values("N").itertuples()]
              for strategy, rows in table.groupby("strategy", sort=False)}
    config = run.gpt
    return {"model": {"vocab_size": config.vocab_size, "context": config.context,
                      "n_layer": config.n_layer, "n_embd": config.n_embd,
                      "n_head": config.n_head, "parameters": run.parameters},
            "dtype": run.dtype, "points": points}


__all__ = ["CHECK_RUN", "FORMULA_ITEMS", "KINDS", "PAPER_GB", "PAPER_GPT", "PAPER_RUN",
           "PEAK_PARTS", "PHASES", "STRATEGIES", "SWEEP_GPT", "SWEEP_SIZES", "ScaleRun",
           "check_summary", "chosen_ranks", "compare_with_real", "counted_bytes", "exact_formula",
           "measure_step", "measured_points", "mismatches", "padded_shard", "paper_summary",
           "paper_table", "peak_summary", "precision_of", "simulate", "sweep", "sweep_summary", "value_run"]

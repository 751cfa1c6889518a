"""ZeRO-2 and ZeRO-3 on real gloo ranks, against one-process Adam and torch's FSDP2 (fully_shard).

Tolerances (float32, 10 Adam steps, lr 1e-2), derived as in test_zero.py:
- ranks among themselves: bitwise equal after every step (same digests): one rank updates each
  shard, and every rank gathers the same shards;
- against torch.optim.Adam on one process on the whole batch (computed in a one-rank process,
  with the ranks' single thread) and against FSDP2 on the same model, seeds and data: MLP within
  1e-5. Our adam_update is torch's single-tensor Adam operation for operation, so the runs
  differ mainly in the order the batch's gradient is summed (N partial sums, reduced by our ring
  here, by gloo's reduce-scatter in FSDP2; one matmul over the batch on one process; the
  matmuls' shapes differ too, so a library may block them differently). Whatever its order, a
  float32 sum of the batch's n = 24 terms lies within (n - 1) u sum|terms| of the exact sum
  (u = 2**-24), so two orders differ by a relative 46 u kappa = 2.7e-6 kappa (kappa =
  sum|terms| / |sum|). Adam's step lr * m / (sqrt(v) + eps) moves by up to about 2 lr delta
  for a relative error delta that varies from step to step (m and sqrt(v) each carry it): 10
  steps x 2 x 1e-2 x 2.7e-6 kappa = 5.5e-7 kappa, within 1e-5 for kappa up to about 18. That is
  an estimate (it leaves out how one step's difference changes the next gradients); what
  carries the bound is that the runs stay about 75 times below it, while a wrong ZeRO-3 misses
  its own comparison by orders of magnitude;
- MiniGPT: within 1e-4 except the attention key biases (true gradient zero: see test_ddp.py),
  and the whole run within `tolerances.relative_distance`, which the wrong variants break.

Memory is measured by `harness.allocations.AllocationTrace` (torch's allocator, as its profiler
reports it). Its exact figures carry a slack of SLACK bytes: a few small tensors (the loss, the
pickled layouts `broadcast_parameters` compares) are freed by gloo on its own thread, where the
profiler does not see the free.
"""

from dataclasses import replace

import pytest
import torch

from lesson_code import launch, memory, zero_exercises, zero_lab
from lesson_code.ddp_lab import each_run
from lesson_code.harness.reference import in_one_rank
from lesson_code.models import count_parameters
from lesson_code.zero_lab import (MEMORY_RUN, STAGE_OPTIMIZERS, ZeroRun, run_model,
                                  train_on_rank, train_single_process)
from tolerances import FLOAT32_RELATIVE, relative_distance
from test_zero import assert_close_to, assert_ranks_identical, initial_parameters
from wrong_variants import WRONG_ZERO3, train_wrong_zero3

GPT_PARAMETERS = 30080  # its units: embedding 2560, blocks 12704, head 2112: divisible by 2, 4
SMALL_BUCKETS = 0.01  # MiB: the MLP's buckets hold 714 (padded to 716 on 4 ranks), 4096, 2112
SLACK = 64 * 1024


@pytest.fixture(scope="module")
def mlp_reference():
    return in_one_rank(train_single_process, ZeroRun())


def by_run(per_rank: list[list[dict]], names: list[str]) -> dict[str, list[dict]]:
    """each_run's results (per rank, a list over runs) as {run name: results per rank}."""
    return {name: [ranks[index] for ranks in per_rank] for index, name in enumerate(names)}


@pytest.mark.parametrize("world_size", [2, 4])
def test_stages_2_and_3_equal_adam_and_fsdp2(world_size, mlp_reference):
    names = ["zero2", "zero3", "fsdp2"]
    runs = [ZeroRun(optimizer=name, bucket_cap_mb=SMALL_BUCKETS) for name in names]
    results = by_run(launch.spawn(each_run, train_on_rank, runs, world_size=world_size), names)
    for name in names:
        assert_ranks_identical(results[name])
        assert_close_to(results[name][0], mlp_reference, ZeroRun())
    assert (results["zero3"][0]["params"] - results["fsdp2"][0]["params"]).abs().max() < 1e-5


def test_minigpt_under_stages_2_and_3_and_fsdp2():
    run = ZeroRun(model="gpt", bucket_cap_mb=SMALL_BUCKETS)
    reference = in_one_rank(train_single_process, run)
    names = ["zero2", "zero3", "fsdp2"]
    runs = [replace(run, optimizer=name) for name in names]
    results = by_run(launch.spawn(each_run, train_on_rank, runs, world_size=4), names)
    for name in names:
        assert_ranks_identical(results[name])
        assert_close_to(results[name][0], reference, run)
    distance = relative_distance(results["zero3"][0]["params"], results["fsdp2"][0]["params"],
                                 initial_parameters(run))
    assert distance < FLOAT32_RELATIVE, distance


def train_every_wrong_zero3(rank, world_size, run):
    """Each of the wrong ZeRO-3 variants trains `run`, one after another in one group."""
    return [train_wrong_zero3(rank, world_size, run, variant) for variant in WRONG_ZERO3]


def test_a_missing_gather_or_reduction_fails_the_same_comparison():
    run = ZeroRun(model="gpt", optimizer="zero3")
    reference = in_one_rank(train_single_process, run)
    per_rank = launch.spawn(train_every_wrong_zero3, run, world_size=4)
    for variant, results in by_run(per_rank, list(WRONG_ZERO3)).items():
        assert_ranks_identical(results)  # the ranks agree: only the reference can tell
        distance = relative_distance(results[0]["params"], reference["params"],
                                     initial_parameters(run))
        assert distance > 0.1 > FLOAT32_RELATIVE, (variant, distance)
        with pytest.raises(AssertionError):
            assert_close_to(results[0], reference, run)


def test_a_gather_into_a_new_buffer_fails_in_backward():
    # Why _gather refills the storage it freed: backward reads the weights through the views
    # autograd saved in forward, and those still point at the old, 0-byte storage.
    run = ZeroRun(optimizer="zero3", steps=1)
    message = r"setStorage: .* out of bounds for storage of size 0"
    with pytest.raises(launch.RankFailedError, match=message):
        launch.spawn(train_wrong_zero3, run, "elsewhere", world_size=2)


def test_bfloat16_on_one_rank_is_master_adam_bit_for_bit():
    # One code path: the same bf16 forward and backward on one thread, a one-rank reduce-scatter
    # (a copy, divided by 1) and the same `adam_update` on the same fp32 master values.
    run = ZeroRun(dtype="bfloat16")
    reference = in_one_rank(train_single_process, run)
    names = ["zero2", "zero3"]
    runs = [replace(run, optimizer=name, bucket_cap_mb=SMALL_BUCKETS) for name in names]
    for name, results in by_run(launch.spawn(each_run, train_on_rank, runs, world_size=1),
                                names).items():
        assert torch.equal(results[0]["params"], reference["params"]), name


def measure_stages(rank, world_size):
    """What the module's memory, traffic and timeline tests read, from one group of ranks:
    the peak memory of each stage (MEMORY_RUN), the ledger of one MiniGPT step under DDP, ZeRO-2
    and ZeRO-3, and the timeline of a ZeRO-3 step."""
    peaks = {stage: zero_lab.peak_memory(rank, world_size, replace(MEMORY_RUN, optimizer=name))
             for stage, name in STAGE_OPTIMIZERS.items()}
    one_step = ZeroRun(model="gpt", steps=1, bucket_cap_mb=SMALL_BUCKETS)
    ledgers = {name: train_on_rank(rank, world_size, replace(one_step, optimizer=name))["ledger"]
               for name in ("ddp", "zero2", "zero3")}
    accumulated = {name: zero_exercises.accumulation_traffic(rank, world_size,
                                                       replace(one_step, optimizer=name), (1, 3))
                   for name in ("zero", "zero2")}
    return {"peaks": peaks, "ledgers": ledgers, "accumulated": accumulated,
            "timeline": zero_lab.stage3_timeline(rank, world_size)}


@pytest.fixture(scope="module", params=[2, 4])
def measured(request):
    return request.param, launch.spawn(measure_stages, world_size=request.param)


def test_each_stage_holds_what_it_shards(measured):
    n, ranks = measured
    p = count_parameters(run_model(MEMORY_RUN))  # float32: 4 bytes, the master and moments 12
    held = {"DDP": 16 * p, "ZeRO-1": 4 * p + 12 * p // n, "ZeRO-2": 4 * p + 12 * p // n,
            "ZeRO-3": 16 * p // n}
    gradients = {"DDP": 4 * p, "ZeRO-1": 4 * p, "ZeRO-2": 4 * p // n, "ZeRO-3": 4 * p // n}
    for rank in ranks:
        for stage, row in rank["peaks"].items():
            assert 0 <= row["at_start"] - held[stage] - row["buffers"] <= SLACK, (stage, row)
            assert 0 <= row["after_backward"] - gradients[stage] <= SLACK, (stage, row)


def test_stage_2_peaks_below_stage_1_by_the_gradients_it_does_not_hold(measured):
    n, ranks = measured
    p = count_parameters(run_model(MEMORY_RUN))
    for rank in ranks:
        peak = {stage: row["peak"] for stage, row in rank["peaks"].items()}
        assert peak["ZeRO-1"] - peak["ZeRO-2"] >= 4 * p * (n - 1) // n, peak
        assert peak["DDP"] > peak["ZeRO-1"] > peak["ZeRO-2"] > peak["ZeRO-3"], peak
        for stage, row in rank["peaks"].items():  # the formula leaves things out, never more
            assert row["peak"] > memory.total_bytes(stage, p, n, memory.FP32_MASTER_ADAM)
        block = 4 * 198272  # a block's bytes: gathered whole, from P/N on each rank
        assert 0 <= rank["peaks"]["ZeRO-3"]["largest_gather"] - block <= SLACK


def test_stage_3_moves_one_and_a_half_times_what_ddp_moves(measured):
    n, ranks = measured
    gradient_bytes = 4 * GPT_PARAMETERS
    for rank in ranks:
        ddp, zero2, zero3 = (rank["ledgers"][name] for name in ("ddp", "zero2", "zero3"))
        ddp_bytes = ddp["all_reduce"]["bytes_sent"]
        assert ddp_bytes == 2 * (n - 1) * gradient_bytes // n
        zero2_bytes = zero2["reduce_scatter"]["bytes_sent"] + zero2["all_gather"]["bytes_sent"]
        assert zero2_bytes == ddp_bytes
        assert zero3["all_gather"]["bytes_sent"] == 2 * (n - 1) * gradient_bytes // n
        assert zero3["reduce_scatter"]["bytes_sent"] == (n - 1) * gradient_bytes // n
        assert zero3["all_gather"]["calls"] == 2 * zero3["reduce_scatter"]["calls"] == 2 * 4
        total = zero3["all_gather"]["bytes_sent"] + zero3["reduce_scatter"]["bytes_sent"]
        assert 2 * total == 3 * ddp_bytes


def test_under_accumulation_stage_1_reduces_once_and_stage_2_once_per_backward(measured):
    n, ranks = measured
    one_pass = (n - 1) * 4 * GPT_PARAMETERS // n  # a reduce-scatter or an all-gather, fp32
    for rank in ranks:
        assert rank["accumulated"]["zero"] == {1: 2 * one_pass, 3: 2 * one_pass}
        assert rank["accumulated"]["zero2"] == {1: 2 * one_pass, 3: (3 + 1) * one_pass}


def test_the_stage_3_timeline_gathers_computes_and_frees_each_layer(measured):
    n, ranks = measured
    timeline = ranks[0]["timeline"]
    units = ["embed", "blocks.0", "blocks.1", "blocks.2", "blocks.3", "head"]
    assert timeline["units"] == units
    events = timeline["events"]
    forward = [(e["unit"], e["action"]) for e in events if e["pass"] == "forward"]
    assert forward == [(unit, action) for unit in units for action in ("gather", "compute", "free")]
    backward = [e for e in events if e["pass"] == "backward"]
    for unit in units:
        actions = [e["action"] for e in backward if e["unit"] == unit]
        assert actions == ["gather", "compute", "reduce-scatter", "free"], (unit, actions)
    reduced = [e["unit"] for e in backward if e["action"] == "reduce-scatter"]
    assert reduced == units[::-1]
    assert all(a["start_ms"] <= b["start_ms"] for a, b in zip(events, events[1:]))
    peak = max(live for _, live in timeline["memory"])
    assert peak == timeline["peak"] >= max(e["live_end"] for e in events)
    block_bytes = 4 * 198272
    for gather in (e for e in events if e["action"] == "gather" and e["unit"].startswith("blocks")):
        assert gather["live_end"] - gather["live_start"] >= block_bytes  # the layer, whole


def rank_errors(rank, world_size):
    """The errors of stages 2 and 3 for a step before backward and for a backward that leaves
    out a layer on every rank."""
    messages = []
    for name in ("zero2", "zero3"):
        run = ZeroRun(optimizer=name)
        model, optimizer = zero_lab.build_optimizer(run, run_model(run), rank, world_size)
        try:
            optimizer.step()
        except RuntimeError as error:
            messages.append(str(error))
        x, _ = run.local_batch(0, rank, world_size)
        try:
            model.layers[0](x).sum().backward()  # the other layers get no gradient
        except RuntimeError as error:
            messages.append(str(error))
    return messages


def test_a_step_before_backward_and_a_layer_left_out_are_errors_on_every_rank():
    for messages in launch.spawn(rank_errors, world_size=2, timeout_s=60):
        assert len(messages) == 4, messages
        for before, left_out in (messages[0:2], messages[2:4]):
            assert "call loss.backward() before step()" in before
            assert "without every gradient" in left_out and "take part in the loss" in left_out


def test_the_stage_3_model_gives_each_gather_reduce_scatter_and_free_its_bytes(measured):
    # memory.stage3_step (lesson 78a's model, and its explorer's) against the measured step: the
    # same events in the same order, and the same change of the bytes held at each of them but
    # the computations, which allocate activations and temporaries the model leaves out.
    n, ranks = measured
    model = memory.stage3_step(zero_lab.stage3_units(), n)
    for rank in ranks:
        timeline = rank["timeline"]
        events = timeline["events"]
        assert [(e["unit"], e["pass"], e["action"]) for e in events] == [
            (m["unit"], m["pass"], m["action"]) for m in model[1:]]
        for event, modelled in zip(events, model[1:]):
            if event["action"] != "compute":
                change = event["live_end"] - event["live_start"]
                assert abs(change - modelled["change"]) <= SLACK, (event, modelled)
        assert 0 <= timeline["memory"][0][1] - model[0]["held"] <= SLACK  # and the buffers


def test_accumulation_traffic_refuses_another_optimizer_and_no_backward_pass():
    with pytest.raises(ValueError, match="'ddp'"):
        zero_exercises.accumulation_traffic(0, 1, ZeroRun(optimizer="ddp"))
    with pytest.raises(ValueError, match=r"micro_batches=\(0,\)"):
        zero_exercises.accumulation_traffic(0, 1, ZeroRun(), (0,))

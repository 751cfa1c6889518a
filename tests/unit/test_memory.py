"""memory: the ZeRO paper's numbers and lesson 78's, exactly; and the measured peaks beside them."""

import pytest
import torch

from lesson_code import memory
from lesson_code.bench import stored

GB = 1e9


def row(table, n, stage):
    return table[(table.N == n) & (table.stage == stage)].iloc[0]


def test_zero1_saving_at_8_and_64_ranks():
    table = memory.memory_table(1.0, [8, 64])
    assert row(table, 8, "DDP").bytes_per_param == 16
    assert row(table, 8, "ZeRO-1").bytes_per_param == 5.5
    assert round(row(table, 8, "ZeRO-1").saving_percent, 1) == 65.6
    assert row(table, 64, "ZeRO-1").bytes_per_param == 4.1875
    assert round(row(table, 64, "ZeRO-1").saving_percent, 1) == 73.8


def test_seed_7b_model_under_ddp():
    parts = memory.bytes_per_rank("DDP", 7e9, 8)
    assert parts == {"params": 14 * GB, "grads": 14 * GB, "optimizer": 84 * GB}
    master = 4 * 7e9  # of the 12 optimizer bytes per parameter, 4 are the fp32 master copy
    assert master == 28 * GB


def test_zero_paper_7_5b_on_64_gpus():
    totals = {stage: memory.total_bytes(stage, 7.5e9, 64) / GB for stage in memory.STAGES}
    assert totals["DDP"] == 120
    assert round(totals["ZeRO-1"], 1) == 31.4
    assert round(totals["ZeRO-2"], 1) == 16.6
    assert round(totals["ZeRO-3"], 1) == 1.9


def test_stage_formulas_for_any_n():
    for n in (1, 2, 3, 16):
        assert memory.total_bytes("ZeRO-1", 1, n) == pytest.approx(4 + 12 / n)
        assert memory.total_bytes("ZeRO-2", 1, n) == pytest.approx(2 + 14 / n)
        assert memory.total_bytes("ZeRO-3", 1, n) == pytest.approx(16 / n)


def test_traffic_per_stage():
    psi = 1e9
    assert memory.traffic_per_step("DDP", psi, 64, exact=False) == 2 * 2 * psi
    assert memory.traffic_per_step("ZeRO-1", psi, 64, exact=False) == 2 * 2 * psi
    assert memory.traffic_per_step("ZeRO-3", psi, 64, exact=False) == 3 * 2 * psi
    assert memory.traffic_per_step("ZeRO-2", 1000, 4, dtype_bytes=4) == 2 * 0.75 * 1000 * 4


def test_choosing_a_stage():
    assert memory.choose_stage(7.5e9, 64, 80 * GB) == "ZeRO-1"
    assert memory.choose_stage(7.5e9, 64, 20 * GB) == "ZeRO-2"
    assert memory.choose_stage(7.5e9, 64, 8 * GB) == "ZeRO-3"
    assert memory.choose_stage(7.5e9, 64, 1 * GB) == "none fits"
    assert memory.choose_stage(1e8, 8, 80 * GB) == "DDP"


@pytest.mark.parametrize("call, message", [
    (lambda: memory.bytes_per_rank("ZeRO-4", 1, 8), "unknown stage 'ZeRO-4'"),
    (lambda: memory.traffic_per_step("ZeRO-4", 1, 8), "unknown stage 'ZeRO-4'"),
    (lambda: memory.bytes_per_rank("ZeRO-1", 1, 0), "world_size must be a positive int, got 0"),
    (lambda: memory.traffic_per_step("ZeRO-1", 1, 0), "world_size must be a positive int, got 0"),
])
def test_bad_input(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_lesson_78_code_keeps_an_fp32_master_beside_fp32_weights():
    # 4 + 4 + 12 bytes per parameter: what the lesson's optimizers hold for a float32 model
    assert memory.total_bytes("DDP", 1, 4, memory.FP32_MASTER_ADAM) == 20
    assert memory.total_bytes("ZeRO-2", 1, 4, memory.FP32_MASTER_ADAM) == 4 + 16 / 4
    assert memory.total_bytes("ZeRO-3", 1, 4, memory.FP32_MASTER_ADAM) == 20 / 4


def test_the_stored_stage_table_sets_each_measured_peak_beside_this_module_s_formula():
    table, note = stored.load("zero_stages")
    assert "torch's allocator" in note["description"]
    assert set(table.index) == {1, 2, 4} and set(table.stage) == set(memory.STAGES)
    for n, row in table.iterrows():
        formula = memory.total_bytes(row.stage, row.parameters, n, memory.FP32_MASTER_ADAM)
        assert row.formula == int(formula) and row.gap == row.peak - row.formula > 0
    zero3 = table[table.stage == "ZeRO-3"]
    # between steps a ZeRO-3 rank holds 16 bytes of each parameter it owns, and the buffers
    assert (zero3.at_start == 16 * zero3.parameters // zero3.index + zero3.buffers).all()


UNITS = [("embed", 9216), ("blocks.0", 198272), ("blocks.1", 198272), ("head", 8449)]


def test_the_stage_3_step_holds_the_shards_then_the_gradient_shard_and_one_unit_at_a_time():
    n = 4
    events = memory.stage3_step(UNITS, n, memory.FP32_MASTER_ADAM)
    shards = sum(-(-numel // n) for _, numel in UNITS)  # the head is padded by 3
    assert events[0]["held"] == 16 * shards  # parameter shard, fp32 master and two moments
    assert events[-1]["held"] == 20 * shards  # and the gradient shard, after backward
    assert [e["action"] for e in events[1:4]] == ["gather", "compute", "free"]
    assert [e["unit"] for e in events if e["action"] == "reduce-scatter"] == [
        "head", "blocks.1", "blocks.0", "embed"]
    block = 4 * 198272  # gathered whole; its gradient bucket as much again
    assert max(e["held"] for e in events) == 20 * shards + 2 * block
    assert sum(e["change"] for e in events) == events[-1]["held"] - events[0]["held"]
    # without padding, the end of backward is the formula of ZeRO-3
    even = [(name, 4 * numel) for name, numel in UNITS]
    assert memory.stage3_step(even, n)[-1]["held"] == memory.total_bytes(
        "ZeRO-3", sum(numel for _, numel in even), n, memory.FP32_MASTER_ADAM)


@pytest.mark.parametrize("units, world_size, message", [
    (UNITS, 0, "world_size must be a positive int, got 0"),
    ([("empty", 0)], 2, "parameters of unit 'empty' must be a positive int, got 0"),
])
def test_the_stage_3_step_refuses_a_bad_world_size_or_an_empty_unit(units, world_size, message):
    with pytest.raises(ValueError, match=message):
        memory.stage3_step(units, world_size)


def test_choosing_a_stage_keeps_headroom_and_zero3s_gathered_unit():
    # 70B in mixed precision on 8 ranks: ZeRO-3's states are 16 * 70e9 / 8 = 140 GB per rank,
    # and the step's fp32 gradient shard 4 * 70e9 / 8 = 35 GB
    b200 = 183_359 * 2 ** 20  # bytes, as the driver reports a B200
    assert memory.choose_stage(70e9, 8, b200) == "ZeRO-3"
    assert memory.choose_stage(70e9, 8, b200, headroom=0.1) == "none fits"
    # the working set alone, once it outgrows the step's 35 GB: two units of 2 bytes, one
    # unit's gradient of 2 bytes and the previous unit's reduce-scatter input, a bf16 copy
    room = 140e9 + 8 * 5e9
    assert memory.choose_stage(70e9, 8, room, unit_params=5e9) == "ZeRO-3"
    assert memory.choose_stage(70e9, 8, room - 1, unit_params=5e9) == "none fits"
    assert memory.choose_stage(70e9, 8, room - 1, activation_bytes=0) == "ZeRO-3"
    # the unit term is ZeRO-3's only: ZeRO-2 needs no gathered unit
    zero2 = memory.total_bytes("ZeRO-2", 7e9, 8) + 4 * 7e9 / 8
    assert memory.choose_stage(7e9, 8, zero2, unit_params=1e9) == "ZeRO-2"


def test_zero3s_working_set_holds_a_reduce_scatter_input_in_either_reduction_dtype():
    # FSDP2's foreach_reduce copies a unit's gradient into a reduce-scatter input in
    # reduce_dtype, and keeps it until the next unit's reduction, even when that dtype is the
    # gradient's own: 2 + 2 (two units gathered) + 2 (the gradient) + 2 or 4 (its copy)
    assert memory.stage3_working_bytes(1e9) == 8e9
    assert memory.stage3_working_bytes(1e9, reduce_bytes=2) == 8e9
    assert memory.stage3_working_bytes(1e9, reduce_bytes=4) == 10e9
    assert memory.stage3_working_bytes(1e9, memory.FP32_ADAM) == 16e9
    assert memory.stage3_working_bytes(1e9, memory.FP32_ADAM, reduce_bytes=4) == 16e9
    # Llama 2 70B's layers on 32 ranks with checkpointed activations: backward's 5.4 GB of
    # activations and 6.8 GB of working set outgrow the step's 8.75 GB fp32 gradient shard, so
    # a device that holds exactly the bf16 reduction's copy has no room for the fp32 one
    activations, layer = 80 * 4096 * 8192 * 2, 856e6
    room = memory.total_bytes("ZeRO-3", 70e9, 32) + activations + 8 * layer
    margins = {"unit_params": layer, "activation_bytes": activations}
    assert memory.choose_stage(70e9, 32, room, **margins) == "ZeRO-3"
    assert memory.choose_stage(70e9, 32, room, **margins, reduce_bytes=4) == "none fits"
    assert memory.choose_stage(70e9, 32, room + 2 * layer, **margins, reduce_bytes=4) == "ZeRO-3"


def test_an_fp32_master_step_holds_an_fp32_gradient_even_with_a_fused_adam():
    # bf16 gradients, fp32 master: the step reads a 4-byte gradient per parameter it updates
    h200, b200 = 143_771 * 2 ** 20, 183_359 * 2 ** 20  # bytes, as the driver reports them
    llama7, llama70 = 32 * 4096 * 4096 * 2, 80 * 4096 * 8192 * 2  # checkpointed activations
    # 7B under DDP: 112 GB of states + 28 GB of fp32 gradient > 135.7 GB usable
    assert memory.choose_stage(7e9, 8, h200, llama7, headroom=0.1) == "ZeRO-1"
    # 70B under ZeRO-3 on 8 ranks: 140 GB + 35 GB of fp32 gradient shard > 173.0 GB usable
    margins = {"headroom": 0.1, "unit_params": 856e6, "reduce_bytes": 4}
    assert memory.choose_stage(70e9, 8, b200, llama70, **margins) == "none fits"
    # ZeRO-1 on 8 ranks needs its states and 4 bytes for each of its 7e9 / 8 parameters
    states = memory.total_bytes("ZeRO-1", 7e9, 8)
    assert memory.choose_stage(7e9, 8, states + 3.5e9) == "ZeRO-1"
    assert memory.choose_stage(7e9, 8, states + 3.5e9 - 1) == "ZeRO-2"
    # the foreach path's copy of the second moment comes on top: 4 + 4 bytes
    assert memory.choose_stage(7e9, 8, states + 7e9, step_temp_bytes=4) == "ZeRO-1"
    assert memory.choose_stage(7e9, 8, states + 7e9 - 1, step_temp_bytes=4) == "ZeRO-2"
    # fp32 gradients are the master's own: no cast, nothing more
    fp32 = memory.total_bytes("DDP", 7e9, 8, memory.FP32_MASTER_ADAM)
    assert memory.choose_stage(7e9, 8, fp32, precision=memory.FP32_MASTER_ADAM) == "DDP"
    # the step comes after backward has freed the activations: the larger of the two counts
    assert memory.choose_stage(7e9, 8, states + 3.5e9, 3.5e9) == "ZeRO-1"


def test_fsdp2_s_fp32_shards_and_bf16_units_fit_70b_on_fewer_ranks_than_the_paper_s_layout():
    """Llama 2 70B on H200s, fp32 reduction, fused Adam: FSDP2 (fp32 shards, bf16 gathered units
    and gradients) fits on 10 ranks, where the ZeRO paper's 2 + 2 + 12 needs its fp32 gradient
    shard for the step; both peak alike in backward."""
    usable = 0.9 * 143_771 * 2 ** 20
    activations, layer = 80 * 4096 * 8192 * 2, 856e6
    fsdp2 = {"precision": memory.FP32_ADAM, "gathered_bytes": 2, "reduce_bytes": 4}
    peaks = {n: memory.stage3_peaks(70e9, n, layer, activations, **fsdp2) for n in (9, 10)}
    assert peaks[10] == pytest.approx({"states": 112e9, "backward": 112e9 + activations + 10 * layer,
                                       "step": 112e9})
    assert peaks[9]["backward"] > usable > peaks[10]["backward"]  # backward decides: 10 ranks
    bf16 = memory.stage3_peaks(70e9, 9, layer, activations, **{**fsdp2, "reduce_bytes": 2})
    assert round((bf16["backward"] - usable) / GB, 1) == 1.0  # a bf16 reduction: 9 ranks still short
    # FSDP2's working set is 2 + 2 + 2 + 4 bytes per element of a unit, not fp32's 4 + 4 + 4 + 4
    assert memory.stage3_working_bytes(layer, memory.FP32_ADAM, 4) == 16 * layer
    paper = memory.stage3_peaks(70e9, 10, layer, activations, reduce_bytes=4)
    assert paper["backward"] == peaks[10]["backward"] and paper["step"] == 140e9 > usable
    # the paper's layout fits exactly where choose_stage says ZeRO-3 does, with either Adam
    for n in range(8, 20):
        for temp in (0, 4):
            peak = memory.stage3_peaks(70e9, n, layer, activations, reduce_bytes=4,
                                       step_temp_bytes=temp)
            verdict = memory.choose_stage(70e9, n, usable / 0.9, activations, headroom=0.1,
                                          unit_params=layer, reduce_bytes=4, step_temp_bytes=temp)
            assert (max(peak["backward"], peak["step"]) <= usable) == (verdict == "ZeRO-3"), (n, temp)


@pytest.mark.parametrize("kwargs, message", [
    ({"gathered_bytes": 0}, "gathered_bytes=0 must be positive"),
    ({"step_temp_bytes": -4}, "step_temp_bytes=-4 is negative"),
    ({"activation_bytes": -1.0}, "activation_bytes=-1.0 is negative"),
    ({"reduce_bytes": 0}, "reduce_bytes=0 must be positive"),
])
def test_stage3_peaks_refuses_bad_input(kwargs, message):
    with pytest.raises(ValueError, match=message):
        memory.stage3_peaks(70e9, 8, 856e6, **kwargs)


def test_torch_s_fused_adam_kernel_does_not_read_a_bf16_gradient_for_an_fp32_parameter():
    """Why choose_stage counts the fp32 gradient under a fused Adam too."""
    param, grad = torch.zeros(4), torch.ones(4, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="grad"):
        torch.nn.Parameter(param).grad = grad
    moments, step = [torch.zeros(4), torch.zeros(4)], torch.zeros(())
    with pytest.raises(RuntimeError, match="BFloat16"):
        torch._fused_adam_([param], [grad], [moments[0]], [moments[1]], [], [step], lr=1e-3,
                           beta1=0.9, beta2=0.999, weight_decay=0.0, eps=1e-8, amsgrad=False,
                           maximize=False)


@pytest.mark.parametrize("kwargs, message", [
    ({"step_temp_bytes": -4}, "step_temp_bytes=-4 is negative"),
    ({"reduce_bytes": 0}, "reduce_bytes=0 must be positive"),
    ({"headroom": 1.0}, "headroom=1.0 is the fraction"),
    ({"headroom": -0.1}, "headroom=-0.1 is the fraction"),
    ({"unit_params": -1}, "unit_params=-1 is negative"),
    ({"activation_bytes": -5.0}, "activation_bytes=-5.0 is negative"),
])
def test_choose_stage_refuses_bad_input(kwargs, message):
    with pytest.raises(ValueError, match=message):
        memory.choose_stage(7e9, 8, 80e9, **kwargs)


def test_eight_checkpointed_sequences_leave_every_7b_choice_of_lesson_78_unchanged():
    """Lesson 78's network model puts eight 4,096-token sequences in a micro-batch of the 7B
    model: their checkpointed activations (8.6 GB) must not move any 7B verdict of its memory
    table, on either GPU or rank count, with either Adam's step copy."""
    mib = 2 ** 20
    capacities = [81_559 * mib, 143_771 * mib, 183_359 * mib]  # H100, H200, B200, as drivers report
    one_layer_input = 4096 * 4096 * 2  # bf16, the only activation a checkpointed layer keeps
    for step_temp in (0, 4):  # Adam(fused=True), Adam(foreach=True)
        for n in (8, 64):
            for capacity in capacities:
                verdicts = {memory.choose_stage(
                    7e9, n, capacity, headroom=0.1, unit_params=202e6, reduce_bytes=4,
                    step_temp_bytes=step_temp, activation_bytes=sequences * 32 * one_layer_input)
                    for sequences in (1, 8)}
                assert len(verdicts) == 1, (step_temp, n, capacity, verdicts)


def test_lesson_78_network_model_splits_each_stage_s_traffic_into_whole_ring_passes():
    """The network table of lesson 78 counts ring passes (reduce-scatter, all-gather) per stage;
    together they must give memory.traffic_per_step for bf16 elements."""
    psi, n = 7e9, 8
    ring_pass = 2 * psi * (n - 1) / n  # bytes a rank sends in one pass over bf16 elements
    passes = {"DDP": 2, "ZeRO-1": 2, "ZeRO-2": 2, "ZeRO-3": 3}
    for stage, count in passes.items():
        assert memory.traffic_per_step(stage, psi, n, dtype_bytes=2) == pytest.approx(count * ring_pass)

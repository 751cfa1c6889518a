"""Lesson 79 on real gloo ranks: pipelined gradients equal the unsplit model's and torch's.

Tolerance: every gradient within 1e-6 absolute of the unsplit model on the whole batch
(measured: below 4e-8). The pipeline sums m micro-batch gradients, each scaled by 1/m, where one
process sums the whole batch at once: the same terms in another order, float32 rounding only.
The bytes each stage puts in its ledger are exact: they follow from the activations' shapes.
"""

import pytest
import torch

from lesson_code import launch, pipeline_exercises, pipeline_lab
from lesson_code.models import MLP, as_layers, build_model
from lesson_code.pipeline import (HEADER_LENGTH, PipelineStage, bubble_fraction, ideal_timeline,
                                  imbalance_floor, partition_layers, peak_in_flight, schedule_order,
                                  split_micro_batches, theoretical_bubble, unequal_stage_bubble)
from lesson_code.pipeline_lab import PipeRun, reference_step
from lesson_code.harness.reference import in_one_rank

MICRO_BATCHES = (1, 2, 4, 8)


@pytest.mark.parametrize("model", ["mlp", "gpt"])
@pytest.mark.parametrize("stages", [2, 4])
def test_both_schedules_match_the_unsplit_model(model, stages):
    runs = [PipeRun(model=model, schedule=s, micro_batches=m)
            for s in ("gpipe", "1f1b") for m in MICRO_BATCHES]
    per_rank = launch.spawn(pipeline_lab.pipeline_steps, runs, world_size=stages)
    for index, run in enumerate(runs):
        results = [rank_results[index] for rank_results in per_rank]
        check = pipeline_lab.compare_with_reference(results, in_one_rank(reference_step, run))
        assert check["all_layers_once"], run
        assert check["max_grad_diff"] < 1e-6, (run, check)
        assert check["loss_diff"] < 1e-6, (run, check)
        peaks = [r["peak_stored"] for r in results]
        if run.schedule == "gpipe":
            assert peaks == [run.micro_batches] * stages
        else:
            assert peaks == [min(stages - s, run.micro_batches) for s in range(stages)]
        events = [e for r in results for e in r["events"]]
        assert sorted((s, i, k) for s, i, k, _, _ in events) == sorted(
            (s, i, k) for s in range(stages) for i in range(run.micro_batches) for k in "FB")
        for s, i, kind, begin, _ in events:  # causality: a stage forwards what it received
            if kind == "F" and s > 0:
                previous = next(e for e in events if e[:3] == (s - 1, i, "F"))
                assert previous[4] <= begin


def test_the_simple_gpipe_step_matches_the_unsplit_model_and_the_stage():
    # The stage without bookkeeping runs the same operations in GPipe order as PipelineStage,
    # so both give the same bits; against one process, the 1e-6 of this file's docstring.
    runs = [PipeRun(schedule="gpipe", micro_batches=m) for m in (1, 2, 4)]
    simple = launch.spawn(pipeline_lab.simple_pipeline_steps, runs, world_size=4)
    staged = launch.spawn(pipeline_lab.pipeline_steps, runs, world_size=4)
    for index, run in enumerate(runs):
        results = [rank_results[index] for rank_results in simple]
        check = pipeline_lab.compare_with_reference(results, in_one_rank(reference_step, run))
        assert check["all_layers_once"] and check["max_grad_diff"] < 1e-6, (run, check)
        assert check["loss_diff"] < 1e-6 and [r["loss"] for r in results[:-1]] == [None] * 3
        assert pipeline_lab.max_grad_diff(results, {"grads": {
            name: g for r in staged for name, g in r[index]["grads"].items()}}) == 0
    with pytest.raises(ValueError, match="model='mlp'.*pass model='gpt'"):
        pipeline_lab.simple_pipeline_step(0, 2, PipeRun(model="mlp"))


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("stages", [2, 4])
def test_same_gradients_as_torch_distributed_pipelining(schedule, stages):
    # Ours divides each micro-batch's loss by m, torch divides the summed gradients by m. With
    # m = 4 both scalings are exact (a power of two), so the bits agree; with m = 6 they round
    # differently, within float32 rounding.
    runs = [PipeRun(schedule=schedule, micro_batches=4),
            PipeRun(schedule=schedule, batch_size=12, micro_batches=6)]
    per_rank = launch.spawn(pipeline_lab.ours_and_torch_steps, runs, world_size=stages)
    for index, tolerance in enumerate([0, 1e-6]):
        for rank_results in per_rank:
            ours, theirs = rank_results[index]["ours"], rank_results[index]["torch"]
            assert ours["grads"].keys() == theirs["grads"].keys()
            for name in ours["grads"]:
                torch.testing.assert_close(ours["grads"][name], theirs["grads"][name],
                                           rtol=0, atol=tolerance)
        last = per_rank[-1][index]
        assert abs(last["ours"]["loss"] - last["torch"]["loss"]) < 1e-6


def test_after_the_flush_every_stage_clips_by_the_whole_models_norm():
    # Tolerance 1e-6: the pipeline sums micro-batch gradients and the squares of its stages'
    # gradients in another order than one process (measured: below 1e-7 after 3 steps).
    run = PipeRun(model="gpt", steps=3, micro_batches=4)
    reference = in_one_rank(pipeline_lab.reference_train, run, 0.5)
    assert min(reference["norms"]) > 0.5  # every step clips: a norm of one stage would show
    per_rank = launch.spawn(pipeline_lab.train_after_flush, run, 0.5, world_size=2)
    assert all(r["losses"] == per_rank[0]["losses"] for r in per_rank)  # broadcast to every stage
    for key in ("losses", "norms"):
        torch.testing.assert_close(per_rank[0][key], reference[key], rtol=0, atol=1e-6)
    weights = {name: w for r in per_rank for name, w in r["weights"].items()}
    assert weights.keys() == reference["weights"].keys()
    for name, weight in weights.items():
        torch.testing.assert_close(weight, reference["weights"][name], rtol=0, atol=1e-6)
    # Clipped by its own gradients' norm, each stage scales by its own factor: other updates.
    own = launch.spawn(pipeline_lab.train_after_flush, run, 0.5, "stage", world_size=2)
    assert max(own[0]["norms"]) < 0.5 < min(own[1]["norms"])  # stage 0 never clips, stage 1 always
    drift = max((w - reference["weights"][name]).abs().max().item()
                for r in own for name, w in r["weights"].items())
    assert drift > 1e-4 and abs(own[0]["losses"][-1] - reference["losses"][-1]) > 1e-4, drift


@pytest.mark.parametrize("stages", [2, 4])
def test_a_tied_head_and_embedding_are_summed_between_the_first_and_the_last_stage(stages):
    # The tied matrix's gradient is the sum of its two uses' shares; each end stage alone holds
    # only its own share (measured: the shares differ from the sum by about 0.1, the summed
    # copies from one process by below 1e-6, 1e-5 covers other thread counts' orders of sums).
    run = PipeRun(micro_batches=4)
    reference = in_one_rank(pipeline_exercises.tied_reference_step, run)
    per_rank = launch.spawn(pipeline_exercises.tied_pipeline_step, run, world_size=stages)
    names = sorted(name for r in per_rank for name in r["grads"])
    assert names == sorted(reference["grads"])
    assert pipeline_lab.max_grad_diff(per_rank, reference) < 1e-5
    own = [{"grads": r["own_grads"]} for r in per_rank]
    assert pipeline_lab.max_grad_diff(own, reference) > 1e-2  # without the all-reduce
    with pytest.raises(ValueError, match="only MiniGPT"):
        pipeline_exercises.tied_pipeline_step(0, 2, PipeRun(model="mlp"))


def grouped_pipeline_steps(rank, world_size, runs):
    """`pipeline_steps` with each stage posting its sends in one group with its next receive,
    the path a stage takes under NCCL (gloo carries such groups too, one operation at a time)."""
    real_init = PipelineStage.__init__

    def init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        self.batched = True  # as under NCCL

    PipelineStage.__init__ = init
    return pipeline_lab.pipeline_steps(rank, world_size, runs)


@pytest.mark.parametrize("stages", [2, 3, 4])
def test_the_grouped_path_of_nccl_gives_the_same_gradients(stages):
    runs = [PipeRun(model="gpt", schedule=s, micro_batches=m) for s in ("gpipe", "1f1b") for m in (1, 4)]
    per_rank = launch.spawn(grouped_pipeline_steps, runs, world_size=stages, timeout_s=120)
    for index, run in enumerate(runs):
        results = [rank_results[index] for rank_results in per_rank]
        check = pipeline_lab.compare_with_reference(results, in_one_rank(reference_step, run))
        assert check["all_layers_once"] and check["max_grad_diff"] < 1e-6, (run, check)


def barriers_of_one_stage(rank, world_size):
    """How many barriers building one stage calls on this rank (gloo, the default group)."""
    import torch.distributed as dist

    real_barrier, calls = dist.barrier, []

    def barrier(*args, **kwargs):
        calls.append(kwargs.get("group"))
        return real_barrier(*args, **kwargs)

    dist.barrier = barrier
    try:
        PipelineStage(pipeline_lab.stage_module(PipeRun(), rank, world_size)[0], None,
                      lambda output, target: output.sum())
    finally:
        dist.barrier = real_barrier
    return len(calls)


def test_building_a_stage_calls_one_barrier_on_every_rank_of_its_group():
    # batch_isend_irecv: the group's first collective call must include all its ranks; a grouped
    # call joins two neighbours, so the stage makes a barrier its group's first collective.
    assert launch.spawn(barriers_of_one_stage, world_size=3) == [1, 1, 1]


def expected_traffic(run, stage, stages, header_bytes=HEADER_LENGTH * 8,
                     first_sends_gradients=False, last_sends_activations=False):
    """What stage `stage` of `stages` must count in one step of MiniGPT, derived from the shapes.

    Each forward of a micro-batch (all but the last stage): a header of HEADER_LENGTH int64s, then
    the activation, float32 of shape (batch/m, context, n_embd) after the embedding or a block.
    Each backward (all but the first stage): the gradient of the stage's input, the same shape.
    The keyword arguments give plausible wrong counts, to show that the test tells them apart.
    """
    m = run.micro_batches
    activation = (run.batch_size // m) * run.gpt.context * run.gpt.n_embd * 4
    forwards_out = stage < stages - 1 or last_sends_activations
    gradients_out = stage > 0 or first_sends_gradients
    forwards_in, gradients_in = stage > 0, stage < stages - 1
    return {"calls": 1,
            "bytes_sent": m * (forwards_out * (header_bytes + activation) + gradients_out * activation),
            "bytes_received": m * (forwards_in * (header_bytes + activation) + gradients_in * activation),
            "messages_sent": m * (2 * forwards_out + gradients_out),
            "messages_received": m * (2 * forwards_in + gradients_in)}


def test_the_ledger_counts_every_activation_header_and_gradient():
    stages = 3  # a first, a middle and a last stage
    runs = [PipeRun(schedule="gpipe", micro_batches=1), PipeRun(schedule="1f1b", micro_batches=4),
            PipeRun(schedule="1f1b", micro_batches=3, batch_size=12)]
    per_rank = launch.spawn(pipeline_lab.pipeline_steps, runs, world_size=stages)
    for index, run in enumerate(runs):
        measured = [rank_results[index]["traffic"] for rank_results in per_rank]
        assert measured == [expected_traffic(run, s, stages) for s in range(stages)], run
        for wrong in ({"header_bytes": 0}, {"first_sends_gradients": True},
                      {"last_sends_activations": True}):
            assert measured != [expected_traffic(run, s, stages, **wrong) for s in range(stages)]
        # Every byte one stage sends, another receives.
        assert sum(t["bytes_sent"] for t in measured) == sum(t["bytes_received"] for t in measured)
    # The default MiniGPT, 4 micro-batches of 4 sequences: activations of 4 x 16 x 32 float32
    # (8192 bytes) after 80-byte headers. Stage 0 sends 4 x 8272, stage 2 4 x 8192 of gradients.
    assert [r[1]["traffic"]["bytes_sent"] for r in per_rank] == [33088, 65856, 32768]


def test_two_dimensional_data_and_pipeline_parallelism():
    run = PipeRun(schedule="1f1b", micro_batches=2)
    results = launch.spawn(pipeline_exercises.data_and_pipeline_step, run, 2, world_size=4)
    reference = in_one_rank(reference_step, run)
    assert [(r["replica"], r["stage"]) for r in results] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert [r["loss"] is None for r in results] == [True, False, True, False]
    assert results[1]["loss"] == results[3]["loss"]
    assert abs(results[1]["loss"] - reference["loss"]) < 1e-6
    for r in results:
        for name, grad in r["grads"].items():
            torch.testing.assert_close(grad, reference["grads"][name], rtol=0, atol=1e-6)
    assert torch.equal(torch.cat([g.reshape(-1) for g in results[0]["grads"].values()]),
                       torch.cat([g.reshape(-1) for g in results[2]["grads"].values()]))


def test_schedule_orders():
    assert schedule_order("gpipe", 1, 4, 3) == [("F", 0), ("F", 1), ("F", 2), ("B", 0), ("B", 1),
                                                ("B", 2)]
    assert schedule_order("1f1b", 1, 4, 4) == [("F", 0), ("F", 1), ("F", 2), ("B", 0), ("F", 3),
                                               ("B", 1), ("B", 2), ("B", 3)]
    assert schedule_order("1f1b", 3, 4, 2) == [("F", 0), ("B", 0), ("F", 1), ("B", 1)]
    with pytest.raises(ValueError, match="unknown schedule 'interleaved'"):
        schedule_order("interleaved", 0, 4, 2)
    with pytest.raises(ValueError, match="stage 4 is not one of the 4 stages: pass 0 to 3"):
        schedule_order("gpipe", 4, 4, 2)
    with pytest.raises(ValueError, match="micro_batches must be a positive int, got 0"):
        schedule_order("gpipe", 0, 4, 0)


def test_1f1b_waits_for_messages_and_one_more_forward_hides_them_in_a_short_step_only():
    # A message time d on every edge between stages: GPipe waits only in the fill and the drain,
    # 2 (P - 1) d; in 1F1B, stage s waits 2 k d every k + 1 micro-batches (k = P - 1 - s), so the
    # loop through stage 0 adds 2 (P - 1) d / P per micro-batch. One more warm-up forward on every
    # stage but the last is slack between the last two stages only: enough for m = 32 here, not
    # for four times as many micro-batches.
    p, m, f, b, d = 8, 32, 1.0, 2.0, 0.02
    assert pipeline_lab.message_delay("gpipe", p, m, f, b, d) == pytest.approx(2 * (p - 1) * d)
    plain = pipeline_lab.message_delay("1f1b", p, m, f, b, d)
    assert plain > 2 * (p - 1) * d + (m - p) * d
    assert pipeline_lab.message_delay("1f1b", p, 2 * m, f, b, d) - plain == pytest.approx(
        m * 2 * (p - 1) / p * d)
    assert pipeline_lab.message_delay("1f1b", p, m, f, b, d, extra_warmup=1) == pytest.approx(
        2 * (p - 1) * d)
    assert pipeline_lab.message_delay("1f1b", p, 4 * m, f, b, d, extra_warmup=1) > 4 * 2 * (p - 1) * d
    assert pipeline_lab.message_delay("1f1b", p, m, f, b, 0.0) == 0.0
    # the price: one more micro-batch held on every stage but the last
    held = [peak_in_flight(schedule_order("1f1b", s, p, m, 1)) for s in range(p)]
    assert held == [p - s + 1 for s in range(p - 1)] + [1]
    assert schedule_order("gpipe", 0, p, m, 1) == schedule_order("gpipe", 0, p, m)
    with pytest.raises(ValueError, match="extra_warmup=-1: pass a count of 0 or more"):
        schedule_order("1f1b", 0, p, m, -1)
    with pytest.raises(ValueError, match="message=-0.1: pass a time of 0 or more"):
        ideal_timeline("1f1b", p, m, message=-0.1)


def test_partition_balances_parameters_and_rejects_bad_input():
    layers = as_layers(build_model("gpt", 0))
    assert partition_layers(layers, 4) == [(0, 1), (1, 2), (2, 3), (3, 4)]
    assert partition_layers(layers, 2, [3, 1]) == [(0, 3), (3, 4)]
    mlp_layers = as_layers(MLP())  # Linear(32,64) ReLU Linear(64,64) ReLU Linear(64,10)
    assert partition_layers(mlp_layers, 2) == [(0, 2), (2, 5)]
    with pytest.raises(ValueError, match="5 stages but only 4 layers"):
        partition_layers(layers, 5)
    with pytest.raises(ValueError, match="must give 2 positive layer counts that add up to 4"):
        partition_layers(layers, 2, [2, 3])


def test_micro_batches_must_divide_the_batch():
    assert len(split_micro_batches(torch.zeros(12, 3), 4)) == 4
    with pytest.raises(ValueError, match="5 micro-batches do not divide the batch of 12"):
        split_micro_batches(torch.zeros(12, 3), 5)
    with pytest.raises(ValueError, match="micro_batches must be a positive int, got 0: pass a "
                                         "divisor of the batch size 12"):
        split_micro_batches(torch.zeros(12, 3), 0)
    with pytest.raises(ValueError, match="num_stages must be a positive int, got 0"):
        partition_layers(as_layers(MLP()), 0)


@pytest.mark.parametrize("arguments, message", [
    ({"schedule": "interleaved"}, "unknown schedule 'interleaved'"),
    ({"micro_batches": 0}, "micro_batches must be a positive int, got 0"),
    ({"partition": (3, 0)}, "every entry of partition must be a positive int, got 0"),
    ({"model": "cnn"}, "unknown model 'cnn'"),
    ({"steps": 0}, "steps must be a positive int"),
])
def test_a_run_refuses_bad_settings(arguments, message):
    with pytest.raises(ValueError, match=message):
        PipeRun(**arguments)
    assert PipeRun().model == "gpt"


def test_bubble_arithmetic():
    assert theoretical_bubble(4, 1) == 0.75
    assert theoretical_bubble(4, 8) == pytest.approx(3 / 11)
    # Two stages, one micro-batch each way, strictly one after the other: half the time idle.
    events = [(0, 0, "F", 0.0, 1.0), (1, 0, "F", 1.0, 2.0), (1, 0, "B", 2.0, 3.0),
              (0, 0, "B", 3.0, 4.0)]
    assert bubble_fraction(events, 2) == 0.5
    assert imbalance_floor(events, 2) == 0.0  # both stages busy 2 s: nothing forces idling


def test_the_imbalance_floor_bounds_the_bubble_of_unequal_stages():
    # Stage 0 computes 3 s, stage 1 1 s, in a 4 s step: busy 4 of 8 stage-seconds.
    events = [(0, 0, "F", 0.0, 1.0), (1, 0, "F", 1.0, 1.5), (1, 0, "B", 1.5, 2.0),
              (0, 0, "B", 2.0, 4.0)]
    assert imbalance_floor(events, 2) == pytest.approx(1 - 4 / (2 * 3))
    assert bubble_fraction(events, 2) == pytest.approx(0.5)
    assert bubble_fraction(events, 2) >= imbalance_floor(events, 2)


def test_timed_steps_report_the_median_bubble_of_the_measured_steps():
    runs = [PipeRun(micro_batches=m, steps=4) for m in (1, 4)]
    results = launch.spawn(pipeline_lab.timed_sweep, runs, 1, world_size=2)
    # every rank returns the same gathered figures
    assert all(a["bubbles"] == b["bubbles"] for a, b in zip(results[0], results[1]))
    for result in results[0]:
        assert len(result["bubbles"]) == 3  # 4 steps, the first a warm-up
        assert result["bubble"] == sorted(result["bubbles"])[1]
        assert 0 <= result["floor"] <= result["bubble"] < 1
        # the events drawn are those of the step of median length, not of the last step
        drawn = result["events_step"]
        assert result["steps_seconds"][drawn] == sorted(result["steps_seconds"])[1]
        assert bubble_fraction(result["events"], 2) == pytest.approx(result["bubbles"][drawn], abs=1e-12)


def steps_of_two_batch_sizes(rank, world_size, dtype_name, misalign_targets=False):
    """Two pipelined steps on one stage object: batch 16, then batch 8, in `dtype_name`.

    With `misalign_targets` the last stage pairs each sequence with the next one's targets: a
    wrong variant, to show that the tolerance below catches it.
    """
    from lesson_code import data
    from lesson_code.models import loss_function
    from lesson_code.pipeline_lab import stage_module

    dtype = getattr(torch, dtype_name)
    module = stage_module(PipeRun(), rank, world_size)[0].to(dtype)
    stage = PipelineStage(module, None, loss_function("gpt"))  # the default group's ranks
    losses = []
    for batch_size in (16, 8):
        x, y = data.make_batch("gpt", batch_size, 0)
        y = torch.roll(y, 1, dims=0) if misalign_targets else y
        module.zero_grad()
        stats = stage.train_step(x, y, 4, "1f1b")
        losses.append(stats.loss)
    return {"losses": losses, "grad_dtype": str(next(module.parameters()).grad.dtype)}


def unsplit_loss(dtype_name, batch_size):
    """The loss of the whole model in `dtype_name` on the whole batch, in one process."""
    from lesson_code import data
    from lesson_code.models import loss_function

    model = build_model("gpt", 0).to(getattr(torch, dtype_name))
    x, y = data.make_batch("gpt", batch_size, 0)
    with torch.no_grad():
        return loss_function("gpt")(torch.nn.Sequential(*as_layers(model))(x), y).item()


def loss_tolerance(dtype_name, loss):
    """How far the pipelined loss may be from the unsplit one.

    float32: rounding of the micro-batch sums only (1e-6). bfloat16 (unit roundoff u = 2^-8):
    the pipeline adds m micro-batch losses, each rounded to bf16 and then divided by m in bf16
    (at most 2u of each term, so 2u of the sum); the reference rounds its one loss (u): 3u x loss,
    1.2%. Measured: 0.18%. Targets paired with the wrong sequences move the loss by 2.2-2.7%.
    """
    return 1e-6 if dtype_name == "float32" else 3 * 2 ** -8 * abs(loss)


@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16"])
def test_activations_of_any_dtype_and_batch_size_travel(dtype_name):
    results = launch.spawn(steps_of_two_batch_sizes, dtype_name, world_size=2)
    assert all(r["grad_dtype"] == f"torch.{dtype_name}" for r in results)
    for loss, batch_size in zip(results[-1]["losses"], (16, 8)):
        expected = in_one_rank(unsplit_loss, dtype_name, batch_size)
        assert abs(loss - expected) <= loss_tolerance(dtype_name, expected), (batch_size, loss, expected)


def test_the_bfloat16_tolerance_catches_misaligned_targets():
    wrong = launch.spawn(steps_of_two_batch_sizes, "bfloat16", True, world_size=2)[-1]["losses"]
    for loss, batch_size in zip(wrong, (16, 8)):
        expected = in_one_rank(unsplit_loss, "bfloat16", batch_size)
        assert abs(loss - expected) > loss_tolerance("bfloat16", expected), (batch_size, loss)


def test_the_unequal_stage_model_is_gpipes_bubble_and_bounds_1f1bs():
    for times in ([1.0, 2.0, 2.0, 1.0], [3.0, 1.0], [1.0, 1.2, 3.0, 1.0]):
        p = len(times)
        floor = 1 - sum(times) / (p * max(times))
        for m in (1, 2, 4, 16):
            model = unequal_stage_bubble(p, m, floor)
            gpipe = ideal_timeline("gpipe", p, m, times, [2 * t for t in times])
            one_f_one_b = ideal_timeline("1f1b", p, m, times, [2 * t for t in times])
            assert bubble_fraction(gpipe, p) == pytest.approx(model, abs=1e-12)
            assert bubble_fraction(one_f_one_b, p) <= model + 1e-12
            assert imbalance_floor(gpipe, p) == pytest.approx(floor)
    assert unequal_stage_bubble(4, 8, 0.0) == pytest.approx(theoretical_bubble(4, 8))
    assert unequal_stage_bubble(4, 10 ** 6, 0.2) == pytest.approx(0.2, abs=1e-5)  # m -> floor
    # 1F1B does better when the slow stage comes first: the model is an upper bound, not exact.
    slow_first = ideal_timeline("1f1b", 2, 4, [3.0, 1.0], [6.0, 2.0])
    assert bubble_fraction(slow_first, 2) < unequal_stage_bubble(2, 4, 1 - 4 / 6) - 0.04
    with pytest.raises(ValueError, match="one per stage"):
        ideal_timeline("gpipe", 3, 2, [1.0, 2.0])


def test_torch_schedules_with_two_stages_per_rank_match_the_unsplit_model():
    run = PipeRun(micro_batches=4)
    per_rank = launch.spawn(pipeline_exercises.torch_virtual_stages_steps, run, world_size=2)
    reference = in_one_rank(reference_step, run)
    placements = {"ScheduleInterleaved1F1B": [[0, 2], [1, 3]],
                  "ScheduleInterleavedZeroBubble": [[0, 2], [1, 3]],
                  "ScheduleZBVZeroBubble": [[0, 3], [1, 2]]}
    for index, name in enumerate(pipeline_exercises.VIRTUAL_SCHEDULES):
        results = [rank_results[index] for rank_results in per_rank]
        assert [r["stages"] for r in results] == placements[name]
        grads = {key: grad for r in results for key, grad in r["grads"].items()}
        assert sorted(grads) == sorted(reference["grads"])
        for key, grad in grads.items():
            torch.testing.assert_close(grad, reference["grads"][key], rtol=0, atol=1e-6)
        for r in results:  # every stage of the rank forwards every micro-batch once
            forwards = sorted((s, i) for s, kind, i in r["order"] if kind == "F")
            assert forwards == sorted((s, i) for s in r["stages"] for i in range(4))
            backward_kinds = {kind for _, kind, _ in r["order"] if kind != "F"}
            assert backward_kinds == ({"B"} if name == "ScheduleInterleaved1F1B" else {"I", "W"})
    with pytest.raises(ValueError, match="exactly 2 stages"):
        pipeline_exercises.virtual_stage_indices("ScheduleZBVZeroBubble", 0, 2, 3)


def test_a_weight_gradient_is_deferred_unless_its_own_input_gradient_precedes_it():
    order = [(1, "F", 0), (1, "I", 0), (1, "W", 0), (1, "F", 1), (1, "I", 1), (0, "I", 0),
             (1, "W", 1), (0, "W", 0), (1, "B", 2)]
    assert pipeline_exercises.deferred_weight_grads(order) == 2  # 1W1 after 0I0, 0W0 after 1W1
    assert pipeline_exercises.deferred_weight_grads([]) == 0


def test_zero_bubble_orders_defer_weight_gradients_on_later_ranks():
    # 4 ranks, 8 stages (the wide MiniGPT's 8 layers), 8 micro-batches: torch's zero-bubble
    # orders, computed when the schedules are built, move some Ws away from their I; the
    # interleaved 1F1B order holds more micro-batches on rank 0 than 1F1B's P - 0 = 4.
    run = PipeRun(gpt=pipeline_lab.WIDE_GPT, micro_batches=8)
    per_rank = launch.spawn(pipeline_exercises.torch_schedule_orders, run, world_size=4)
    for rank, results in enumerate(per_rank):
        for r in results:
            kinds = {kind for _, kind, _ in r["order"]}
            for s in r["stages"]:
                for kind in kinds:
                    assert sorted(i for t, k, i in r["order"] if (t, k) == (s, kind)) == list(range(8))
            if r["schedule"] == "ScheduleInterleaved1F1B":
                continue
            deferred = pipeline_exercises.deferred_weight_grads(r["order"])
            assert (deferred > 0) == (rank > 0), (rank, r["schedule"])
    interleaved = per_rank[0][0]["order"]
    held = [sum(1 if kind == "F" else -1 for _, kind, _ in interleaved[:j + 1])
            for j in range(len(interleaved))]
    assert max(held) > 4
    # On ideal stages (F = I = W, free messages) interleaving divides the fill and the drain by
    # v = 2: (P - 1) / (v m + P - 1); the zero-bubble orders fill the drain with Ws as well,
    # leaving the first forward's fill, (P - 1) / (3 v m + P - 1).
    bubbles = [pipeline_exercises.modelled_bubble([results[k]["order"] for results in per_rank], 2)
               for k in range(3)]
    assert bubbles == pytest.approx([3 / 19, 3 / 51, 3 / 51], rel=1e-12), bubbles
    # Activations held, in micro-batches of a rank's layers: an I frees nothing until its W, so
    # the zero-bubble orders hold 1F1B's peak (P = 4) on every rank; interleaving holds 5.5 on rank 0.
    peaks = [[pipeline_exercises.modelled_peak_held(results[k]["order"], 2) for results in per_rank]
             for k in range(3)]
    assert peaks == [[5.5, 4.5, 3.5, 2.5], [4, 4, 4, 4], [4, 4, 4, 4]]


def test_the_modelled_bubble_of_one_stage_per_rank_is_the_formula_and_a_deadlock_is_refused():
    for schedule in ("gpipe", "1f1b"):
        for num_stages, micro_batches in ((2, 1), (4, 8), (3, 5)):
            orders = [[(stage, kind, micro) for kind, micro in
                       schedule_order(schedule, stage, num_stages, micro_batches)]
                      for stage in range(num_stages)]
            assert pipeline_exercises.modelled_bubble(orders, 1) == pytest.approx(
                theoretical_bubble(num_stages, micro_batches), rel=1e-12)
    events = pipeline_exercises.modelled_events(orders, 1)  # 1F1B, 3 stages, 5 micro-batches
    assert len(events) == 3 * 2 * 5 and min(e[4] for e in events) == 0.0
    assert max(e[5] for e in events) == pytest.approx(3 * (5 + 3 - 1))  # (m + P - 1)(f + b)
    assert all(end - start == (1.0 if kind == "F" else 2.0) for _, _, kind, _, start, end in events)
    assert pipeline_exercises.modelled_peak_held(orders[0], 1) == 3
    backward_first = [[(0, "B", 0), (0, "F", 0)], [(1, "F", 0), (1, "B", 0)]]
    with pytest.raises(ValueError, match="deadlock"):
        pipeline_exercises.modelled_bubble(backward_first, 1)


def test_neighbours_that_wait_for_their_sends_deadlock_and_a_bounded_wait_ends_it():
    assert launch.spawn(pipeline_exercises.neighbours_exchange, False, world_size=2, timeout_s=120) \
        == [True, True]
    with pytest.raises(launch.RankFailedError) as failed:
        launch.spawn(pipeline_exercises.neighbours_exchange, True, 1.0, world_size=2, timeout_s=120)
    assert "TimeoutError: rank" in failed.value.rank_traceback
    assert "waited 1 s for its send" in failed.value.rank_traceback


def test_fsdp_stages_reduce_scatter_once_per_step():
    run = PipeRun(micro_batches=4)
    per_rank = launch.spawn(pipeline_lab.fsdp_pipeline_steps, run, 2, (False, True), world_size=4)
    reference = in_one_rank(reference_step, run)
    for index, reshard_after_forward in enumerate((False, True)):
        results = [rank_results[index] for rank_results in per_rank]
        assert [(r["replica"], r["stage"]) for r in results] == [(0, 0), (0, 1), (1, 0), (1, 1)]
        for r in results:
            for key, grad in r["grads"].items():
                torch.testing.assert_close(grad, reference["grads"][key], rtol=0, atol=1e-6)
            # one reduce-scatter per FSDP unit after the last micro-batch, not one per micro-batch
            assert r["reduce_scatters"] == r["units"]
            # gathered once and kept, or gathered again for every forward and the first backward
            gathers = r["units"] * (run.micro_batches + 1 if reshard_after_forward else 1)
            assert r["all_gathers"] == gathers
        for stage in (0, 1):  # each replica keeps its shard of the stage's gradients
            column = [r for r in results if r["stage"] == stage]
            assert sum(r["gradient_elements_kept"] for r in column) == column[0]["stage_parameters"]
    with pytest.raises(launch.RankFailedError, match="does not divide the world size 4"):
        launch.spawn(pipeline_lab.fsdp_pipeline_step, run, 3, False, world_size=4)


def test_held_activation_bytes_follow_the_schedule_and_recomputation_keeps_the_input_and_output():
    from lesson_code.pipeline_lab import WIDE_GPT, held_activation_bytes

    run = PipeRun(gpt=WIDE_GPT, batch_size=16, micro_batches=4)
    gpipe = {recompute: held_activation_bytes(run, 1, 4, "gpipe", recompute) for recompute in (False, True)}
    one, stage_input = gpipe[False]["micro_batch_bytes"], 4 * WIDE_GPT.context * WIDE_GPT.n_embd * 4
    # The stage's float32 input and its output, kept to call backward on; nothing else.
    assert gpipe[True]["micro_batch_bytes"] == 2 * stage_input < one / 10
    assert [gpipe[r]["held_bytes"] for r in (False, True)] == [4 * one, 8 * stage_input]  # all m held
    assert held_activation_bytes(run, 1, 4, "1f1b")["peak_bytes"] == 3 * one  # P - s held
    assert [gpipe[r]["forwards"] for r in (False, True)] == [4, 8]  # recomputation runs each forward again
    with pytest.raises(ValueError, match="stage 0"):
        held_activation_bytes(run, 0, 4, "gpipe")


def test_the_peak_of_recomputation_counts_the_micro_batch_its_backward_rebuilds():
    from lesson_code.pipeline_lab import WIDE_GPT, held_activation_bytes

    run = PipeRun(gpt=WIDE_GPT, batch_size=16, micro_batches=4)
    one = held_activation_bytes(run, 1, 4, "gpipe")["micro_batch_bytes"]
    output = 4 * WIDE_GPT.context * WIDE_GPT.n_embd * 4  # float32; the stage's input has as many bytes
    for schedule in ("gpipe", "1f1b"):
        counts = held_activation_bytes(run, 1, 4, schedule, recompute=True)
        # A backward rebuilds its micro-batch's saved tensors while the stage still holds every
        # input it has not run backward on yet. The rerun saves the input again, in the storage
        # the stage holds already: the peak adds a micro-batch less its input and its output.
        assert counts["peak_bytes"] > one, (schedule, counts)
        assert counts["peak_bytes"] == counts["held_bytes"] + one - 2 * output, (schedule, counts)


def test_a_stage_keeps_at_most_two_sent_gradients_whatever_m():
    # A sent tensor stays alive until its send is waited for. Activations are waited for when
    # their micro-batch's gradient comes back, gradients one gradient later, so what a stage
    # keeps only for its sends is at most two input gradients and the small headers, not m of each.
    stages = 3
    runs = [PipeRun(schedule=s, micro_batches=m) for s in ("gpipe", "1f1b") for m in (2, 8)]
    per_rank = launch.spawn(pipeline_lab.pipeline_steps, runs, world_size=stages)
    for index, run in enumerate(runs):
        activation = (run.batch_size // run.micro_batches) * run.gpt.context * run.gpt.n_embd * 4
        headers = run.micro_batches * HEADER_LENGTH * 8
        kept = [rank_results[index]["peak_sent_bytes"] for rank_results in per_rank]
        assert kept[0] <= headers, (run, kept)  # stage 0 sends activations only: its outputs
        assert all(activation <= k <= 2 * activation + headers for k in kept[1:]), (run, kept)

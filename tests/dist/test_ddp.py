"""Lesson 77 on real gloo ranks: our DDP wrappers against one process and against torch DDP.

Tolerances (float32, 4 ranks, 10 steps):
- ranks among themselves: bitwise equal (they apply the same averaged gradient);
- losses: within 1e-5 of one process (measured: below 1e-6);
- SGD parameters: within 1e-6 (measured: 1.2e-7). A rank's gradient is averaged in another order
  than the full-batch gradient, so each step differs by about one float32 rounding (6e-8 relative);
- Adam parameters: within 1e-4 (measured: 1.1e-5), except MiniGPT's attention key biases. Their true
  gradient is exactly zero (adding the same number to every score of a query leaves the softmax
  unchanged), so what autograd computes is rounding noise, which Adam divides by its own size and
  turns into steps in either direction: lr * g / (g + eps) at first, about 1% of lr for the
  measured g ~ 1e-10 (lesson 77 derives it), and never much more than lr, Adam's largest step.
  No elementwise bound there would tell a right run from a wrong one, so the whole run is also
  held to `tolerances.relative_distance` (which a wrong gradient breaks: see
  test_the_bounds_catch_a_gradient_applied_one_element_off), and a test
  checks that the key biases' gradient is indeed at noise level.
"""

import math
import time
from dataclasses import replace
from unittest import mock

import pytest
import torch
from torch import nn

from lesson_code import ddp as ddp_module, ddp_exercises, ddp_lab, launch
from lesson_code.collectives.comm import Communicator
from lesson_code.ddp import BucketedDDP, NaiveDDP, broadcast_parameters, make_buckets
from lesson_code.ddp_lab import DDPRun, train_ranks, train_single_process
from lesson_code.collectives.ledger import CommLedger
from lesson_code.experiment import flat_parameters
from lesson_code.models import MLP, build_model, count_parameters
from lesson_code.harness.reference import in_one_rank
from tolerances import FLOAT32_RELATIVE, relative_distance
from wrong_variants import train_wrong_ddp

STEPS = 10


def assert_matches(result, reference, run):
    assert max(abs(a - b) for a, b in zip(result["losses"], reference["losses"])) < 1e-5
    diff = (result["params"] - reference["params"]).abs()
    if run.optimizer == "sgd":
        assert diff.max() < 1e-6, diff.max()
        return
    keys = ddp_lab.attention_key_bias_mask(build_model(run.model, run.seed, run.gpt))
    assert diff[~keys].max() < 1e-4, diff[~keys].max()
    start = build_model(run.model, run.seed, run.gpt)
    distance = relative_distance(result["params"], reference["params"], flat_parameters(start))
    assert distance < FLOAT32_RELATIVE, distance


@pytest.fixture(scope="module")
def references():
    cache = {}

    def get(run):
        key = (run.model, run.optimizer)
        if key not in cache:
            cache[key] = in_one_rank(train_single_process, replace(run, wrapper="naive", accumulation=1))
        return cache[key]
    return get


@pytest.mark.parametrize("model", ["mlp", "gpt"])
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_wrappers_equal_one_process_and_torch_ddp(model, optimizer, references):
    base = DDPRun(model=model, optimizer=optimizer, steps=STEPS)
    reference = references(base)
    results = {wrapper: launch.spawn(train_ranks, replace(base, wrapper=wrapper), world_size=4)
               for wrapper in ("naive", "bucketed", "torch")}
    for wrapper, per_rank in results.items():
        assert all(torch.equal(r["params"], per_rank[0]["params"]) for r in per_rank), wrapper
        assert_matches(per_rank[0], reference, base)
    for wrapper in ("naive", "bucketed"):  # (b) the same check against torch DDP itself
        assert_matches(results[wrapper][0], results["torch"][0], base)


def test_key_bias_gradient_is_rounding_noise():
    gradients = ddp_lab.key_bias_gradients()
    assert gradients["key bias"] < 1e-6
    assert gradients["query bias"] > 1e-4 and gradients["value bias"] > 1e-4  # these do learn


def test_broadcast_demo_and_ledger_per_step():
    norms = launch.spawn(ddp_lab.broadcast_demo, world_size=3)
    assert len({row["norm before"] for row in norms}) == 3
    assert {row["norm after"] for row in norms} == {norms[0]["norm before"]}
    run = DDPRun(model="gpt", bucket_cap_mb=0.05)
    naive = launch.spawn(ddp_exercises.ledger_per_step, replace(run, wrapper="naive"), world_size=4)
    bucketed = launch.spawn(ddp_exercises.ledger_per_step, run, world_size=4)
    parameters = len(list(build_model("gpt", 0).parameters()))
    assert naive[0]["gradient all-reduces"] == parameters
    assert bucketed[0]["gradient all-reduces"] < parameters
    assert sum(r["bytes sent"] for r in naive) == sum(r["bytes sent"] for r in bucketed)
    # and one check that no gradient is missing, outside the ledger, per synchronised backward
    assert {r["check all-reduces (one number, outside the ledger)"] for r in naive + bucketed} == {1}


@pytest.mark.parametrize("wrapper", ["bucketed", "torch"])
@pytest.mark.parametrize("model", ["mlp", "gpt"])
def test_accumulation_with_no_sync_equals_one_big_batch(wrapper, model, references):
    run = DDPRun(model=model, optimizer="sgd", wrapper=wrapper, accumulation=4, steps=STEPS)
    per_rank = launch.spawn(train_ranks, run, world_size=4)
    assert all(torch.equal(r["params"], per_rank[0]["params"]) for r in per_rank)
    assert_matches(per_rank[0], references(run), run)


def broadcast_from_different_starts(rank, world_size):
    torch.manual_seed(100 + rank)
    model = nn.Sequential(nn.Linear(5, 7), nn.BatchNorm1d(7))
    model[1].running_mean.fill_(float(rank))
    before = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    broadcast_parameters(model, src=1)
    after = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return {"before": before, "after": after, "running_mean": model[1].running_mean.clone()}


def test_broadcast_makes_every_rank_equal_to_the_source():
    results = launch.spawn(broadcast_from_different_starts, world_size=4)
    assert not torch.equal(results[0]["before"], results[1]["before"])
    for r in results:
        assert torch.equal(r["after"], results[1]["before"])
        assert torch.equal(r["running_mean"], torch.full((7,), 1.0))


def mismatched_models(rank, world_size):
    model = MLP(hidden=64 if rank != 2 else 65)
    BucketedDDP(model)


def test_parameters_that_differ_across_ranks_are_named():
    with pytest.raises(launch.RankFailedError) as caught:
        launch.spawn(mismatched_models, world_size=4)
    assert "holds different parameters from rank 0" in str(caught.value)
    assert "rank 2" in str(caught.value) and "layers.0.weight" in str(caught.value)


def test_bad_wrapper_arguments_are_explained():
    frozen = nn.Linear(3, 3).requires_grad_(False)
    with pytest.raises(ValueError, match="has no trainable parameters"):
        NaiveDDP(frozen)
    for cap in (0, -1.0):
        with pytest.raises(ValueError, match=f"bucket_cap_mb must be positive, got {cap!r}"):
            BucketedDDP(MLP(), bucket_cap_mb=cap)


def unused_parameter(rank, world_size):
    model = nn.ModuleDict({"used": nn.Linear(4, 1), "unused": nn.Linear(4, 1)})
    wrapped = BucketedDDP(model)
    try:
        wrapped.module["used"](torch.ones(2, 4)).sum().backward()
    except RuntimeError as error:
        return str(error)
    return "no error"


def test_a_parameter_without_gradient_is_reported_by_name():
    message = launch.spawn(unused_parameter, world_size=2)[0]
    assert "received no gradient" in message and "unused.weight" in message


def test_the_sync_decision_is_taken_at_forward_time():
    """Our wrapper and torch's DDP alike."""
    outcomes = launch.spawn(ddp_exercises.no_sync_timing_demo, world_size=2)[0]
    for wrapper in ("bucketed", "torch"):
        # Forward inside no_sync: the backward after it does not synchronise (ranks now disagree).
        assert outcomes[wrapper]["forward inside no_sync"] is False, wrapper
        # Forward outside: the backward synchronises even though the flag is set by then.
        assert outcomes[wrapper]["backward inside no_sync"] is True, wrapper


def test_clipping_every_micro_batch_under_no_sync_leaves_the_ranks_agreeing_on_a_wrong_gradient():
    # Exercise 5: clipping after each no_sync() backward clips each rank's partial local sum;
    # the last backward still averages, so the ranks agree, but not with one process's clip.
    run = DDPRun(model="gpt", bucket_cap_mb=0.05, accumulation=4)
    results = launch.spawn(ddp_exercises.clipping_under_no_sync, run, world_size=4)
    assert all(result == results[0] for result in results)
    right = results[0]["clipped once, after the average"]
    wrong = results[0]["clipped after every backward"]
    assert right["ranks_identical"] and wrong["ranks_identical"]
    assert right["largest difference from one process"] < 1e-6
    assert wrong["relative to the largest gradient element"] > 0.1


@pytest.mark.parametrize("algorithm", ["auto", "recursive_doubling", "halving_doubling"])
def test_every_all_reduce_algorithm_trains_as_one_process(algorithm, references):
    """Lesson 76's other all-reduces under the bucketed wrapper: Adam on MiniGPT, 4 ranks (equal
    slices of the batch of 16), the same tolerance as the ring."""
    run = DDPRun(model="gpt", optimizer="adam", steps=STEPS, all_reduce=algorithm)
    per_rank = launch.spawn(train_ranks, run, world_size=4)
    assert all(torch.equal(r["params"], per_rank[0]["params"]) for r in per_rank)
    assert_matches(per_rank[0], references(run), run)


def ledger_of_one_step(rank, world_size):
    """One step's ledger, then the tensors the ranks' agreement on missing gradients
    all-reduced at that backward and at the next one (each kept, so none can take another's
    place)."""
    ledger = CommLedger()
    model = BucketedDDP(build_model("gpt", 0), bucket_cap_mb=0.05,
                        comm=Communicator("ring", ledger, algorithm="ring"))  # the ring's bytes
    ledger.clear()  # forget the initial broadcast
    x, y = DDPRun(model="gpt").local_batch(0, rank, world_size)
    agreed, all_reduce = [], ddp_module.dist.all_reduce

    def recording(tensor, *args, **kwargs):
        agreed.append(tensor)
        return all_reduce(tensor, *args, **kwargs)

    with mock.patch.object(ddp_module.dist, "all_reduce", recording):
        model(x, y)[1].backward()
        sent = ledger.totals()["all_reduce"]["bytes_sent"]
        model(x, y)[1].backward()
    return {"sent": sent, "buckets": len(model.buckets),
            "agreed": [(t.numel(), t.untyped_storage().data_ptr()) for t in agreed]}


def test_one_step_sends_one_all_reduce_of_the_gradients():
    world_size = 4
    results = launch.spawn(ledger_of_one_step, world_size=world_size)
    gradient_bytes = 4 * count_parameters(build_model("gpt", 0))
    assert results[0]["buckets"] > 1
    assert sum(r["sent"] for r in results) == 2 * (world_size - 1) * gradient_bytes
    # The agreement reduces the same one-number tensor at every backward: one made afresh each
    # time would be held by gloo's worker thread for a while after the wait, and outlive the
    # step by a time that varies (lesson 78b's peaks on real ranks would vary with it).
    for result in results:
        (size, first), (_, second) = result["agreed"]
        assert size == 1 and first == second, result["agreed"]


def test_buckets_respect_the_cap_and_keep_every_parameter_once():
    params = [torch.zeros(n) for n in (10, 300, 5, 5, 1000, 1)]
    buckets = make_buckets(params, cap_bytes=4 * 320)
    assert [len(b.params) for b in buckets] == [4, 1, 1]
    assert [p for b in buckets for p in b.params] == params
    assert all(b.flat.numel() * 4 <= 4 * 320 or len(b.params) == 1 for b in buckets)


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_the_bounds_catch_a_gradient_applied_one_element_off(optimizer, references):
    run = DDPRun(model="gpt", optimizer=optimizer, steps=STEPS)
    wrong = launch.spawn(train_wrong_ddp, run, world_size=4)
    assert all(torch.equal(r["params"], wrong[0]["params"]) for r in wrong)  # ranks still agree
    with pytest.raises(AssertionError):
        assert_matches(wrong[0], references(run), run)
    start = flat_parameters(build_model("gpt", 0))
    assert relative_distance(wrong[0]["params"], references(run)["params"], start) > 0.5


def test_time_variants_times_every_run_in_every_round():
    """The benchmark's timing (bench.ddp): samples[run][round][step] of every run, with the
    same phases for each; torch DDP keeps no wait or check of its own (NaN), ours do, and they
    are taken out of the backward rather than counted twice."""
    runs = [DDPRun(model="mlp", wrapper=wrapper, comm="builtin" if wrapper == "torch" else "ring")
            for wrapper in ("naive", "bucketed", "torch")]
    per_rank = launch.spawn(ddp_lab.time_variants, runs, 3, 2, 1, world_size=2)
    for samples in per_rank:
        assert [[len(round_) for round_ in rounds] for rounds in samples] == [[2, 2, 2]] * 3
        for run, rounds in zip(runs, samples):
            for phases in (p for round_ in rounds for p in round_):
                assert set(phases) == {"forward", "backward", "optimizer", "step", "wait", "check", "comm"}
                if run.wrapper == "torch":
                    assert math.isnan(phases["wait"]) and math.isnan(phases["check"])
                else:
                    assert phases["wait"] >= 0 and phases["check"] >= 0 and phases["backward"] >= 0
                    assert phases["forward"] + phases["backward"] + phases["wait"] + \
                        phases["check"] + phases["optimizer"] <= phases["step"] * (1 + 1e-9)


def test_rebuilt_buckets_bring_back_the_overlap_a_registration_order_took_away():
    """Exercise 6: layers run in the reverse of their registration order. Before the rebuild the
    first bucket waits for the backward's last gradient, so no all-reduce starts during the
    backward; after it, every bucket but the last does. A count of events, not a timing."""
    per_rank = launch.spawn(ddp_exercises.registration_order_demo, world_size=4)
    rows = per_rank[0]
    assert [r["started during backward"] for r in rows] == [0, 5, 5]
    assert {r["buckets"] for r in rows} == {6}
    for rank_rows in per_rank:  # the gradients stay the mean of the ranks' own gradients
        assert all(r["largest difference from the mean gradient"] < 1e-6 for r in rank_rows)


def test_a_bfloat16_hook_runs_on_gloo_and_rounds_within_its_first_order_estimate():
    """Exercise 5: torch's bf16_compress_hook is refused on gloo by name; cast_allreduce_hook
    casts the same way. Each SGD step moves a parameter by lr times an averaged gradient whose
    bf16 roundings (the cast, then up to N - 1 additions; dividing by 4 is exact) are each at
    most 2**-8 of the largest |gradient|: so after `steps` steps the difference from one process
    is, to first order (ignoring how earlier differences change later gradients), at most
    steps * lr * N * 2**-8 * largest. The float32 run through the same hook is DDP's own
    average, a few float32 roundings away."""
    run = DDPRun(model="gpt", wrapper="torch", steps=5)
    float32, bf16 = launch.spawn(ddp_exercises.reduced_in, run, world_size=4)[0]
    assert float32["ranks_identical"] and bf16["ranks_identical"]
    assert float32["max_param_diff"] < 1e-6
    lr = ddp_lab.OPTIMIZERS["sgd"][1]
    estimate = run.steps * lr * 4 * 2 ** -8 * bf16["largest |gradient|"]
    assert 100 * float32["max_param_diff"] < bf16["max_param_diff"] < estimate


def test_dividing_by_the_global_token_count_equals_one_process():
    """Exercise 4: slices with 64, 48, 32 and 16 counted tokens. Averaging per-rank means weighs
    the tokens unequally (a difference of the gradient's own order); dividing each rank's sum
    by the all-reduced count gives one process's gradient up to float32 rounding."""
    result = launch.spawn(ddp_exercises.token_weighted_gradients, world_size=4)[0]
    assert result["tokens per rank"] == [64, 48, 32, 16]
    assert result["global token count"] < 1e-6
    assert result["per-rank mean"] > 0.1 * result["largest gradient"]


def test_the_overlap_timeline_puts_every_rank_on_one_clock():
    """ddp_lab.overlap_timeline gives seconds since the earliest rank began the step, read on the
    clock every process of the machine shares: the earliest rank starts at 0 and no rank before
    it. And a ring all-reduce returns on a rank only once every rank's share has reached it, so
    each rank's all-reduce of a bucket ends after every rank started it: times on clocks offset
    by more than an all-reduce would break that, times on one clock cannot."""
    timelines = launch.spawn(ddp_lab.overlap_timeline, DDPRun(model="mlp"), world_size=4)
    starts = [timeline["forward"][0] for timeline in timelines]
    assert min(starts) == 0.0 and all(start >= 0.0 for start in starts)
    for timeline in timelines:
        spans = [timeline[phase] for phase in ("forward", "backward", "wait", "check")]
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))  # one after another
    counts = {len(timeline["buckets"]) for timeline in timelines}
    assert len(counts) == 1 and counts.pop() > 1
    for k in range(len(timelines[0]["buckets"])):
        last_start = max(timeline["buckets"][k]["start"] for timeline in timelines)
        assert all(timeline["buckets"][k]["end"] > last_start for timeline in timelines), k


LATE_S = 0.2  # how much later each rank than the one before leaves a step's barrier, below


def timeline_with_late_ranks(rank, world_size):
    barrier = torch.distributed.barrier

    def late_barrier(*args, **kwargs):  # PhaseClock.start's barrier, then rank r waits r LATE_S
        barrier(*args, **kwargs)
        time.sleep(rank * LATE_S)

    with mock.patch("torch.distributed.barrier", late_barrier):
        return ddp_lab.overlap_timeline(rank, world_size, DDPRun(model="mlp"))


def test_a_rank_that_begins_the_step_later_starts_later_on_the_one_clock():
    """Rank r begins each step r LATE_S after rank 0: on one clock its forward starts about that
    much later (the ranks leave a barrier far less than LATE_S / 2 apart), where times since each
    rank's own start would put every rank at 0. No all-reduce can end before the last rank began."""
    timelines = launch.spawn(timeline_with_late_ranks, world_size=4)
    starts = [timeline["forward"][0] for timeline in timelines]
    assert starts[0] == 0.0
    assert all(later - earlier > LATE_S / 2 for earlier, later in zip(starts, starts[1:])), starts
    assert min(bucket["end"] for timeline in timelines for bucket in timeline["buckets"]) > starts[-1]


def timeline_on_two_hosts(rank, world_size):
    with mock.patch("socket.gethostname", return_value=f"node{rank}"):
        ddp_lab.overlap_timeline(rank, world_size, DDPRun(model="mlp"))


def test_the_overlap_timeline_refuses_ranks_on_several_machines():
    with pytest.raises(launch.RankFailedError) as caught:
        launch.spawn(timeline_on_two_hosts, world_size=2)
    assert "needs every rank on one machine" in str(caught.value)
    assert "['node0', 'node1']" in str(caught.value)

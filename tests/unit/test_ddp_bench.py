"""Lesson 77's benchmark table (bench.ddp.summarise) from what every rank timed: of each step the
slowest rank's phases, medians over all steps, and each variant's step against torch DDP's and
the one-bucket variant's round by round. Made-up timings, so every figure is known."""

import math

import pytest

from lesson_code.bench import ddp as ddp_bench, stored

VARIANTS = [("naive", "ring", 4.0), ("torch", "builtin", 4.0),
            ("bucketed", "ring", ddp_bench.ONE_BUCKET_MB)]


def phases(step: float, backward: float) -> dict:
    return {"forward": 0.1, "backward": backward, "wait": 0.0, "check": 0.0, "optimizer": 0.0,
            "step": step, "comm": 0.0}


def timings(rank: int) -> list:
    """samples[variant][round][step] of `rank`: 2 rounds of 1 step. Rank 1's steps are the
    longer, with a backward of 0.5 s against rank 0's 0.2 s."""
    backward = 0.5 if rank == 1 else 0.2
    scale = 1.0 if rank == 1 else 0.9
    steps = {"naive": (3.0, 6.0), "torch": (1.0, 2.0), "bucketed": (1.5, 1.0)}
    return [[[phases(scale * seconds, backward)] for seconds in steps[wrapper]]
            for wrapper, _, _ in VARIANTS]


def test_the_table_takes_each_steps_slowest_rank_and_compares_round_by_round():
    table = ddp_bench.summarise([timings(0), timings(1)], VARIANTS).set_index("wrapper")
    assert table.loc["torch", "backward_ms"] == pytest.approx(500)  # rank 1's, whose step is longer
    assert table.loc["naive", "step_ms"] == pytest.approx(4500)  # median of 3 s and 6 s
    assert (table.loc["naive", "step_low_ms"], table.loc["naive", "step_high_ms"]) == (3000, 6000)
    assert table.loc["naive", "vs_torch"] == 3.0  # 3/1 and 6/2: the same ratio in each round
    assert table.loc["naive", "vs_torch_low"] == table.loc["naive", "vs_torch_high"] == 3.0
    assert (table.loc["bucketed", "vs_torch_low"], table.loc["bucketed", "vs_torch_high"]) == (0.5, 1.5)
    assert table.loc["bucketed", "vs_one_bucket"] == 1.0 and table.loc["torch", "vs_torch"] == 1.0
    assert math.isnan(table.loc["naive", "bucket_mb"])  # the naive wrapper has no buckets


def test_comm_before_backward_end_is_the_median_of_each_steps_comm_minus_wait():
    """Three steps whose comm - wait is 0.1, 0.2 and 0.3 s: the median is 0.2 s, where the
    median comm (1.0 s) minus the median wait (0.9 s) would give 0.1 s."""
    per_step = [(1.0, 0.9), (0.5, 0.3), (2.0, 1.7)]  # (comm, wait) of each round's step
    samples = [[[{**phases(1.0, 0.2), "comm": comm, "wait": wait}] for comm, wait in per_step]
               for _ in VARIANTS]
    table = ddp_bench.summarise([samples], VARIANTS).set_index("wrapper")
    assert table.loc["naive", "comm_ms"] - table.loc["naive", "wait_ms"] == pytest.approx(100)
    assert table.loc["naive", "hidden_comm_ms"] == pytest.approx(200)


def test_the_book_table_renames_the_columns_it_explains_and_rounds_only_times_and_ratios():
    table = ddp_bench.summarise([timings(0), timings(1)], VARIANTS)
    table.loc[2, "bucket_mb"] = 0.25  # a size that rounding to 0.1 would change
    shown = ddp_bench.book_table(table).set_index("wrapper")
    assert list(shown.columns) == list(ddp_bench.BOOK_COLUMNS.values())[1:]
    # every phase of the step, so that a row's phases add up to about its step
    assert {"forward", "backward", "wait", "check", "optimizer"} <= set(shown.columns)
    assert shown.loc["bucketed", "bucket MiB"] == 0.25
    assert shown.loc["naive", "comm during backward"] == table.loc[0, "hidden_comm_ms"]
    assert (shown.loc["bucketed", "vs one bucket low"], shown.loc["bucketed", "vs one bucket high"]) == (1.0, 1.0)
    assert shown.loc["bucketed", "vs torch low"] == 0.5 and shown.loc["torch", "step"] == 1500
    # each ratio with its median and its range, so that no round's extreme stands alone
    assert (shown.loc["bucketed", "vs torch"], shown.loc["bucketed", "vs torch high"]) == (1.0, 1.5)
    assert shown.loc["naive", "vs one bucket"] == table.loc[0, "vs_one_bucket"]


def test_lesson_77s_text_matches_the_stored_run():
    """The claims lesson 77's benchmark section makes of measured_ddp.csv, checked on the stored
    table as the page shows it; a new stored run that changes them must change the text too."""
    bench = ddp_bench.book_table(stored.load("ddp")[0])
    ours = bench.query("wrapper == 'bucketed' and communicator == 'ring'").set_index("bucket MiB")
    one = ours.index.max()  # the control: one bucket that holds every gradient, no overlap
    naive = bench.query("wrapper == 'naive'").iloc[0]
    level = bench[(bench["wrapper"] == "bucketed") & (bench["bucket MiB"] != 0.25)]  # 4 MiB, control
    assert naive["vs torch low"] > 1  # the naive wrapper: slower than PyTorch's DDP in every round
    assert level["vs torch"].tolist() == [1.01, 1.01, 0.98]  # level with PyTorch's DDP, within the noise:
    assert ((level["vs torch low"] < 1) & (level["vs torch high"] > 1)).all()  # faster in some rounds
    assert (ours.drop(one)["comm during backward"] > ours.drop(one)["comm"] / 2).all()
    assert ours.loc[4, "vs one bucket"] == 1.03  # overlap (ring against ring): no saving
    assert bench.query("communicator == 'builtin'")["vs one bucket"].eq(1.02).all()
    assert ours.loc[4, "vs one bucket low"] < 1 < ours.loc[4, "vs one bucket high"]
    assert 0 < ours.loc[one, "wait"] - ours.loc[4, "wait"] < ours.loc[4, "backward"] - ours.loc[one, "backward"]
    assert ours.loc[0.25, "vs one bucket low"] > 1 and ours["backward"].idxmax() == 0.25  # 0.25 MiB: slower
    assert (ours.loc[one, "wait"], ours.loc[4, "wait"]) == (60.0, 24.9)  # the warning box's numbers
    assert (ours.loc[one, "backward"], ours.loc[4, "backward"]) == (341.6, 377.5)

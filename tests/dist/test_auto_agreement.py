"""`algorithm="auto"` chooses alike on every rank, whatever times each rank's machine holds;
and a run that hangs anyway says where each rank waited.

Two nodes can hold different tables (one ran `make bench`, or they have separate checkouts).
Were each rank to choose from its own, they would run different algorithms and wait for each
other until a timeout. The group agrees on rank 0's decisions the first time it uses "auto".
"""

import time

import pytest

from lesson_code import launch
from lesson_code.collectives import choose

from own_tables import (NUMEL, calibrated_choice, collectives_with_own_tables,
                        costs_differing_near_a_switch, receive_before_sending, two_algorithms,
                        write_ring_fastest)

pytestmark = pytest.mark.dist
COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather")


@pytest.mark.parametrize("ring_rank", [1, 0])
def test_ranks_holding_other_tables_follow_rank_0s_and_sum_right(tmp_path, capfd, ring_rank):
    folder = write_ring_fastest(tmp_path / "ring-fastest")
    start = time.monotonic()
    results = launch.spawn(collectives_with_own_tables, {ring_rank: str(folder)},
                           world_size=4, timeout_s=60)
    elapsed = time.monotonic() - start
    for collective in COLLECTIVES:
        per_rank = [result[collective] for result in results]
        assert all(rank["right"] for rank in per_rank), (collective, per_rank)
        own = [rank["own"] for rank in per_rank]
        # The tables disagree at this size: the ring-fast one says "ring", the book's does not.
        assert own[ring_rank] == "ring" and all(o != "ring" for r, o in enumerate(own) if r != ring_rank)
        assert {rank["chosen"] for rank in per_rank} == {own[0]}, (collective, per_rank)
    assert elapsed < 30, f"{elapsed:.1f} s: the ranks must not wait for each other"
    # The ranks that differ from rank 0 each say so, in one line per collective.
    warnings = [line for line in capfd.readouterr().err.splitlines() if "follows rank 0's" in line]
    differing = [ring_rank] if ring_rank else [1, 2, 3]
    assert sorted(warnings) == sorted(
        line for line in warnings if any(f"rank {r}:" in line for r in differing))
    assert len(warnings) == len(differing) * len(COLLECTIVES), warnings


def test_a_table_cut_short_on_every_rank_gives_way_to_the_packages_said_once(tmp_path, capfd):
    folder = write_ring_fastest(tmp_path / "cut-short")
    damaged = folder / "measured_all_reduce.csv"
    text = damaged.read_text().rstrip()
    damaged.write_text(text[: text.rindex(",")])  # the last row lost its seconds
    results = launch.spawn(collectives_with_own_tables, {r: str(folder) for r in range(4)},
                           world_size=4, timeout_s=60)
    assert all(rank["all_reduce"]["right"] for rank in results)
    packaged = choose.stored_costs(choose.STORED).decisions(4).choose(NUMEL * 4)
    assert {rank["all_reduce"]["chosen"] for rank in results} == {packaged} != {"ring"}
    assert {rank["reduce_scatter"]["chosen"] for rank in results} == {"ring"}  # still its own
    said = [line for line in capfd.readouterr().err.splitlines() if "lesson_code:" in line]
    assert len(said) == 1, said  # rank 0 alone, once, however often the ranks read the table
    assert f"{damaged}, line " in said[0] and "the package's all_reduce times" in said[0]


def test_ranks_given_costs_that_decide_apart_near_a_switch_follow_rank_0s(capfd):
    results = launch.spawn(costs_differing_near_a_switch, world_size=4, timeout_s=60)
    own = [rank["own"] for rank in results]
    assert own[1] != own[0] == own[2] == own[3], own  # rank 1's own fit decides otherwise
    assert [rank["chosen"] for rank in results] == [own[0]] * 4
    assert all(rank["right"] for rank in results), results
    said = [line for line in capfd.readouterr().err.splitlines() if "follows rank 0's" in line]
    assert len(said) == 1 and "rank 1: its all_reduce times (rank 1's fit)" in said[0], said


def test_ranks_in_different_algorithms_are_named_with_where_they_wait():
    with pytest.raises(launch.RankTimeoutError) as caught:
        launch.spawn(two_algorithms, world_size=4, timeout_s=3)
    where = caught.value.where
    assert sorted(where) == [0, 1, 2, 3], str(caught.value)
    assert any(call.startswith("ring_all_reduce (lesson_code/collectives/ring.py:")
               for call in where[1]), where[1]
    for rank in (0, 2, 3):
        assert any(call.startswith("naive_all_reduce ") for call in where[rank])
        assert not any(call.startswith("ring_all_reduce ") for call in where[rank])
    assert "wait in different places" in str(caught.value)
    assert "rank 1: " in str(caught.value) and "two_algorithms (own_tables.py:" in str(caught.value)


def test_a_ring_of_receives_before_sends_is_named_as_every_rank_waiting_in_dist_recv():
    with pytest.raises(launch.RankTimeoutError) as caught:
        launch.spawn(receive_before_sending, world_size=3, timeout_s=3)
    where = caught.value.where
    assert sorted(where) == [0, 1, 2]
    assert {tuple(calls) for calls in where.values()} == {tuple(where[0])}
    assert where[0][0].startswith("recv (torch/distributed/")  # what the rank is blocked in
    assert where[0][1].startswith("receive_before_sending (own_tables.py:")
    assert "Every rank waits in a blocking dist.recv" in str(caught.value)


def test_calibrating_on_the_ranks_fits_the_same_costs_on_every_rank():
    # What a multi-node job does instead of `make bench`, which measures one machine's ranks.
    results = launch.spawn(calibrated_choice, world_size=2, timeout_s=120)
    assert all(rank["right"] for rank in results)
    assert set(results[0]["fits"]) == set(choose.ALL_REDUCE)
    assert results[0]["source"] == "calibrated on 2 ranks"
    assert all((rank["fits"], rank["decisions"]) == (results[0]["fits"], results[0]["decisions"])
               for rank in results)

"""The cost model of pages 80a and 80b (`checkpoint_lab.save_costs`): the figures the pages quote."""

import math

import pytest

from lesson_code.checkpoint_lab import save_costs


def test_lesson_80s_example_gives_the_figures_the_pages_quote() -> None:
    costs = save_costs()
    assert round(64 * costs.shard_gb) == 90 and round(costs.shard_gb, 2) == 1.41
    assert costs.replicated_gb == 15.0 and round(costs.shard_gb + costs.replicated_gb, 1) == 16.4
    assert [round(s, 1) for s in costs.table["s"]] == [3.8, 1.0, 5.0, 10.7, 20.5, 3.8, 4.8, 43.8, 55.5]
    assert round(costs.blocking_s, 2) == 20.47 and costs.table["GB"].iloc[-2] == 131.25
    # load_zero's load: the node's read of 131.25 GB, then each rank hashing its 16.4 GB
    assert math.isclose(costs.table["s"].iloc[-1], 131.25 / 3.0 + (costs.shard_gb + 15.0) / 1.4)
    assert costs.table["bound by"].tolist()[:4] == ["client", "core", "client", "core"]


def test_without_loads_the_table_stops_at_the_blocking_save() -> None:
    costs = save_costs(loads=False)
    assert [round(s, 1) for s in costs.table["s"]] == [3.8, 1.0, 5.0, 10.7, 20.5]
    assert costs.table.index[-1] == "blocking save, in all"


def test_each_knob_moves_the_parts_it_bounds() -> None:
    base, fast_hash = save_costs(), save_costs(hash_gb_s=2.8)
    assert math.isclose(fast_hash.table["s"].iloc[3], base.table["s"].iloc[3] / 2)  # hash replicated.pt
    assert fast_hash.table["s"].iloc[2] == base.table["s"].iloc[2]  # its write is the client's
    assert math.isclose(save_costs(ranks=128).shard_gb, base.shard_gb / 2)


def test_the_shown_table_marks_empty_cells_and_rounds() -> None:
    shown = save_costs().shown()
    assert shown.loc["blocking save, in all"].tolist() == ["—", "—", 20.47]
    assert shown.loc["hash replicated.pt (rank 0)", "s"] == 10.71


def test_the_node_rows_name_per_node_in_both_languages() -> None:
    from lesson_code.plots import checkpoint

    table = save_costs(ranks=48, per_node=4).table
    assert "write the shards (a node's 4 ranks)" in table.index
    assert "read the shards and replicated.pt (a node's 4 ranks)" in table.index
    shown = checkpoint.table(table, "fa")
    assert "نوشتن شاردها (۴ رتبهٔ یک گره)" in shown.index
    assert "خواندن شاردها (۴ رتبهٔ یک گره)" in shown.index
    assert save_costs().table.index[0] == "write the shards (a node's 8 ranks)"


@pytest.mark.parametrize("knobs, named", [
    ({"ranks": 0}, "ranks"), ({"hash_gb_s": 0}, "hash_gb_s"), ({"client_gb_s": -3.0}, "client_gb_s"),
    ({"parameters": -1}, "parameters"), ({"per_node": 2.5}, "per_node"),
    ({"per_node": 16, "ranks": 8}, "per_node must be at most ranks")])
def test_a_knob_a_reader_sets_wrong_is_refused_by_name(knobs, named) -> None:
    with pytest.raises(ValueError, match=named):
        save_costs(**knobs)

"""The measured tables lessons 79 and 81 read: stored with the package, with where and when."""

import pandas as pd
import pytest

from lesson_code.bench import capstone as capstone_bench
from lesson_code.bench import pipeline as pipeline_bench


@pytest.mark.parametrize("bench, columns", [
    (pipeline_bench, {"P", "m", "measured", "lowest", "highest", "formula", "imbalance_floor"}),
    (capstone_bench, {"median_s", "runs_s", "loss_rows", "same_losses"}),
])
def test_the_stored_table_says_which_machine_measured_it_and_when(bench, columns):
    note, table = bench.read_stored()
    assert any(line.startswith("machine: ") and "cores" in line for line in note)
    assert any("measured 20" in line and f"python -m lesson_code.bench {bench.__name__.split('.')[-1]}"
               in line for line in note)
    assert columns <= set(table.columns) | {table.index.name} and len(table) >= 2


def test_the_pipeline_table_covers_its_sweep_and_round_trips(tmp_path):
    _, table = pipeline_bench.read_stored()
    assert {(p, m) for p, m in zip(table["P"], table["m"])} == {
        (p, m) for p in pipeline_bench.STAGES for m in pipeline_bench.MICRO_BATCHES}
    assert ((table["lowest"] <= table["measured"]) & (table["measured"] <= table["highest"])).all()
    path = pipeline_bench.store(table.head(2), "a note\nmachine: test", tmp_path / "t.csv")
    note, again = pipeline_bench.read_stored(path)
    assert note == ["a note", "machine: test"]
    pd.testing.assert_frame_equal(again, table.head(2))


def test_the_stored_pipeline_bubbles_show_what_lesson_79_reads_from_them():
    """Lesson 79's *The rest of the gap is this machine's* quotes these figures of the stored table."""
    _, table = pipeline_bench.read_stored()
    by_p = {p: rows.set_index("m") for p, rows in table.groupby("P")}
    excess = (by_p[2]["measured"] - by_p[2]["formula"]).round(3)
    assert excess.loc[[4, 16]].tolist() == [0.064, 0.091]  # equal stages, yet the excess grows with m
    # 4 one-thread ranks on 2 cores: boxes of pure compute would leave each rank idle half the step.
    assert (by_p[4].loc[[8, 16], "highest"] < 1 - 2 / 4).all()

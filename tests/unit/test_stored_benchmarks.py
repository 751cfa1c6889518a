"""The benchmark tables lessons 77 and 78 read: stored with the package, saying where and when."""

import datetime
import re
from pathlib import Path

import pandas as pd
import pytest

from lesson_code import memory
from lesson_code.bench import stored

COLUMNS = {  # what the lessons' cells read from each table
    "ddp": {"wrapper", "comm", "bucket_mb", "step_ms", "comm_ms", "wait_ms", "hidden_comm_ms",
            "vs_torch", "parameters"},
    "zero": {"forward_ms", "backward_ms", "optimizer_ms", "comm_ms", "step_ms", "vs_our_ddp",
             "parameters"},
    "zero_stages": {"stage", "formula", "peak", "gap", "peak_in", "at_start", "activations",
                    "after_backward", "largest_gather", "at_peak_gathered", "step_ms", "vs_ddp",
                    "parameters"},
}


@pytest.mark.parametrize("name", sorted(COLUMNS))
def test_the_stored_table_says_which_machine_measured_it_and_when(name: str) -> None:
    table, note = stored.load(name)
    assert COLUMNS[name] <= set(table.columns), sorted(COLUMNS[name] - set(table.columns))
    datetime.date.fromisoformat(note["measured"])
    assert "cores" in note["machine"] and "load average" in note["machine"]
    assert note["command"] == f"python -m lesson_code.bench {name}"
    assert len(table) >= 4 and (table["step_ms"] > 0).all()


def test_store_then_load_gives_back_the_table_and_its_note(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(stored, "STORED", tmp_path)
    table = pd.DataFrame({"wrapper": ["naive", "torch"], "step_ms": [2.5, 1.0]})
    path = stored.store(table, "ddp", "a description", tmp_path)
    assert path == tmp_path / "measured_ddp.csv"
    again, note = stored.load("ddp")
    pd.testing.assert_frame_equal(again, table)
    assert note["description"] == "a description"


def test_an_unknown_or_missing_table_is_named_with_the_fix(tmp_path, monkeypatch) -> None:
    with pytest.raises(ValueError, match="'pipe'.*ddp, zero"):
        stored.path_of("pipe")
    monkeypatch.setattr(stored, "STORED", tmp_path)
    with pytest.raises(FileNotFoundError, match="python -m lesson_code.bench zero"):
        stored.load("zero")


def test_the_bytes_sent_per_step_are_stored_in_mb_of_ten_to_the_six() -> None:
    # The lessons read MB_sent_per_step as MB (10**6 bytes); each rank sends the ring's bytes of
    # float32 gradients and parameters, which memory.traffic_per_step counts (the naive step: 1.5x).
    zero, note = stored.load("zero")
    ranks = int(re.search(r"(\d+) ranks", note["description"]).group(1))
    ring = memory.traffic_per_step("ZeRO-1", zero.loc["zero", "parameters"], ranks, dtype_bytes=4)
    expected = pd.Series({"ddp": ring, "zero": ring, "naive_zero": 1.5 * ring}) / 1e6
    pd.testing.assert_series_equal(zero.loc[expected.index, "MB_sent_per_step"], expected,
                                   check_names=False)
    stages, _ = stored.load("zero_stages")
    formula = [memory.traffic_per_step(stage, parameters, n, dtype_bytes=4) / 1e6
               for n, stage, parameters in zip(stages.index, stages["stage"], stages["parameters"])]
    assert stages["MB_sent_per_step"].tolist() == pytest.approx(formula, rel=1e-12)


def test_the_pipeline_step_ratios_lesson_79_quotes_are_the_stored_ones() -> None:
    # Lesson 79 gives, for each number of micro-batches m, the stored step time of 4 stages over
    # that of 2 stages; a new table comes with a new reading of it.
    table = pd.read_csv(Path(stored.STORED) / "measured_pipeline_bubble.csv", comment="#")
    steps = table.set_index(["P", "m"])["step_s"]
    ratios = (steps.loc[4] / steps.loc[2]).round(2)
    assert ratios.to_dict() == {1: 1.03, 2: 1.34, 4: 0.9, 8: 0.98, 16: 0.97}

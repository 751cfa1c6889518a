"""Lesson 80's pure helpers: Young's interval, a shard's own padding, the changes between two
states of a folder, and what latest_checkpoint says of a save in progress."""

import pickle

import pytest

from lesson_code.checkpoint import ManifestMissingError
from lesson_code.checkpoint.shards import flat_layout
from lesson_code.checkpoint.tools import Skipped, time_lost, young_interval
from lesson_code.checkpoint_lab import folder_changes


def test_young_interval_balances_the_saves_against_the_work_a_failure_loses():
    interval = young_interval(save_s=30.0, mtbf_s=3 * 3600.0)
    assert interval == pytest.approx(804.98, abs=0.01)  # sqrt(2 * 30 * 10800)
    best = time_lost(interval, 30.0, 3 * 3600.0)
    assert best == pytest.approx(2 * 30.0 / interval)  # at the optimum both terms are equal
    assert time_lost(interval / 2, 30.0, 3 * 3600.0) > best < time_lost(interval * 2, 30.0, 3 * 3600.0)
    for bad in (0, -1.0, True, "30"):
        with pytest.raises(ValueError, match="save_s must be a number of seconds above 0"):
            young_interval(bad, 3600.0)


def test_only_the_shards_past_the_real_elements_count_padding():
    # 6922 elements on 4 ranks: 1731 each, the last 2 past the end; on 3 ranks, 2308 each.
    assert [flat_layout(6922, start, 1731)["padding"] for start in (0, 1731, 3462, 5193)] == [
        0, 0, 0, 2]
    assert flat_layout(6922, 4616, 2308) == {"numel": 6922, "start": 4616, "length": 2308,
                                             "padding": 2}
    assert flat_layout(5, 6, 3)["padding"] == 3  # a shard wholly past the end: all padding


def test_folder_changes_name_a_renamed_folder_once():
    states = [["step-1/", "step-1/a"], ["step-1/", "step-1/a", ".tmp/"],
              ["step-1/", "step-1/a", ".tmp/", ".tmp/b"],
              ["step-1/", "step-1/a", "step-2/", "step-2/b"]]
    assert folder_changes(states) == ["—", "+ .tmp", "+ .tmp/b", "+ step-2; − .tmp"]


def test_a_save_in_progress_is_not_called_interrupted_and_travels_between_processes():
    error = ManifestMissingError("no manifest", path="root/.step-00000004.tmp/manifest.json",
                                 fault="manifest_missing", folder=".step-00000004.tmp")
    running = Skipped(".step-00000004.tmp", error, interrupted=True, running=True)
    assert running == (".step-00000004.tmp: a save in progress (a writer holds the folder's "
                       "lock), not published yet")
    assert "interrupted" not in running and "نیمه‌کاره" not in running.explain("fa")
    again = pickle.loads(pickle.dumps(running))
    assert (again, again.running, again.explain("fa")) == (running, True, running.explain("fa"))
    assert Skipped(".step-00000004.tmp", error, interrupted=True) == (
        ".step-00000004.tmp: an interrupted save, never published")

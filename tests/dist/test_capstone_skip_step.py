"""Lesson 81a: a step whose gradient is not finite under a finite loss is skipped.

One rank writes inf into one gradient element after backward at step 3; the loss the guard reads
stays finite. Every rank must skip that step alike: no weight changes, Adam's step count does not
move (so its bias correction stays that of the run that never saw the gradient), and the ranks
end with the same finite parameters.
"""

import math

import pytest
import torch

from lesson_code import launch
from lesson_code.capstone import CapstoneConfig
from lesson_code.capstone.skip_step import skip_nonfinite_gradient


def test_a_nonfinite_gradient_is_skipped_on_every_rank_before_the_step_count_moves(tmp_path):
    config = CapstoneConfig(steps=5, checkpoint_step=5, out_dir=str(tmp_path))
    results = launch.spawn(skip_nonfinite_gradient, config, world_size=4)
    for result in results:
        records = result["records"]
        assert math.isfinite(records[2]["loss"])  # the guard, which reads the loss, would pass it
        assert result["skipped"] == 1
        assert [row["weights_changed"] for row in records] == [True, True, False, True, True]
        assert [row["optimizer_step"] for row in records] == [1, 2, 2, 3, 4]
        assert torch.isfinite(result["params"]).all()
        assert torch.equal(result["params"], results[0]["params"])


def test_any_rank_s_shard_decides_for_every_rank(tmp_path):
    config = CapstoneConfig(steps=5, checkpoint_step=5, out_dir=str(tmp_path))
    results = launch.spawn(skip_nonfinite_gradient, config, 5, 2, world_size=4)  # rank 2, step 5
    for result in results:
        assert result["skipped"] == 1
        assert [row["optimizer_step"] for row in result["records"]] == [1, 2, 3, 4, 4]
        assert torch.equal(result["params"], results[0]["params"])


def test_a_bad_step_outside_the_run_is_refused_with_its_value():
    with pytest.raises(ValueError, match="bad_step=7"):
        skip_nonfinite_gradient(0, 1, CapstoneConfig(steps=5, checkpoint_step=5), bad_step=7)


def test_a_bad_rank_outside_the_run_is_refused_with_its_value():
    with pytest.raises(ValueError, match="bad_rank=4"):
        skip_nonfinite_gradient(0, 4, CapstoneConfig(steps=5, checkpoint_step=5), bad_rank=4)

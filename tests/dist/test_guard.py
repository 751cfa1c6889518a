"""The capstone's divergence guard against a fault that replays: a bad batch spikes on every retry.

A learning-rate spike does not repeat after a rollback, so replaying from the checkpoint cures it
(tests/dist/test_capstone.py). A mislabelled batch is read again, identically, on every replay:
the guard must stop retrying after `guard_retries` rollbacks and skip that batch, or, with
`skip_after_rollback`, skip the batches up to the spike at the first rollback. A skip assumes the
batch is at fault: when the weights hold an update that fails its own batch, the run stops instead.
"""

import pytest

from lesson_code import launch
from lesson_code.capstone import CapstoneConfig, run_rank
from lesson_code.capstone.guard import DivergenceGuard
from lesson_code.checkpoint.tools import list_checkpoints


def test_a_bad_batch_is_skipped_after_bounded_rollbacks(tmp_path):
    # spike_factor 1.2: a mislabelled batch at step 13 raises the loss by a quarter (1.25 times
    # step 12's, measured), where a clean step lowers it.
    config = CapstoneConfig(out_dir=str(tmp_path), steps=14, bad_batch_step=13, spike_factor=1.2,
                            guard_retries=2)
    results = launch.spawn(run_rank, config, world_size=4, timeout_s=60)  # looped for ever before
    events = results[0]["events"]
    assert [e["event"] for e in events] == ["rollback", "rollback", "skip"], events
    assert all(e["to_step"] == 10 for e in events[:2])
    assert events[2]["step"] == 13 and "skipped" in events[2]["message"]
    steps = [row["step"] for row in results[0]["records"]]
    assert 13 not in steps and steps[-1] == 14  # the bad batch never reached the optimizer
    assert all(r["events"] == events for r in results)  # every rank decided alike
    assert all("skipped" not in e for e in events)  # by default a rollback replays every batch


def test_a_rollback_that_skips_resumes_on_the_batches_after_the_spike(tmp_path):
    config = CapstoneConfig(out_dir=str(tmp_path), steps=14, bad_batch_step=13, spike_factor=1.2,
                            skip_after_rollback=True)
    results = launch.spawn(run_rank, config, world_size=4, timeout_s=60)
    events = results[0]["events"]
    assert [e["event"] for e in events] == ["rollback"], events  # the bad batch is never reread
    assert (events[0]["to_step"], events[0]["at_step"], events[0]["skipped"]) == (10, 13, [11, 12, 13])
    steps = [row["step"] for row in results[0]["records"]]
    assert steps == [*range(1, 13), 14]  # 11 and 12 before the spike; after it, step 14's batch
    assert results[0]["records"][-1]["loss"] < events[0]["loss"]
    assert all(r["events"] == events for r in results)


def run_until_stopped(rank, world_size, config):
    """This rank's RuntimeError message if `run_rank` stopped with one, else "finished"."""
    try:
        run_rank(rank, world_size, config)
    except RuntimeError as error:
        return str(error)
    return "finished"


def test_a_skip_never_keeps_an_update_that_fails_its_own_batch(tmp_path):
    # No rollback allowed: step 13's spiked update makes step 14's loss about 29 times step 13's,
    # so step 14's batch would be skipped on the spiked weights, then every later batch against
    # step 13's loss, and the step-20 checkpoint would keep those weights. Step 13's update fails
    # its own batch, so the run stops at step 14 on every rank and keeps only step 10's checkpoint.
    config = CapstoneConfig(out_dir=str(tmp_path), lr_spike_step=13, guard_retries=0)
    outcomes = launch.spawn(run_until_stopped, config, world_size=4, timeout_s=60)
    assert outcomes == [outcomes[0]] * 4, outcomes  # every rank stops alike
    message = outcomes[0]
    assert message.startswith("step 14's batch cannot be skipped"), message
    assert "step 13's update" in message and "lower the learning rate" in message
    assert "guard_retries" in message
    assert [step for step, _ in list_checkpoints(tmp_path / "checkpoints")] == [10]


def test_the_guard_bounds_the_rollbacks_of_each_step():
    guard = DivergenceGuard(spike_factor=2.0, max_retries=2)
    assert [guard.action(13) for _ in range(3)] == ["rollback", "rollback", "skip"]
    assert guard.action(14) == "rollback"  # each step has its own count
    assert DivergenceGuard(max_retries=0).action(1) == "skip"
    with pytest.raises(ValueError, match="guard_retries=-1"):
        CapstoneConfig(guard_retries=-1)

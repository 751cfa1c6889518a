"""Checkpoints at the edges: a ZeRO optimizer on a sub-group, ranks passed wrongly, a prune that
meets a damaged newest checkpoint or fails, a look for the latest during a save, and the folder's
lock: shared by readers, and named by whoever gives up waiting for it."""

import errno
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from lesson_code import checkpoint_lab, launch
from lesson_code.capstone import checkpointer as capstone_checkpointer
from lesson_code.capstone.checkpointer import Checkpointer, state_copy
from lesson_code.checkpoint import CheckpointError, save_sharded, shard_name, step_folder
from lesson_code.checkpoint.faults import flip_one_byte
from lesson_code.checkpoint.files import locked, write_file
from lesson_code.checkpoint.staging import seal, stage, staging_folder
from lesson_code.checkpoint.tools import latest_checkpoint, list_checkpoints, prune_checkpoints
from lesson_code.collectives.comm import Communicator
from lesson_code.zero import ZeroOptimizer
from lesson_code.zero_lab import ZeroRun, run_loss, run_model

RUN = ZeroRun(steps=4)


def _step(model, optimizer, step):
    optimizer.zero_grad()
    run_loss(RUN, model, step, optimizer.rank, optimizer.world_size).backward()
    optimizer.step()


def zero_on_a_sub_group(rank, world_size, root):
    """Ranks 1-3 train ZeRO-1 on their own group, save, step on, and roll back; rank 0 idles.

    Every collective of the save, the load and the rollback's choice must stay inside the
    optimizer's group: one on the default group would wait for rank 0, which never joins.
    """
    group = dist.new_group([1, 2, 3])
    if rank == 0:
        return None
    group_rank = dist.get_rank(group)
    model = run_model(RUN, seed_offset=group_rank)
    optimizer = ZeroOptimizer(model, 3, group_rank, lr=RUN.lr,
                              comm=Communicator("ring", group=group, timeout_s=20))
    saver = Checkpointer(root, model, optimizer, save_after={2}, keep_last=1)
    for step in range(3):
        _step(model, optimizer, step)
        saver.maybe_save(step + 1, None)
    next_step, _ = saver.rollback()
    restored = state_copy(model, optimizer)
    return {"next_step": next_step,
            "exact": all(torch.equal(restored[key], saver.snapshots[2][key]) for key in restored)}


def test_a_zero_optimizer_on_a_sub_group_saves_loads_and_rolls_back(tmp_path):
    results = launch.spawn(zero_on_a_sub_group, str(tmp_path), world_size=4, timeout_s=60)
    assert results[0] is None
    assert results[1:] == [{"next_step": 2, "exact": True}] * 3
    assert [folder.name for _, folder in list_checkpoints(tmp_path)] == ["step-00000002"]


def swapped_ranks(rank, world_size, root):
    """Ranks 0 and 1 pass each other's rank to save_sharded; the others their own."""
    given = {0: 1, 1: 0}.get(rank, rank)
    try:
        save_sharded(root, {"x": torch.ones(3)}, step=1, rank=given, world_size=world_size)
    except ValueError as error:
        return str(error)
    return None


def test_a_rank_passed_wrongly_is_refused_on_every_rank_before_any_file(tmp_path):
    messages = launch.spawn(swapped_ranks, str(tmp_path), world_size=3, timeout_s=60)
    assert len(set(messages)) == 1 and messages[0] is not None, messages
    assert "rank 0 passed rank=1, rank 1 passed rank=0" in messages[0]
    assert "dist.get_rank(group)" in messages[0]
    assert not any(tmp_path.iterdir())


@pytest.fixture(scope="module")
def two_checkpoints(tmp_path_factory):
    """Checkpoints after steps 2 and 3 of a ZeRO run on 2 ranks."""
    root = tmp_path_factory.mktemp("two")
    launch.spawn(checkpoint_lab.train_with_checkpoints, ZeroRun(steps=3), str(root), [2, 3],
                 world_size=2)
    return root


def test_pruning_never_counts_a_damaged_checkpoint_among_those_kept(two_checkpoints, tmp_path):
    root = tmp_path / "run"
    shutil.copytree(two_checkpoints, root)
    flip_one_byte(step_folder(root, 3) / "shard-00001-of-00002.pt")
    assert prune_checkpoints(root, keep_last=1) == []  # step 2 is the only good one: kept
    assert [step for step, _ in list_checkpoints(root)] == [2, 3]
    assert latest_checkpoint(root)[0] == step_folder(root, 2)
    shutil.copytree(step_folder(root, 2), step_folder(root, 4))  # a good one newer than both
    assert prune_checkpoints(root, keep_last=1) == [step_folder(root, 3), step_folder(root, 2)]
    assert [step for step, _ in list_checkpoints(root)] == [4]


def test_latest_checkpoint_waits_for_a_save_in_progress_and_returns_what_it_published(
        two_checkpoints, tmp_path):
    """A save of step 4 holds the lock with its shard staged and no manifest yet when
    latest_checkpoint is called. The save finishes only once latest_checkpoint has returned (or
    after 1 s), so a look that does not wait for it sees step 4 unfinished and returns step 3."""
    root = tmp_path / "run"
    shutil.copytree(two_checkpoints, root)
    final = step_folder(root, 4)
    staged, returned, outcome = threading.Event(), threading.Event(), []

    def save_step_4():
        try:
            with locked(root, "a save of step 4"):
                staging = stage(final)
                files = [{**write_file(staging, shard_name(0, 1), {"x": torch.ones(8)}),
                          "rank": 0, "layout": {}}]
                staged.set()
                returned.wait(1.0)
                seal(staging, final, files, step=4, world_size=1, extra={})
            outcome.append("published")
        except Exception as error:  # noqa: BLE001 - reported by the assertion below
            outcome.append(repr(error))
            staged.set()

    saver = threading.Thread(target=save_step_4)
    saver.start()
    assert staged.wait(30)
    folder, skipped = latest_checkpoint(root)
    returned.set()
    saver.join(30)
    assert outcome == ["published"]
    assert (folder, skipped) == (final, [])
    assert not staging_folder(final).exists()


def open_once_read(fifo, timeout_s=30.0):
    """Open the named pipe `fifo` for writing as soon as a reader has opened it (at most 30 s)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            descriptor = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as error:  # ENXIO: no reader yet
            if error.errno != errno.ENXIO or time.monotonic() > deadline:
                raise
            time.sleep(0.01)
            continue
        os.set_blocking(descriptor, True)
        return open(descriptor, "wb")


def test_readers_share_the_lock_and_a_save_that_gives_up_says_which_reader_holds_it(
        two_checkpoints, tmp_path):
    """latest_checkpoint reads a shard whose bytes arrive only when the test sends them (a named
    pipe, like a slow disk). Meanwhile a second reader takes the lock at once, and a save that
    waits for the lock gives up naming the reader, not another run."""
    root = tmp_path / "run"
    shutil.copytree(two_checkpoints, root)
    shard = step_folder(root, 3) / shard_name(0, 2)
    payload = shard.read_bytes()
    shard.unlink()
    os.mkfifo(shard)
    found = []
    reader = threading.Thread(target=lambda: found.append(latest_checkpoint(root)))
    reader.start()
    try:
        with open_once_read(shard) as pipe:  # latest_checkpoint is reading the shard: lock held
            with locked(root, "a second reader", shared=True, timeout_s=10):
                pass
            with pytest.raises(CheckpointError) as refused:
                with locked(root, "a save", timeout_s=0.5):
                    pass
            pipe.write(payload)
    finally:
        reader.join(30)
    message = str(refused.value)
    assert (f"by latest_checkpoint (reading, pid {os.getpid()} on {socket.gethostname()}, for "
            in message), message
    assert "a save waits until every reader of this folder is done" in message
    assert "another run" not in message and "writing" not in message
    assert found == [(step_folder(root, 3), [])]


def test_a_reader_that_gives_up_says_which_save_holds_the_lock(tmp_path):
    with locked(tmp_path, "save_sharded of step-00000004"):
        with pytest.raises(CheckpointError) as refused:
            latest = locked(tmp_path, "latest_checkpoint", shared=True, timeout_s=0.2)
            with latest:
                pass
    message = str(refused.value)
    assert message.startswith(f"{tmp_path / '.lock'} is still held after 0 s, by save_sharded "
                              f"of step-00000004 (writing, pid {os.getpid()} on "
                              f"{socket.gethostname()}, for "), message
    assert "another process is writing into this folder" in message
    assert sorted(path.name for path in tmp_path.iterdir()) == [".lock"]


def test_the_record_of_a_holder_that_was_killed_is_removed_by_the_next(tmp_path):
    code = ("import os, signal, sys\n"
            "from lesson_code.checkpoint.files import locked\n"
            "held = locked(sys.argv[1], 'save_sharded of step-00000001')\n"
            "held.__enter__()\n"
            "os.kill(os.getpid(), signal.SIGKILL)\n")
    killed = subprocess.run([sys.executable, "-c", code, str(tmp_path)], timeout=120,
                            env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])})
    assert killed.returncode == -signal.SIGKILL
    assert len([path for path in tmp_path.iterdir() if path.name.startswith(".lock.")]) == 1
    assert latest_checkpoint(tmp_path) == (None, [])  # takes the lock: the killer's died with it
    assert sorted(path.name for path in tmp_path.iterdir()) == [".lock"]


def failing_prune(rank, world_size, root):
    """Rank 0's prune raises (a disk error); every rank must go on to the next save and step."""
    def refuse(root, keep_last):
        raise OSError(5, "Input/output error", str(root))
    capstone_checkpointer.prune_checkpoints = refuse
    model = run_model(RUN, seed_offset=rank)
    optimizer = ZeroOptimizer(model, world_size, rank, lr=RUN.lr)
    saver = Checkpointer(root, model, optimizer, save_after={1, 2}, keep_last=1)
    for step in range(3):
        _step(model, optimizer, step)
        saver.maybe_save(step + 1, None)
    return saver.prune_failures


def test_a_prune_that_fails_on_rank_0_stops_no_rank(tmp_path):
    failures = launch.spawn(failing_prune, str(tmp_path), world_size=2, timeout_s=60)
    assert len(failures[0]) == 2 and "Input/output error" in failures[0][0]
    assert failures[1] == []
    assert [step for step, _ in list_checkpoints(tmp_path)] == [1, 2]

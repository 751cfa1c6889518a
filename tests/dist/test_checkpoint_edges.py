"""Checkpoints at the edges: a ZeRO optimizer on a sub-group, ranks passed wrongly, a prune that
meets a damaged newest checkpoint or fails, a restart's start-up on every kind of root, a look
for the latest during a save, while a save waits, and while the folder it reads is replaced, and
the folder's lock: shared by readers, and named by whoever gives up waiting for it."""

import datetime
import errno
import json
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
from lesson_code.checkpoint import (CheckpointError, load_sharded, save_sharded, shard_name,
                                     step_folder)
from lesson_code.checkpoint.faults import flip_one_byte
from lesson_code.checkpoint.files import read_manifest, write_file, write_manifest
from lesson_code.checkpoint.lock import locked
from lesson_code.checkpoint.staging import seal, stage, staging_folder
from lesson_code.checkpoint.tools import (latest_checkpoint, list_checkpoints, load_newest,
                                          prune_checkpoints, recover_checkpoints, reshard)
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
    compared = []
    saver = Checkpointer(root, model, optimizer, save_after={2}, keep_last=1,
                         verify=lambda folder, snapshot: compared.append(snapshot) is None)
    for step in range(3):
        _step(model, optimizer, step)
        saver.maybe_save(step + 1, None)
    next_step, _ = saver.rollback()
    restored = state_copy(model, optimizer)
    return {"next_step": next_step, "kept": len(vars(saver).get("snapshots", {})),
            "exact": all(torch.equal(restored[key], compared[0][key]) for key in restored)}


def test_a_zero_optimizer_on_a_sub_group_saves_loads_and_rolls_back(tmp_path):
    results = launch.spawn(zero_on_a_sub_group, str(tmp_path), world_size=4, timeout_s=60)
    assert results[0] is None
    assert results[1:] == [{"next_step": 2, "kept": 0, "exact": True}] * 3  # no copy kept per save
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


def renumbered_copy(source, destination, step):
    """A copy of the checkpoint `source` as a checkpoint of `step` in `destination`: its files,
    and a manifest (with its checksum) that records `step`, as a save of that step writes it."""
    shutil.copytree(source, destination)
    write_manifest(destination, {**read_manifest(source), "step": step})


def test_pruning_never_counts_a_damaged_checkpoint_among_those_kept(two_checkpoints, tmp_path):
    root = tmp_path / "run"
    shutil.copytree(two_checkpoints, root)
    flip_one_byte(step_folder(root, 3) / "shard-00001-of-00002.pt")
    assert prune_checkpoints(root, keep_last=1) == []  # step 2 is the only good one: kept
    assert [step for step, _ in list_checkpoints(root)] == [2, 3]
    assert latest_checkpoint(root)[0] == step_folder(root, 2)
    renumbered_copy(step_folder(root, 2), step_folder(root, 4), 4)  # a good one newer than both
    assert prune_checkpoints(root, keep_last=1) == [step_folder(root, 3), step_folder(root, 2)]
    assert [step for step, _ in list_checkpoints(root)] == [4]


def stage_step(root, step, released, staged=None):
    """A save of `step` that holds root's lock, stages one shard, then waits for `released` (at
    most 20 s) before it writes the manifest and publishes. Returns what it ended with."""
    final, outcome = step_folder(root, step), []
    try:
        with locked(root, f"a save of step {step}", timeout_s=1.0):
            staging = stage(final)
            files = [{**write_file(staging, shard_name(0, 1), {"x": torch.ones(8)}),
                      "rank": 0, "layout": {}}]
            if staged is not None:
                staged.set()
            released.wait(20)
            seal(staging, final, files, step=step, world_size=1, extra={})
        outcome.append("published")
    except Exception as error:  # noqa: BLE001 - reported by the caller's assertion
        outcome.append(repr(error))
    finally:
        if staged is not None:
            staged.set()
    return outcome


def test_a_restart_resumes_starts_afresh_or_refuses_alike_on_every_rank(two_checkpoints, tmp_path):
    """tools.resume on 2 ranks, one root after another in one process group: a root with no
    checkpoint, or only a first save interrupted before its manifest, starts at step 0 (it
    holds nothing a fresh start would lose); a complete hidden copy is published and loaded; a
    damaged newest checkpoint fails its load on every rank and the next older one loads; when
    none loads, every rank raises the same error."""
    two, three = step_folder(two_checkpoints, 2), step_folder(two_checkpoints, 3)
    roots = {name: tmp_path / name for name in (
        "nothing", "first save interrupted", "hidden copy", "newest damaged", "all damaged")}
    interrupted = staging_folder(step_folder(roots["first save interrupted"], 2))
    interrupted.mkdir(parents=True)
    shutil.copy(two / shard_name(0, 2), interrupted)  # a shard, and no manifest yet
    for name in ("hidden copy", "newest damaged", "all damaged"):
        shutil.copytree(two_checkpoints, roots[name])
    step_folder(roots["hidden copy"], 3).rename(staging_folder(step_folder(roots["hidden copy"], 3)))
    flip_one_byte(step_folder(roots["newest damaged"], 3) / shard_name(1, 2))
    for step in (2, 3):
        flip_one_byte(step_folder(roots["all damaged"], step) / shard_name(0, 2))
    outcomes = launch.spawn(checkpoint_lab.start_up_outcomes, ZeroRun(steps=3),
                            [str(root) for root in roots.values()], world_size=2, timeout_s=120)
    assert outcomes[0] == outcomes[1]
    found = dict(zip(roots, outcomes[0]))
    fresh = {"loads": None, "next step": 0, "load failed": [], "refused": None}
    assert found["nothing"] == found["first save interrupted"] == fresh
    assert found["hidden copy"] == {**fresh, "loads": three.name, "next step": 3}
    assert step_folder(roots["hidden copy"], 3).is_dir()
    assert found["newest damaged"] == {**fresh, "loads": two.name, "next step": 2,
                                       "load failed": [three.name]}
    refusal = found["all damaged"]["refused"]
    assert "no checkpoint loads" in refusal and two.name in refusal and three.name in refusal


def test_a_restart_refuses_rather_than_falls_back_when_the_checkpoint_is_not_at_fault(
        two_checkpoints, tmp_path):
    """tools.resume passes over a damaged checkpoint only: a checkpoint saved by another number
    of ranks, or a read that fails with an OSError, is raised on every rank as it is (with its
    own advice: reshard, check the disk), not taken for damage, which would load an older step or
    end with "no checkpoint loads"."""
    roots = {name: tmp_path / name for name in ("saved by 1 rank", "read error")}
    for step in (2, 3):
        reshard(step_folder(two_checkpoints, step), roots["saved by 1 rank"], 1)
    shutil.copytree(two_checkpoints, roots["read error"])
    newest = step_folder(roots["read error"], 3)
    (newest / shard_name(1, 2)).unlink()
    (newest / shard_name(1, 2)).mkdir()  # rank 1's read raises IsADirectoryError, an OSError
    manifest = read_manifest(newest)
    for entry in manifest["files"]:
        if entry["name"] == shard_name(1, 2):  # a size that passes the choice's stat
            entry["bytes"] = (newest / shard_name(1, 2)).stat().st_size
    write_manifest(newest, manifest)
    outcomes = launch.spawn(checkpoint_lab.start_up_outcomes, ZeroRun(steps=3),
                            [str(root) for root in roots.values()], world_size=2, timeout_s=120)
    assert outcomes[0] == outcomes[1]
    found = dict(zip(roots, outcomes[0]))
    assert all(outcome["loads"] is None and outcome["load failed"] is None
               for outcome in found.values())
    assert "saved by 1 ranks" in found["saved by 1 rank"]["refused"]
    assert "reshard it first" in found["saved by 1 rank"]["refused"]
    assert "could not read" in found["read error"]["refused"]
    assert "Is a directory" in found["read error"]["refused"]


def test_latest_checkpoint_does_not_wait_for_a_save_in_progress(two_checkpoints, tmp_path):
    """A save of step 4 holds the lock, its shard staged and no manifest yet, until the test
    lets it go: latest_checkpoint returns step 3 at once and says step 4 is a save in progress
    (a look that waited for the lock would return step 4 only after the save)."""
    root = tmp_path / "run"
    shutil.copytree(two_checkpoints, root)
    staged, released, outcome = threading.Event(), threading.Event(), []
    saver = threading.Thread(target=lambda: outcome.extend(stage_step(root, 4, released, staged)))
    saver.start()
    try:
        assert staged.wait(30)
        folder, skipped = latest_checkpoint(root, lock_timeout_s=5)
        saving_still = not outcome
    finally:
        released.set()
        saver.join(30)
    assert saving_still and outcome == ["published"]
    assert folder == step_folder(root, 3)
    assert skipped == [".step-00000004.tmp: a save in progress (a writer holds the folder's "
                       "lock), not published yet"]
    assert skipped[0].explain("fa").endswith("ذخیره‌ای در جریان (نویسنده‌ای قفل پوشه را در دست "
                                             "دارد)، هنوز منتشرنشده")
    assert latest_checkpoint(root) == (step_folder(root, 4), [])


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


def slow_shard(folder):
    """Replace shard 0 of the 2-rank checkpoint in `folder` by a named pipe, so that a reader
    hashing it waits until the test writes the bytes (a slow disk, or a checkpoint of many
    gigabytes); returns the pipe's path and the shard's bytes."""
    shard = folder / shard_name(0, 2)
    payload = shard.read_bytes()
    shard.unlink()
    os.mkfifo(shard)
    return shard, payload


def latest_while_reading(root, shard, meanwhile):
    """latest_checkpoint(root) in a thread; once it has opened the pipe `shard`, call
    `meanwhile(pipe)`, which writes what the reader gets. Returns what latest_checkpoint returned."""
    found = []
    reader = threading.Thread(target=lambda: found.append(latest_checkpoint(root)))
    reader.start()
    try:
        with open_once_read(shard) as pipe:  # latest_checkpoint is hashing the shard now
            meanwhile(pipe)
    finally:
        reader.join(30)
    assert len(found) == 1, "latest_checkpoint did not return"
    return found[0]


def test_a_save_never_waits_for_a_reader_hashing_a_checkpoint(two_checkpoints, tmp_path):
    """latest_checkpoint is hashing step 3 (its shard a named pipe the test fills only later):
    meanwhile a save takes the folder's lock within 0.5 s, and the reader still returns step 3."""
    root = tmp_path / "run"
    shutil.copytree(two_checkpoints, root)
    shard, payload = slow_shard(step_folder(root, 3))

    def save_then_send(pipe):
        with locked(root, "a save", timeout_s=0.5):
            pass
        pipe.write(payload)
    assert latest_while_reading(root, shard, save_then_send) == (step_folder(root, 3), [])


def test_a_checkpoint_replaced_while_it_is_read_is_not_called_damaged(two_checkpoints, tmp_path):
    """While latest_checkpoint reads step 3's shard, a save of step 3 replaces the folder whole;
    the bytes read then no longer match the manifest read before. The second look, holding the
    lock, finds the new step 3 complete: it is returned, nothing skipped."""
    root = tmp_path / "run"
    shutil.copytree(two_checkpoints, root)
    shard, payload = slow_shard(step_folder(root, 3))
    released = threading.Event()
    released.set()

    def replace_then_send(pipe):
        assert stage_step(root, 3, released) == ["published"]  # a save of step 3, whole
        pipe.write(payload[:100])  # what the old folder gave before it went
    assert latest_while_reading(root, shard, replace_then_send) == (step_folder(root, 3), [])
    assert json.loads((step_folder(root, 3) / "manifest.json").read_text())["world_size"] == 1


def test_a_hidden_copy_published_while_it_is_read_is_found_under_its_new_name(
        two_checkpoints, tmp_path):
    """latest_checkpoint reads the complete hidden copy of step 4 (a save stopped between its
    two renames) when a recovery publishes it as step-00000004: the folder it was reading is
    gone, and it finds step 4 under its published name instead of falling back to step 3."""
    root = tmp_path / "run"
    shutil.copytree(two_checkpoints, root)
    hidden = staging_folder(step_folder(root, 4))
    renumbered_copy(step_folder(root, 3), hidden, 4)
    shard, payload = slow_shard(hidden)

    def publish_then_send(pipe):
        os.rename(hidden, step_folder(root, 4))  # published meanwhile, the pipe with it
        published = step_folder(root, 4) / shard_name(0, 2)
        published.unlink()
        published.write_bytes(payload)
        pipe.write(payload[:100])  # the read of the vanished folder ends short
    assert latest_while_reading(root, shard, publish_then_send) == (step_folder(root, 4), [])


def test_a_save_that_gives_up_says_which_reader_holds_the_lock(tmp_path):
    with locked(tmp_path, "latest_checkpoint", shared=True):
        with locked(tmp_path, "a second reader", shared=True, timeout_s=10):
            with pytest.raises(CheckpointError) as refused:
                with locked(tmp_path, "a save", timeout_s=0.5):
                    pass
    message = str(refused.value)
    assert message.startswith(f"{tmp_path / '.lock'} is still held after 0 s, by "), message
    for reader in ("latest_checkpoint", "a second reader"):  # in the order of their records
        assert f"{reader} (reading, pid {os.getpid()} on {socket.gethostname()}, for " in message
    assert "a save waits until every reader of this folder is done" in message
    assert "another run" not in message and "writing" not in message


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
            "from lesson_code.checkpoint.lock import locked\n"
            "held = locked(sys.argv[1], 'save_sharded of step-00000001')\n"
            "held.__enter__()\n"
            "os.kill(os.getpid(), signal.SIGKILL)\n")
    killed = subprocess.run([sys.executable, "-c", code, str(tmp_path)], timeout=120,
                            env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])})
    assert killed.returncode == -signal.SIGKILL
    assert len([path for path in tmp_path.iterdir() if path.name.startswith(".lock.")]) == 1
    assert recover_checkpoints(tmp_path) == []  # takes the lock: the killed one's died with it
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


def save_behind_a_held_lock(rank, world_size, root):
    """Every rank saves into `root`, whose lock another process holds, over a gloo group whose
    collectives give up after 6 s; returns the error each rank raised."""
    group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=6))
    try:
        save_sharded(root, {"x": torch.ones(4)}, step=1, rank=rank, world_size=world_size,
                     group=group)
    except CheckpointError as error:
        return {"fault": error.fault, "timeout_s": error.facts.get("timeout_s"),
                "message": str(error)}
    return None


def test_a_save_waits_for_the_lock_at_most_half_its_groups_timeout_and_every_rank_raises(tmp_path):
    """Rank 0 waits for the lock while the other ranks wait for it in an all-gather: with the
    default lock wait (600 s) they would time out there first, with gloo's own error. Bounded by
    half the group's 6 s, rank 0 gives up in time and every rank raises its error."""
    with locked(tmp_path, "another run's save"):
        errors = launch.spawn(save_behind_a_held_lock, str(tmp_path), world_size=3, timeout_s=60)
    assert [error["fault"] for error in errors] == ["locked"] * 3
    assert [error["timeout_s"] for error in errors] == [3.0] * 3
    assert "another run's save (writing" in errors[2]["message"]
    assert list_checkpoints(tmp_path) == []


def evaluation_load(rank, world_size, root):
    """An evaluation job's load_newest over a gloo group whose collectives give up after 6 s:
    the folder it loaded, or the fault every rank raised, and how long the call took."""
    group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=6))
    began = time.monotonic()
    try:
        folder, _ = load_newest(root, lambda folder: load_sharded(
            folder, rank=rank, world_size=world_size, group=group), group=group)
        outcome = {"loads": folder and folder.name}
    except Exception as error:  # noqa: BLE001 - what each rank raised is the result
        outcome = {"raised": type(error).__name__, "fault": getattr(error, "fault", None)}
    return {**outcome, "seconds": time.monotonic() - began}


def test_an_evaluation_load_raises_rank_0s_error_on_every_rank_in_bounded_time(
        two_checkpoints, tmp_path):
    """Rank 0 alone chooses; when its choice fails (here it must publish a complete hidden copy
    and another process holds the lock), every rank raises that error, once rank 0 has waited
    half the group's 6 s, instead of the others waiting in the broadcast for a choice that never
    comes and dying of the group's timeout with another error."""
    root = tmp_path / "evaluated"
    shutil.copytree(two_checkpoints, root)
    step_folder(root, 3).rename(staging_folder(step_folder(root, 3)))  # committed, not published
    with locked(root, "the training's save"):
        outcomes = launch.spawn(evaluation_load, str(root), world_size=3, timeout_s=60)
    assert [(o.get("raised"), o.get("fault")) for o in outcomes] == [("CheckpointError", "locked")] * 3
    assert all(o["seconds"] < 5.5 for o in outcomes)


def test_an_evaluation_load_passes_over_a_damaged_checkpoint_after_one_failure(
        two_checkpoints, tmp_path):
    """The newest checkpoint holds a changed byte, which choosing by sizes cannot see: its load
    fails on every rank, its manifest is the one chosen, so it is damaged, not replaced, and the
    next choice is the older checkpoint instead of the same folder again."""
    root = tmp_path / "evaluated"
    shutil.copytree(two_checkpoints, root)
    flip_one_byte(step_folder(root, 3) / shard_name(1, 2))
    outcomes = launch.spawn(evaluation_load, str(root), world_size=2, timeout_s=60)
    assert [o.get("loads") for o in outcomes] == ["step-00000002"] * 2

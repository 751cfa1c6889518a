"""Lesson 80 under real faults: odd `extra`, damaged newest checkpoint, a crash mid-publish, two runs
in one folder, one damaged shard on 4 ranks, durability of each rank's renames, unshared folders,
a full disk."""

import errno
import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from lesson_code import checkpoint, launch
from lesson_code.checkpoint import faults as checkpoint_faults
from lesson_code.checkpoint import tools as checkpoint_tools
from lesson_code.checkpoint import load_sharded, shard_name, step_folder
from lesson_code.checkpoint.faults import flip_one_byte

SHARED_FOLDER = "every rank must see the same folder: use a shared filesystem"


@pytest.fixture(scope="module")
def two_steps(tmp_path_factory):
    """A folder with small checkpoints of steps 10 and 15 saved by 4 ranks."""
    root = tmp_path_factory.mktemp("small")
    for step in (10, 15):
        launch.spawn(checkpoint_faults.save_small, str(root), step, float(step), world_size=4)
    return root


def the_one_error(rank_function, per_rank):
    """Run `rank_function(per_rank)` on len(per_rank) ranks; the one error all of them reported.

    Every rank must report an error, the same one. The group's timeout is 60 s: a rank left
    waiting in a collective would end with another error (or the launcher's RankTimeoutError).
    """
    reports = launch.spawn(rank_function, per_rank, world_size=len(per_rank), timeout_s=60)
    errors = {report["error"] for report in reports}
    assert len(errors) == 1 and None not in errors, reports
    return errors.pop()


EXTRAS = {  # what a reader may pass, and what JSON gives back: str keys, lists for tuples
    "int keys": ({"order": {1: "a", 10: "b", 2: "c"}}, {"order": {"1": "a", "10": "b", "2": "c"}}),
    "mixed keys and a tuple": ({"mixed": {3: "x", "y": 4}, "pair": (1, 2)},
                               {"mixed": {"3": "x", "y": 4}, "pair": [1, 2]}),
}


@pytest.mark.parametrize("case", list(EXTRAS))
def test_extra_with_int_keys_loads_and_the_checksum_is_over_the_bytes_on_disk(tmp_path, case):
    extra, expected = EXTRAS[case]
    folder = Path(launch.spawn(checkpoint_faults.save_small, str(tmp_path), 1, 1.0, extra,
                               world_size=2)[0])
    _, _, manifest = load_sharded(folder, rank=1, world_size=2)
    assert manifest["extra"] == {"value": 1.0, **expected}
    recorded = (folder / "manifest.sha256").read_text().split()
    assert recorded == [hashlib.sha256((folder / "manifest.json").read_bytes()).hexdigest(),
                        "manifest.json"]
    (folder / "manifest.json").write_bytes((folder / "manifest.json").read_bytes()[:-2])
    with pytest.raises(checkpoint.ManifestDamagedError, match="manifest.json is damaged"):
        load_sharded(folder, rank=0, world_size=2)


def test_latest_skips_a_newest_checkpoint_with_a_corrupted_shard_and_says_why(two_steps, tmp_path):
    root = tmp_path / "copy"
    shutil.copytree(two_steps, root)
    flip_one_byte(step_folder(root, 15) / shard_name(2, 4))
    folder, skipped = checkpoint_tools.latest_checkpoint(root)
    assert folder == step_folder(root, 10)
    assert len(skipped) == 1 and skipped[0].startswith("step-00000015: ")
    assert "shard-00002-of-00004.pt has sha256" in skipped[0]


def test_a_save_killed_between_its_manifest_and_the_checksum_is_called_interrupted(two_steps, tmp_path):
    root = tmp_path / "copy"
    shutil.copytree(two_steps, root)
    hidden = root / ".step-00000020.tmp"  # everything written but manifest.sha256
    shutil.copytree(step_folder(root, 15), hidden)
    (hidden / "manifest.sha256").unlink()
    folder, skipped = checkpoint_tools.latest_checkpoint(root)
    assert folder == step_folder(root, 15)
    assert skipped == [".step-00000020.tmp: an interrupted save, never published"]
    assert skipped[0].interrupted and "نیمه‌کاره" in skipped[0].explain("fa")


def test_a_crash_between_the_two_renames_is_recovered_not_lost(tmp_path):
    with pytest.raises(launch.RankCrashedError):
        launch.spawn(checkpoint_faults.crash_between_renames, str(tmp_path), world_size=2)
    names = sorted(path.name for path in tmp_path.iterdir() if path.is_dir())
    assert names == [".step-00000004.replaced", ".step-00000004.tmp", "step-00000002"]
    folder, _ = checkpoint_tools.latest_checkpoint(tmp_path)
    # .tmp is complete: the newest save, verified, then published under its name
    assert folder == step_folder(tmp_path, 4) and not (tmp_path / ".step-00000004.tmp").exists()
    assert checkpoint_tools.recover_checkpoints(tmp_path) == []  # nothing left to publish
    shard, _, manifest = load_sharded(step_folder(tmp_path, 4), rank=1, world_size=2)
    assert manifest["extra"]["value"] == 4.5 and torch.all(shard["value"] == 4.5)
    assert checkpoint_tools.prune_checkpoints(tmp_path, keep_last=2) == [
        tmp_path / ".step-00000004.replaced"]
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["step-00000002",
                                                                        "step-00000004"]


def test_the_next_save_of_that_step_keeps_the_copy_until_it_replaces_it(tmp_path):
    with pytest.raises(launch.RankCrashedError):
        launch.spawn(checkpoint_faults.crash_between_renames, str(tmp_path), world_size=2)
    with pytest.raises(launch.RankCrashedError):  # the next save of step 4 dies half-way too
        launch.spawn(checkpoint_faults.crash_while_writing, str(tmp_path), 4, 5.0, 1,
                     world_size=2)
    folder, _ = checkpoint_tools.latest_checkpoint(tmp_path)
    assert folder == step_folder(tmp_path, 4)  # recovered by that save before it began
    assert load_sharded(folder, rank=0, world_size=2)[2]["extra"]["value"] == 4.5
    launch.spawn(checkpoint_faults.save_small, str(tmp_path), 4, 5.0, world_size=2)
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == [
        "step-00000002", "step-00000004"]
    assert load_sharded(folder, rank=0, world_size=2)[2]["extra"]["value"] == 5.0


def test_two_runs_saving_the_same_step_into_one_folder_leave_one_whole_checkpoint(tmp_path):
    """Two real launches (2 ranks each) save step 1 into one folder, 20 times each, at once."""
    code = textwrap.dedent("""
        import json, sys
        from lesson_code import launch
        from lesson_code.checkpoint import faults as checkpoint_faults
        if __name__ == "__main__":
            spans = launch.spawn(checkpoint_faults.save_repeatedly, sys.argv[1], float(sys.argv[2]),
                                 20, 1 << 18, sys.argv[3], world_size=2, timeout_s=200)[0]
            print(json.dumps(spans))
    """)
    ready = tmp_path / "ready"
    ready.mkdir()
    root = tmp_path / "checkpoints"
    runs = [subprocess.Popen([sys.executable, "-c", code, str(root), value, str(ready)],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])})
            for value in ("1", "2")]
    outputs = [run.communicate(timeout=300)[0] for run in runs]
    assert [run.returncode for run in runs] == [0, 0], outputs
    spans = [json.loads(output.strip().splitlines()[-1]) for output in outputs]
    # The runs did save at once: each one's first save began before the other's last one ended.
    assert spans[0][0][0] < spans[1][-1][1] and spans[1][0][0] < spans[0][-1][1], spans
    folder = step_folder(root, 1)
    loaded = [load_sharded(folder, rank=rank, world_size=2) for rank in range(2)]
    value = loaded[0][2]["extra"]["value"]
    assert value in (1.0, 2.0)
    assert all(torch.all(shard["value"] == value) for shard, _, _ in loaded), "a mix of two runs"
    assert [p.name for p in root.iterdir() if p.is_dir()] == ["step-00000001"]


def test_a_corrupted_shard_makes_all_4_ranks_raise_the_same_error_at_once(two_steps, tmp_path):
    folder = tmp_path / "step-00000010"
    shutil.copytree(step_folder(two_steps, 10), folder)
    flip_one_byte(folder / shard_name(2, 4))
    error = the_one_error(checkpoint_faults.load_and_report, [str(folder)] * 4)
    assert error.startswith("ShardCorruptedError: ") and str(folder / shard_name(2, 4)) in error
    assert "[found by rank 2]" in error
    # Every rank returned this error: none waited in a collective for the group's timeout (60 s),
    # which would have ended it with another error (or the launcher's RankTimeoutError).


def test_each_rank_makes_its_own_renames_durable(tmp_path):
    traces = launch.spawn(checkpoint_faults.save_and_trace, str(tmp_path), world_size=3)
    folder = step_folder(tmp_path, 1)
    status = folder.stat()  # the staging folder, renamed: the same inode
    for rank, events in enumerate(traces):
        renamed = [i for i, event in enumerate(events)
                   if event[0] == "replace" and event[2].endswith(shard_name(rank, 3))]
        assert len(renamed) == 1, events
        shard = (folder / shard_name(rank, 3)).stat()
        assert ("fsync", shard.st_dev, shard.st_ino) in events[:renamed[0]], "file before rename"
        assert ("fsync", status.st_dev, status.st_ino) in events[renamed[0]:], \
            f"rank {rank} never fsynced the folder after renaming its shard"


def test_ranks_that_do_not_share_the_folder_get_one_clear_error_on_save(tmp_path):
    node0, node1 = (checkpoint_faults.rank_folder(tmp_path, node) for node in (0, 1))
    error = the_one_error(checkpoint_faults.save_and_report, [node0, node0, node1, node1])
    assert error.startswith("FolderNotSharedError: ") and SHARED_FOLDER in error
    assert node0 in error and "[found by ranks 2, 3]" in error
    assert sorted(p.name for p in Path(node0).iterdir()) == [".lock"]  # nothing half-saved


def save_on_a_full_disk(rank, world_size, root):
    """Save step 1; rank 0's disk is full. Report what this rank raised."""
    disk = checkpoint_faults.FullDisk() if rank == 0 else checkpoint.DISK
    try:
        checkpoint_faults.save_small(rank, world_size, root, 1, 1.0, disk=disk)
    except checkpoint.CheckpointError as error:
        return f"{type(error).__name__}: {error}"
    return None


def test_a_save_that_fails_as_it_begins_leaves_no_staging_folder(tmp_path):
    """Rank 0's first write, the staging folder's owner token, fails with ENOSPC."""
    errors = launch.spawn(save_on_a_full_disk, str(tmp_path), world_size=2, timeout_s=60)
    assert errors[0] == errors[1] and "No space left on device" in errors[0], errors
    assert sorted(path.name for path in tmp_path.iterdir()) == [".lock"]


def test_ranks_that_do_not_share_the_folder_get_one_clear_error_on_load(two_steps, tmp_path):
    seen, unseen = str(step_folder(two_steps, 10)), str(tmp_path / "node1" / "step-00000010")
    error = the_one_error(checkpoint_faults.load_and_report, [seen, seen, unseen, unseen])
    assert error.startswith("FolderNotSharedError: ") and SHARED_FOLDER in error
    assert seen in error and "ranks 2, 3 see no manifest.json" in error


def test_a_manifest_a_rank_cannot_read_is_reported_as_such_not_as_missing(two_steps, tmp_path):
    """Ranks 2 and 3 get an OSError other than 'no such file' reading manifest.json (here the name
    is a folder; a permission denied or an I/O error is reported the same way)."""
    seen, unreadable = str(step_folder(two_steps, 10)), tmp_path / "step-00000010"
    shutil.copytree(seen, unreadable)
    (unreadable / "manifest.json").unlink()
    (unreadable / "manifest.json").mkdir()
    error = the_one_error(checkpoint_faults.load_and_report, [seen, seen] + [str(unreadable)] * 2)
    assert error.startswith(f"CheckpointError: could not read {unreadable / 'manifest.json'}: "
                            f"[Errno {errno.EISDIR}] {os.strerror(errno.EISDIR)}"), error
    assert "[found by ranks 2, 3]" in error and "no manifest.json" not in error

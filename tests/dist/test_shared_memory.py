"""The shared-memory all-reduce on real gloo ranks, world sizes 1 to 8.

Compared with torch.distributed's all-reduce on the same inputs: integers exactly, floats within
the summation bound; every rank must end with bitwise the same tensor. Also: where shared memory
cannot be used (no room, too large) every rank falls back to the direct all-reduce together and
still gets the right sum; the segment's file is gone from /dev/shm once the ranks have mapped it,
also when a rank is killed; the ledger records the call with no bytes sent.
"""

import os
import signal

import pytest
import torch
import torch.distributed as dist

from collective_cases import all_reduce_cases
from lesson_code import launch
from lesson_code.collectives import shared_memory
from lesson_code.collectives.ledger import CommLedger
from lesson_code.runtime.errors import RankCrashedError

pytestmark = pytest.mark.skipif(not shared_memory.SHM_DIR.is_dir(),
                                reason="shared memory segments live in /dev/shm (Linux)")


def compare_every_case(rank, world_size, limit_bytes=None):
    """Rows {length, dtype, op, within, exact, identical} for every case, then {arena}."""
    if limit_bytes is not None:
        shared_memory.LIMIT_BYTES = limit_bytes
    rows = []
    for length, dtype, tensor, builtin, bound in all_reduce_cases(rank, world_size):
        for op in ("sum", "avg") if tensor.is_floating_point() else ("sum",):
            ours = shared_memory.shared_memory_all_reduce(tensor.clone(), op)
            reference = builtin / world_size if op == "avg" else builtin
            gathered = [torch.empty_like(ours) for _ in range(world_size)]
            dist.all_gather(gathered, ours)
            difference = (ours.double() - reference.double()).abs()
            rows.append({"length": length, "dtype": dtype, "op": op,
                         "within": bool((difference <= bound).all()),
                         "exact": bool(torch.equal(ours, reference)),
                         "identical": all(torch.equal(g, ours) for g in gathered)})
    rows.append({"arena": shared_memory.has_arena()})
    return rows


def _check(rows):
    cases = [row for row in rows if "arena" not in row]
    assert all(row["within"] and row["identical"] for row in cases), \
        [row for row in cases if not (row["within"] and row["identical"])][:5]
    assert all(row["exact"] for row in cases if row["dtype"] == "int64")


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 5, 6, 7, 8])
def test_the_shared_memory_all_reduce_equals_the_builtin(world_size):
    per_rank = launch.spawn(compare_every_case, world_size=world_size)
    for rows in per_rank:
        _check(rows)
        assert rows[-1]["arena"] == (world_size > 1)  # it went through shared memory


def test_without_room_every_rank_falls_back_to_the_direct_algorithm_and_agrees():
    per_rank = launch.spawn(compare_every_case, 1024, world_size=3)  # no segment fits 1 KiB
    for rows in per_rank:
        _check(rows)
        assert rows[-1]["arena"] is False


def reduce_under_limit(rank, world_size, limit_bytes):
    shared_memory.LIMIT_BYTES = limit_bytes
    tensor = torch.full((1000,), float(rank))
    shared_memory.shared_memory_all_reduce(tensor)
    return {"value": tensor[0].item(), "arena": shared_memory.has_arena()}


def test_a_segment_is_one_slot_per_rank_and_one_for_the_result():
    """Two ranks, 1 MiB slots: 3 MiB is enough (the segment once held twice that, in halves)."""
    per_rank = launch.spawn(reduce_under_limit, 3 << 20, world_size=2)
    assert all(result == {"value": 1.0, "arena": True} for result in per_rank)


def segment_files():
    return {name for name in os.listdir(shared_memory.SHM_DIR) if name.startswith("lesson_code-")}


def reduce_then_report(rank, world_size, numel):
    ledger = CommLedger()
    tensor = torch.full((numel,), float(rank))
    shared_memory.shared_memory_all_reduce(tensor, ledger=ledger)
    return {"value": tensor[0].item(), "ledger": ledger.totals(),
            "files": sorted(segment_files())}


def test_no_file_stays_in_dev_shm_and_the_ledger_counts_no_bytes():
    before = segment_files()
    per_rank = launch.spawn(reduce_then_report, 10_000, world_size=4)
    assert all(result["value"] == 6.0 for result in per_rank)
    assert all(set(result["files"]) <= before for result in per_rank)  # deleted once mapped
    assert per_rank[0]["ledger"]["all_reduce"]["bytes_sent"] == 0
    assert segment_files() <= before


def die_after_mapping(rank, world_size):
    shared_memory.shared_memory_all_reduce(torch.ones(1000))
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    dist.barrier()


def test_a_rank_killed_after_the_first_call_leaves_no_segment_behind():
    before = segment_files()
    with pytest.raises(RankCrashedError):
        launch.spawn(die_after_mapping, world_size=3, timeout_s=60)
    assert segment_files() <= before


def test_a_rank_on_another_machine_finds_no_segment_to_map(tmp_path):
    # What a rank on another machine sees: no file at the path rank 0 broadcast.
    assert shared_memory.attach_segment(str(tmp_path / "lesson_code-elsewhere"), 4096) is None
    wrong_size = tmp_path / "lesson_code-short"
    wrong_size.write_bytes(b"\0" * 100)
    assert shared_memory.attach_segment(str(wrong_size), 4096) is None


def killed_while_mapping(rank, world_size):
    """Rank 1 dies inside attach_segment, after rank 0 created the segment, before it is deleted."""
    if rank == 1:
        def die(path, nbytes):
            os.kill(os.getpid(), signal.SIGKILL)
        shared_memory.attach_segment = die
    shared_memory.shared_memory_all_reduce(torch.ones(100_000), timeout_s=20)


def test_a_rank_killed_while_mapping_leaves_no_segment_behind():
    before = segment_files()
    with pytest.raises(RankCrashedError):
        launch.spawn(killed_while_mapping, world_size=3, timeout_s=60)
    # Rank 0 was stopped by the launcher, maybe before its `finally`: the next segment created
    # on this machine sweeps what a dead creator left.
    per_rank = launch.spawn(reduce_then_report, 10_000, world_size=2)
    assert per_rank[0]["value"] == 1.0
    assert segment_files() <= before


def refused_by_shared_memory(rank, world_size):
    """Every rank's machine refuses new files in SHM_DIR (PermissionError, as a folder this user
    may not write gives): injected into os.open, the one call that creates the segment's file."""
    real_open = os.open

    def refusing_open(path, flags, *args):
        if str(path).startswith(str(shared_memory.SHM_DIR)) and flags & os.O_CREAT:
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, flags, *args)
    os.open = refusing_open
    tensor = torch.full((50_000,), float(rank))
    shared_memory.shared_memory_all_reduce(tensor, timeout_s=20)
    return {"value": tensor[0].item(), "arena": shared_memory.has_arena()}


def test_a_folder_no_file_can_be_made_in_makes_every_rank_go_direct_together():
    per_rank = launch.spawn(refused_by_shared_memory, world_size=3, timeout_s=60)
    assert [(r["value"], r["arena"]) for r in per_rank] == [(3.0, False)] * 3


def name_never_arrives(rank, world_size):
    """The broadcast of the segment's name fails on every rank, as it does when a peer is gone
    (injected into dist.broadcast_object_list, the call that sends it): rank 0 has created the
    segment's file by then. Each rank reports the error and its own segment files, while alive."""
    def peer_gone(*args, **kwargs):
        raise RuntimeError("Connection closed by peer")
    dist.broadcast_object_list = peer_gone
    try:
        shared_memory.shared_memory_all_reduce(torch.ones(100_000), timeout_s=20)
    except RuntimeError as error:
        return {"error": str(error), "files": sorted(
            name for name in segment_files() if name.startswith(f"lesson_code-{os.getpid()}-"))}
    return {"error": None}


def test_a_broadcast_of_the_name_that_fails_leaves_no_segment_behind():
    before = segment_files()
    per_rank = launch.spawn(name_never_arrives, world_size=3, timeout_s=60)
    assert [r["error"] for r in per_rank] == ["Connection closed by peer"] * 3
    assert per_rank[0]["files"] == []  # deleted by rank 0 itself, not when it exits
    assert segment_files() <= before

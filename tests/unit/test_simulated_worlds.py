"""The simulated worlds of `runtime.simulated`: ranks inside this process.

`fake_rank` makes this process one rank of a large world whose messages move nothing;
`run_threads` runs every rank on a thread, moving real data. Both must behave as `launch.spawn`
does where it matters: results by rank, the rank that failed named with its traceback, every
wait bounded, and nothing of the world left behind in the caller's process.
"""

import sys
import time

import pytest
import torch
import torch.distributed as dist

from lesson_code.collectives import ring
from lesson_code.collectives.ledger import CommLedger
from lesson_code.runtime.errors import RankFailedError, RankTimeoutError
from lesson_code.runtime.simulated import fake_rank, run_threads


def ring_sum(rank, world_size, length):
    """Lesson 76's ring all-reduce (point-to-point messages only) and a built-in collective."""
    ledger = CommLedger()
    tensor = torch.arange(float(length)) * (rank + 1)
    ring.ring_all_reduce(tensor, ledger=ledger)
    flag = torch.tensor([float(rank)])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    names: list = [None] * world_size
    dist.all_gather_object(names, f"rank {rank}")
    return tensor, ledger.bytes_sent, flag.item(), names, dist.get_rank()


@pytest.mark.parametrize("world_size", [1, 3, 4])
def test_threads_move_real_data_between_the_ranks(world_size):
    results = run_threads(ring_sum, 10, world_size=world_size)
    total = sum(range(1, world_size + 1))
    for rank, (tensor, sent, flag, names, seen_rank) in enumerate(results):
        assert torch.equal(tensor, torch.arange(10.0) * total)
        assert seen_rank == rank and flag == world_size - 1
        assert names == [f"rank {r}" for r in range(world_size)]
    # Every chunk travels N - 1 hops in each half of the ring: 2 (N - 1) x 10 floats in all.
    assert sum(sent for _, sent, *_ in results) == 2 * (world_size - 1) * 10 * 4


def composed_collectives(rank, world_size):
    """Collectives that torch's threaded group builds on another one."""
    dist.barrier()
    gathered = torch.empty(world_size)
    dist.all_gather_single(gathered, torch.tensor([float(rank)]))
    reduced = torch.empty(1)
    dist.reduce_scatter_single(reduced, torch.ones(world_size))
    return gathered.tolist(), reduced.item()


def test_collectives_built_on_other_collectives_complete():
    # A barrier is torch's threaded all-reduce of a one: a rank must not wait for its own turn.
    results = run_threads(composed_collectives, world_size=3, timeout_s=20)
    assert results == [([0.0, 1.0, 2.0], 3.0)] * 3


def draw(rank, world_size):
    torch.manual_seed(7)
    first = torch.randn(1000)
    ring.ring_all_reduce(torch.zeros(4))  # the other ranks run here
    return first, torch.randn(1000)


def test_each_rank_draws_the_seeds_numbers_as_a_process_of_its_own():
    """torch's random generator is the process's, shared by the threads: each rank keeps its
    own state from turn to turn, so it draws what a process seeded alike draws, and the
    caller's generator is left as it was."""
    torch.manual_seed(7)
    expected = torch.randn(1000), torch.randn(1000)
    torch.manual_seed(123)
    caller = torch.get_rng_state()
    for first, second in run_threads(draw, world_size=4):
        assert torch.equal(first, expected[0]) and torch.equal(second, expected[1])
    assert torch.equal(torch.get_rng_state(), caller)


def fail_on_rank_two(rank, world_size):
    if rank == 2:
        raise ValueError("rank two's own error")
    ring.ring_all_reduce(torch.zeros(8), timeout_s=60)  # waits for rank 2, which never comes
    return rank


def test_a_failing_rank_is_named_with_its_traceback_and_the_others_are_woken():
    start = time.monotonic()
    with pytest.raises(RankFailedError, match="rank 2 of 4 raised") as raised:
        run_threads(fail_on_rank_two, world_size=4, timeout_s=60)
    assert "rank two's own error" in raised.value.rank_traceback
    assert time.monotonic() - start < 30  # woken, not left to their 60 s waits


def one_rank_late(rank, world_size):
    if rank == 1:
        time.sleep(3)  # not communicating: holds the turn, the others cannot run
        return rank
    ring.ring_all_reduce(torch.zeros(8), timeout_s=60)
    return rank


def test_ranks_still_running_at_the_deadline_are_named():
    start = time.monotonic()
    with pytest.raises(RankTimeoutError) as raised:
        run_threads(one_rank_late, world_size=3, timeout_s=1)
    assert raised.value.ranks and 1 in raised.value.ranks
    assert time.monotonic() - start < 15
    # the world it left does not reach the next one
    assert run_threads(lambda rank, world_size: rank, world_size=3) == [0, 1, 2]


def test_a_fake_rank_is_that_rank_and_leaves_nothing_behind():
    threads, hook = torch.get_num_threads(), sys.excepthook
    with fake_rank(512, rank=300):
        assert (dist.get_rank(), dist.get_world_size()) == (300, 512)
        assert torch.get_num_threads() == 1
        received = torch.full((4,), 7.0)
        dist.irecv(received, src=299).wait()  # returns at once: nothing moves
        assert torch.equal(received, torch.full((4,), 7.0))
    assert not dist.is_initialized()
    assert torch.get_num_threads() == threads and sys.excepthook is hook


def test_worlds_refuse_to_start_inside_a_process_group_and_bad_arguments():
    with fake_rank(4, 0):
        with pytest.raises(RuntimeError, match="already belongs to a process group"):
            run_threads(ring_sum, 4, world_size=2)
        with pytest.raises(RuntimeError, match="already belongs to a process group"):
            with fake_rank(4, 1):
                pass
    with pytest.raises(ValueError, match="rank=4 is not in 0..3"):
        with fake_rank(4, 4):
            pass
    with pytest.raises(ValueError, match="world_size must be a positive int"):
        run_threads(ring_sum, 4, world_size=0)

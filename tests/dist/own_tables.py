"""Rank functions for tests/dist/test_auto_agreement.py: ranks whose machines hold other times.

Each rank can be given its own folder of measured times (LESSON_CODE_RESULTS, read by
`choose.stored_costs`), as two nodes with separate checkouts, or one node that ran `make bench`,
would have. The ranks must still choose alike: `choose.group_decisions` agrees on rank 0's.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from lesson_code.collectives import choose
from lesson_code.harness.timing import machine_line

# A size where the tables disagree: the package's times choose "naive", a ring-fast table "ring".
NUMEL = 16 * 1024  # float32: 64 KiB


def write_ring_fastest(folder: Path) -> Path:
    """A table of this machine's in `folder` in which the ring is 100 times faster than measured,
    for all three collectives: the fastest at every size."""
    folder.mkdir(parents=True, exist_ok=True)
    for collective, packaged in choose.STORED_FILES.items():
        rows = [dict(row, seconds=row["seconds"] / 100 if row["algorithm"] == "ring" else row["seconds"])
                for row in choose.stored_times(packaged)]
        choose.store_times(rows, f"{collective} times with the ring made fastest, for a test\n"
                                 f"machine: {machine_line()}", folder / packaged.name)
    return folder


def collectives_with_own_tables(rank: int, world_size: int, folders: dict[int, str],
                                numel: int = NUMEL) -> dict:
    """Run all_reduce, reduce_scatter and all_gather with "auto", this rank reading its times from
    `folders[rank]` when it has one. Collective: call on every rank. Returns, per collective,
    whether the result is right, what the group chose and what this rank's own table chose."""
    if rank in folders:
        os.environ[choose.RESULTS_VARIABLE] = folders[rank]
    n, nbytes = world_size, numel * 4
    expected_sum = n * (n + 1) / 2
    reduced = choose.all_reduce(torch.full((numel,), float(rank + 1)), "sum", timeout_s=60)
    shard = choose.reduce_scatter(torch.full((numel,), float(rank + 1)), "sum", timeout_s=60)
    sizes = [len(part) for part in torch.tensor_split(torch.empty(numel), n)]
    gathered = choose.all_gather(torch.full((sizes[rank],), float(rank)), sizes, timeout_s=60)
    owners = torch.cat([torch.full((size,), float(r)) for r, size in enumerate(sizes)])
    right = {"all_reduce": bool(torch.all(reduced == expected_sum)),
             "reduce_scatter": bool(torch.all(shard == expected_sum)) and len(shard) == sizes[rank],
             "all_gather": torch.equal(gathered, owners)}
    return {collective: {"right": right[collective],
                         "chosen": choose.group_decisions(collective).choose(nbytes),
                         "own": choose.stored_costs(collective=collective)
                                      .decisions(world_size).choose(nbytes)}
            for collective in choose.ALGORITHMS}


def two_algorithms(rank: int, world_size: int) -> None:
    """Rank 1 runs the ring all-reduce, the others the naive one: they never meet."""
    choose.all_reduce(torch.ones(NUMEL), "sum", algorithm="ring" if rank == 1 else "naive",
                      timeout_s=600)


def receive_before_sending(rank: int, world_size: int) -> None:
    """Every rank waits to receive from its left before sending right: a deadlock."""
    import torch.distributed as dist

    message = torch.ones(4)
    dist.recv(message, src=(rank - 1) % world_size)
    dist.send(message, dst=(rank + 1) % world_size)


def calibrated_choice(rank: int, world_size: int) -> dict:
    """`choose.calibrate` on these ranks at two small sizes, then "auto" by its costs: the
    constants and decisions this rank fitted, and whether its sum is right."""
    costs = choose.calibrate(world_size, sizes=(2 ** 10, 2 ** 14))
    tensor = torch.full((NUMEL,), float(rank + 1))
    choose.all_reduce(tensor, "sum", costs=costs)
    decided = costs.decisions(world_size)
    return {"fits": {name: (fit.alpha, fit.beta) for name, fit in costs.fits.items()},
            "decisions": (decided.starts, decided.algorithms), "source": costs.source,
            "right": bool((tensor == world_size * (world_size + 1) / 2).all())}


def costs_differing_near_a_switch(rank: int, world_size: int) -> dict:
    """All-reduce with `costs=` at the package's first switch on these ranks, rank 1's costs
    having the faster side's times 1 % slower (a rank fitted on another machine, or rounding
    otherwise): whether the sum is right, what the group chose and what this rank's costs say."""
    packaged = choose.stored_costs(choose.STORED)
    switch = packaged.decisions(world_size)
    nbytes, faster = switch.starts[1], switch.algorithms[1]
    rows = [dict(row, seconds=row["seconds"] * (1.01 if rank == 1 and row["algorithm"] == faster
                                                else 1.0))
            for row in choose.stored_times(choose.STORED)]
    costs = choose.AlgorithmCosts.from_times(rows, source=f"rank {rank}'s fit")
    tensor = torch.full((nbytes // 4,), float(rank + 1))
    choose.all_reduce(tensor, "sum", costs=costs, timeout_s=10)
    return {"right": bool((tensor == world_size * (world_size + 1) / 2).all()),
            "chosen": choose.costs_decisions(costs).choose(nbytes),
            "own": costs.choose(nbytes, world_size)}

"""Recursive doubling and halving-doubling all-reduce on real gloo ranks, world sizes 1 to 8.

Each is compared with torch.distributed's all_reduce on the same inputs: integers exactly, floats
within the summation bound (two orders of N terms differ by at most (N - 1) eps sum|x|). Every
rank must end with bitwise the same tensor, and the ledger must count the bytes the algorithm's
formula gives.
"""

import pytest
import torch
import torch.distributed as dist

from lesson_code import collectives_lab, launch
from lesson_code.collectives import doubling
from lesson_code.collectives.ledger import CommLedger

ALGORITHMS = {"recursive_doubling": doubling.recursive_doubling_all_reduce,
              "halving_doubling": doubling.halving_doubling_all_reduce}


def lengths_for(world_size):
    """0, 1, fewer elements than ranks, not divisible by the world size, and a larger one."""
    return sorted({0, 1, max(world_size - 1, 0), 2 * world_size + 1, 1000})


def compare_every_case(rank, world_size):
    """For each algorithm, length and dtype: worst |ours - built-in| / bound, and agreement."""
    rows = []
    for name, all_reduce in ALGORITHMS.items():
        for length in lengths_for(world_size):
            for dtype in collectives_lab.DTYPES:
                tensor = collectives_lab.make_input(rank, length, dtype, seed=length)
                bound = collectives_lab.summation_bound(tensor, world_size)
                ours, builtin = all_reduce(tensor.clone(), "sum"), tensor.clone()
                dist.all_reduce(builtin)
                difference = (ours.double() - builtin.double()).abs()
                gathered = [torch.empty_like(ours) for _ in range(world_size)]
                dist.all_gather(gathered, ours)
                row = {"algorithm": name, "length": length, "dtype": dtype,
                       "within": bool((difference <= bound).all()),
                       "max_abs_diff": difference.max().item() if length else 0.0,
                       "ranks_identical": all(torch.equal(g, ours) for g in gathered)}
                if tensor.is_floating_point():
                    average = all_reduce(tensor.clone(), "avg")
                    row["avg_is_sum_over_n"] = torch.equal(average, ours / world_size)
                rows.append(row)
    return rows


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 5, 6, 7, 8])
def test_doubling_algorithms_equal_the_builtin(world_size):
    rows = launch.spawn(compare_every_case, world_size=world_size)[0]
    assert len(rows) == 2 * len(lengths_for(world_size)) * len(collectives_lab.DTYPES)
    outside = [row for row in rows if not row["within"] or not row["ranks_identical"]]
    assert not outside, outside[:5]
    assert all(row["max_abs_diff"] == 0 for row in rows if row["dtype"] == "int64")
    assert all(row.get("avg_is_sum_over_n", True) for row in rows)


def traffic(rank, world_size, name, numel):
    ledger = CommLedger()
    ALGORITHMS[name](torch.ones(numel), "sum", ledger=ledger)
    return ledger.totals()["all_reduce"]


@pytest.mark.parametrize("world_size", [4, 6])
def test_ledger_counts_the_formula(world_size):
    """Bytes each rank sends: p = largest power of two <= N, r = N - p, n = 16384 bytes.

    Recursive doubling: n log2 p; halving-doubling: 2 (p - 1) / p x n, the ring's bytes at N = p.
    """
    numel, nbytes = 4096, 4096 * 4
    p = 1 << (world_size.bit_length() - 1)
    r, steps = world_size - p, p.bit_length() - 1
    for name in ALGORITHMS:
        sent = [row["bytes_sent"] for row in launch.spawn(traffic, name, numel,
                                                          world_size=world_size)]
        core = steps * nbytes if name == "recursive_doubling" else 2 * (p - 1) * nbytes // p
        # The first 2r ranks pair up: the even one sends its tensor in (fold), the odd one runs
        # the power-of-two algorithm and sends the result back (unfold); the others just run it.
        expected = [(nbytes if rank % 2 == 0 else core + nbytes) if rank < 2 * r else core
                    for rank in range(world_size)]
        assert sent == expected, (name, sent, expected)


def test_unknown_op_is_refused_before_any_message():
    with pytest.raises(ValueError, match="unknown op 'max'"):
        doubling.recursive_doubling_all_reduce(torch.ones(3), "max")


def auto_against_builtin(rank, world_size):
    """all_reduce under every algorithm name, on sizes the stored costs send to different ones."""
    from lesson_code.collectives import choose

    rows = []
    for numel in (256, 2 ** 22):  # 1 KiB and 16 MiB of float32
        tensor = collectives_lab.make_input(rank, numel, "float32", seed=numel)
        builtin = tensor.clone()
        dist.all_reduce(builtin)
        bound = collectives_lab.summation_bound(tensor, world_size)
        for algorithm in choose.CHOICES:
            ours = choose.all_reduce(tensor.clone(), "sum", algorithm=algorithm)
            rows.append({"numel": numel, "algorithm": algorithm,
                         "within": bool(((ours - builtin).abs() <= bound).all())})
        rows.append({"numel": numel, "algorithm": "chosen",
                     "within": choose.stored_costs().choose(numel * 4, world_size)})
    return rows


@pytest.mark.parametrize("world_size", [3, 4])
def test_every_algorithm_name_reduces_correctly_and_auto_agrees_across_ranks(world_size):
    per_rank = launch.spawn(auto_against_builtin, world_size=world_size)
    assert all(row == per_rank[0][i] for rows in per_rank for i, row in enumerate(rows))
    assert all(row["within"] for row in per_rank[0] if row["algorithm"] != "chosen")

"""Direct and naive reduce-scatter and all-gather, and the direct all-reduce, on real gloo ranks,
world sizes 1 to 8.

Each is compared with torch.distributed's built-in on the same inputs: integers exactly, floats
within the summation bound (two orders of N terms differ by at most (N - 1) eps sum|x|), gathered
data bitwise. The all-reduce must leave every rank with bitwise the same tensor, the ledgers must
count the ring's bytes, and "auto" must pick the same algorithm on every rank.
"""

import pytest
import torch
import torch.distributed as dist

from lesson_code import collectives_lab, launch
from lesson_code.collectives import choose, direct, naive
from lesson_code.collectives.ledger import CommLedger


SHARDED = {"direct": (direct.direct_reduce_scatter, direct.direct_all_gather),
           "naive": (naive.naive_reduce_scatter, naive.naive_all_gather)}


def lengths_for(world_size):
    """0, 1, fewer elements than ranks, not divisible by the world size, and a larger one."""
    return sorted({0, 1, max(world_size - 1, 0), 2 * world_size + 1, 1000})


def _row(name, length, dtype, ours, reference, bound):
    difference = (ours.double() - reference.double()).abs()
    return {"algorithm": name, "length": length, "dtype": dtype,
            "shape_ok": ours.shape == reference.shape,
            "within": bool((difference <= bound).all()),
            "max_abs_diff": difference.max().item() if difference.numel() else 0.0}


def compare_every_case(rank, world_size, segment_bytes=None):
    """Rows {algorithm, length, dtype, within, max_abs_diff, ...} for every case on this rank.

    `segment_bytes` shrinks the reduce-scatter's receive buffers, so that chunks travel as
    several messages (the path long tensors take).
    """
    if segment_bytes is not None:
        direct.RECEIVE_BUFFER_BYTES = segment_bytes
    rows = []
    for length in lengths_for(world_size):
        for dtype in collectives_lab.DTYPES:
            tensor = collectives_lab.make_input(rank, length, dtype, seed=length)
            bound = collectives_lab.summation_bound(tensor, world_size)
            builtin = tensor.clone()
            dist.all_reduce(builtin)
            ours = direct.direct_all_reduce(tensor.clone(), "sum")
            row = _row("all_reduce", length, dtype, ours, builtin, bound)
            gathered = [torch.empty_like(ours) for _ in range(world_size)]
            dist.all_gather(gathered, ours)
            row["ranks_identical"] = all(torch.equal(g, ours) for g in gathered)
            if tensor.is_floating_point():
                row["avg_is_sum_over_n"] = torch.equal(
                    direct.direct_all_reduce(tensor.clone(), "avg"), ours / world_size)
            rows.append(row)
            own = torch.tensor_split(builtin, world_size)[rank]
            shard = torch.tensor_split(tensor, world_size)[rank]
            sizes = [len(chunk) for chunk in torch.tensor_split(tensor, world_size)]
            reference = torch.cat(_builtin_gather(shard, sizes, world_size))
            exact = torch.zeros(reference.shape, dtype=torch.float64)
            for name, (reduce_scatter, all_gather) in SHARDED.items():
                rows.append(_row(f"{name} reduce_scatter", length, dtype,
                                 reduce_scatter(tensor, "sum"), own,
                                 torch.tensor_split(bound, world_size)[rank]))
                rows.append(_row(f"{name} all_gather", length, dtype,
                                 all_gather(shard, sizes), reference, exact))
                rows.append(_row(f"{name} all_gather_sizes_exchanged", length, dtype,
                                 all_gather(shard), reference, exact))
    return rows


def _builtin_gather(shard, sizes, world_size):
    """torch.distributed's all-gather of shards of unequal length, trimmed back to each size."""
    padded = shard.new_zeros(max(sizes))
    padded[: shard.shape[0]] = shard
    pieces = [torch.empty_like(padded) for _ in range(world_size)]
    dist.all_gather(pieces, padded)
    return [piece[:size] for piece, size in zip(pieces, sizes)]


def _check(rows):
    bad = [row for row in rows if not (row["within"] and row["shape_ok"]
                                       and row.get("ranks_identical", True)
                                       and row.get("avg_is_sum_over_n", True))]
    assert not bad, bad[:5]
    assert all(row["max_abs_diff"] == 0 for row in rows if row["dtype"] == "int64")
    assert all(row["max_abs_diff"] == 0 for row in rows if "all_gather" in row["algorithm"])


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 5, 6, 7, 8])
def test_direct_algorithms_equal_the_builtins(world_size):
    per_rank = launch.spawn(compare_every_case, world_size=world_size)
    cases = len(lengths_for(world_size)) * len(collectives_lab.DTYPES)
    assert len(per_rank[0]) == (1 + 3 * len(SHARDED)) * cases
    for rows in per_rank:
        _check(rows)


def test_long_chunks_travel_in_segments_and_still_add_up():
    # 40 bytes of buffers for 2 senders: 5 float32 (or 2 float64) per message.
    per_rank = launch.spawn(compare_every_case, 40, world_size=3)
    for rows in per_rank:
        _check(rows)


def traffic(rank, world_size, numel):
    ledger = CommLedger()
    tensor = torch.ones(numel)
    direct.direct_all_reduce(tensor.clone(), ledger=ledger)
    shard = direct.direct_reduce_scatter(tensor, ledger=ledger)
    sizes = [len(chunk) for chunk in torch.tensor_split(tensor, world_size)]
    direct.direct_all_gather(shard, sizes, ledger=ledger)
    return ledger.totals()


def naive_traffic(rank, world_size, numel):
    ledger = CommLedger()
    tensor = torch.ones(numel)
    shard = naive.naive_reduce_scatter(tensor, ledger=ledger)
    naive.naive_all_gather(shard, [len(c) for c in torch.tensor_split(tensor, world_size)],
                           ledger=ledger)
    return ledger.totals()


def test_naive_ledgers_load_rank_zero():
    """Rank 0 receives N - 1 tensors and sends N - 1 chunks (reduce-scatter), receives N - 1
    shards and sends N - 1 wholes (all-gather); every other rank sends one message each."""
    world_size, numel = 4, 4096
    nbytes, chunk = numel * 4, numel * 4 // world_size
    ledgers = launch.spawn(naive_traffic, numel, world_size=world_size)
    assert ledgers[0]["reduce_scatter"]["bytes_received"] == (world_size - 1) * nbytes
    assert ledgers[0]["reduce_scatter"]["bytes_sent"] == (world_size - 1) * chunk
    assert ledgers[0]["all_gather"]["bytes_sent"] == (world_size - 1) * nbytes
    for ledger in ledgers[1:]:
        assert ledger["reduce_scatter"]["bytes_sent"] == nbytes
        assert ledger["all_gather"]["bytes_sent"] == chunk
        assert ledger["all_gather"]["messages_sent"] == 1


@pytest.mark.parametrize("world_size, numel", [(4, 4096), (3, 1001), (5, 3)])
def test_ledgers_count_the_rings_bytes(world_size, numel):
    """Each rank sends every chunk but its own once per phase, as in the ring: summed over
    ranks, (N - 1) x the tensor per phase, and reduce-scatter + all-gather = all-reduce."""
    ledgers = launch.spawn(traffic, numel, world_size=world_size)
    nbytes = numel * 4
    for phase in ("reduce_scatter", "all_gather"):
        assert sum(l[phase]["bytes_sent"] for l in ledgers) == (world_size - 1) * nbytes
        assert sum(l[phase]["bytes_received"] for l in ledgers) == (world_size - 1) * nbytes
    for ledger in ledgers:
        assert (ledger["reduce_scatter"]["bytes_sent"] + ledger["all_gather"]["bytes_sent"]
                == ledger["all_reduce"]["bytes_sent"])
    if numel % world_size == 0:
        assert all(l["all_reduce"]["bytes_sent"] == 2 * (world_size - 1) * nbytes // world_size
                   for l in ledgers)


def auto_against_builtin(rank, world_size):
    """reduce_scatter and all_gather under every algorithm name, at sizes from 1 KiB to 4 MiB."""
    rows = []
    for numel in (256, 2 ** 20 + 3):
        tensor = collectives_lab.make_input(rank, numel, "float32", seed=numel)
        builtin = tensor.clone()
        dist.all_reduce(builtin)
        bound = collectives_lab.summation_bound(tensor, world_size)
        own, own_bound = (torch.tensor_split(t, world_size)[rank] for t in (builtin, bound))
        shard = torch.tensor_split(tensor, world_size)[rank]
        sizes = [len(chunk) for chunk in torch.tensor_split(tensor, world_size)]
        gathered = torch.cat(_builtin_gather(shard, sizes, world_size))
        for algorithm in ("auto", *choose.REDUCE_SCATTER):
            ours = choose.reduce_scatter(tensor, "sum", algorithm=algorithm)
            rows.append({"numel": numel, "op": f"{algorithm} reduce_scatter",
                         "ok": bool(((ours - own).abs() <= own_bound).all())})
        for algorithm in ("auto", *choose.ALL_GATHER):
            ours = choose.all_gather(shard, sizes, algorithm=algorithm)
            rows.append({"numel": numel, "op": f"{algorithm} all_gather",
                         "ok": torch.equal(ours, gathered)})
        for collective in ("reduce_scatter", "all_gather"):
            rows.append({"numel": numel, "op": f"chosen {collective}",
                         "ok": choose.stored_costs(collective=collective).choose(numel * 4,
                                                                                 world_size)})
    return rows


@pytest.mark.parametrize("world_size", [3, 4])
def test_every_algorithm_name_is_correct_and_auto_agrees_across_ranks(world_size):
    per_rank = launch.spawn(auto_against_builtin, world_size=world_size)
    assert all(rows == per_rank[0] for rows in per_rank)
    assert all(row["ok"] for row in per_rank[0] if not row["op"].startswith("chosen"))


def bad_arguments(rank, world_size):
    errors = {}
    attempts = {
        "op": lambda: direct.direct_reduce_scatter(torch.ones(4), "max"),
        "avg_int": lambda: direct.direct_all_reduce(torch.ones(4, dtype=torch.int64), "avg"),
        "sizes": lambda: direct.direct_all_gather(torch.ones(3), [3] * (world_size + 1)),
        "algorithm": lambda: choose.reduce_scatter(torch.ones(4), algorithm="tree"),
        "costs": lambda: choose.all_gather(torch.ones(2), [2] * world_size,
                                           costs=choose.stored_costs()),
    }
    for name, attempt in attempts.items():
        try:
            attempt()
        except ValueError as error:
            errors[name] = str(error)
    return errors


def test_bad_arguments_get_errors_that_name_the_value():
    errors = launch.spawn(bad_arguments, world_size=2)[0]
    assert "unknown op 'max'" in errors["op"]
    assert "op='avg' on a torch.int64 tensor" in errors["avg_int"]
    assert "sizes=[3, 3, 3]" in errors["sizes"]
    assert "unknown algorithm 'tree'" in errors["algorithm"]
    assert "costs fitted for all_reduce cannot choose the all_gather algorithm" in errors["costs"]

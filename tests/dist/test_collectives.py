"""Ring primitives on real gloo ranks: equal to torch.distributed, with ledgers that add up."""

import time

import pytest
import torch
import torch.distributed as dist

from lesson_code import collectives_exercises, collectives_lab, collectives, launch
from lesson_code.bench import collectives as bench
from lesson_code.collectives.ledger import CommLedger


def lengths_for(world_size):
    """0, 1, fewer elements than ranks, not divisible by the world size, and a larger one."""
    return sorted({0, 1, max(world_size - 1, 0), 2 * world_size + 1, 1000})


def check_every_length(rank, world_size):
    return {(length, dtype): collectives_lab.compare_with_builtin(rank, world_size, length,
                                                                    dtype, seed=length)
            for length in lengths_for(world_size) for dtype in collectives_lab.DTYPES}


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 5])
def test_primitives_equal_the_builtins(world_size):
    results = launch.spawn(check_every_length, world_size=world_size)
    failures = [(rank, key, op, diff) for rank, result in enumerate(results)
                for key, ops in result.items() for op, diff in ops.items() if not diff["within"]]
    assert not failures, failures[:5]
    for rank, result in enumerate(results):
        for (length, dtype), ops in result.items():
            if dtype == "int64":  # integer sums are exact, whatever the order
                assert all(diff["max_abs_diff"] == 0 for diff in ops.values())
            assert ops["all_gather"]["max_abs_diff"] == 0  # moving data never changes it
            assert ops["broadcast"]["max_abs_diff"] == 0


def test_the_plain_ring_gives_the_production_rings_bits():
    # 5 and 1001 values: uneven chunks; 2**20 on 2 ranks: chunks of 2 MiB, which the production ring
    # sends in pieces, whose additions must not change a bit either.
    results = launch.spawn(plain_and_production, world_size=4)
    assert all(results), results
    assert all(launch.spawn(collectives_lab.compare_plain_ring, 2 ** 20, world_size=2))


def plain_and_production(rank, world_size):
    return all(collectives_lab.compare_plain_ring(rank, world_size, length, seed=length)
               for length in (5, 1001))


@pytest.mark.parametrize("world_size", [2, 4, 5])
def test_ledger_counts_match_the_formulas_when_n_divides(world_size):
    numel = 60 * 1024  # divisible by 2, 4 and 5
    nbytes = numel * 4
    ledgers = launch.spawn(collectives_lab.measure_ledgers, numel, "float32", world_size=world_size)
    n = world_size
    for rank, ledger in enumerate(ledgers):
        all_reduce = ledger["all_reduce"]
        assert all_reduce["bytes_sent"] == all_reduce["bytes_received"] == 2 * (n - 1) * nbytes // n
        assert ledger["reduce_scatter"]["bytes_sent"] == (n - 1) * nbytes // n
        assert ledger["all_gather"]["bytes_sent"] == (n - 1) * nbytes // n
        # The lesson's central identity: reduce-scatter + all-gather moves one all-reduce's bytes.
        assert (ledger["reduce_scatter"]["bytes_sent"] + ledger["all_gather"]["bytes_sent"]
                == all_reduce["bytes_sent"])
        expected_naive = (n - 1) * nbytes if rank == 0 else nbytes
        assert ledger["naive_all_reduce"]["bytes_sent"] == expected_naive
        assert ledger["naive_all_reduce"]["bytes_received"] == expected_naive
    broadcast_messages = sum(ledger["broadcast"]["messages_sent"] for ledger in ledgers)
    assert broadcast_messages == n - 1
    assert sum(ledger["broadcast"]["bytes_received"] for ledger in ledgers) == (n - 1) * nbytes


@pytest.mark.parametrize("numel, dtype", [(1001, "float32"), (3, "bfloat16"), (7, "int64")])
def test_ledger_totals_hold_for_uneven_chunks(numel, dtype):
    world_size = 4
    element = torch.empty(0, dtype=collectives_lab.DTYPES[dtype]).element_size()
    nbytes = numel * element
    ledgers = launch.spawn(collectives_lab.measure_ledgers, numel, dtype, world_size=world_size)
    # Each rank sends every chunk but one in each phase, so the sum over ranks is exact.
    assert sum(l["all_reduce"]["bytes_sent"] for l in ledgers) == 2 * (world_size - 1) * nbytes
    assert sum(l["all_reduce"]["bytes_received"] for l in ledgers) == 2 * (world_size - 1) * nbytes
    assert sum(l["reduce_scatter"]["bytes_sent"] + l["all_gather"]["bytes_sent"]
               for l in ledgers) == 2 * (world_size - 1) * nbytes


def shapes_and_layouts(rank, world_size):
    matrix = torch.arange(30, dtype=torch.float64).reshape(10, 3) * (rank + 1)
    expected_sum = torch.arange(30, dtype=torch.float64).reshape(10, 3) * sum(
        range(1, world_size + 1))
    transposed = matrix.clone().t()  # not contiguous: reduced in a contiguous copy and written back
    collectives.ring_all_reduce(transposed)
    rows = collectives.ring_reduce_scatter(matrix, op="avg")
    gathered = collectives.ring_all_gather(rows)
    return {
        "transposed_ok": torch.equal(transposed.t(), expected_sum),
        "rows_shape": tuple(rows.shape),
        "gathered_ok": torch.allclose(gathered, expected_sum / world_size),
    }


def test_two_dimensional_and_non_contiguous_tensors():
    results = launch.spawn(shapes_and_layouts, world_size=3)
    assert all(r["transposed_ok"] and r["gathered_ok"] for r in results)
    assert [r["rows_shape"] for r in results] == [(4, 3), (3, 3), (3, 3)]  # tensor_split rows


def bad_arguments(rank, world_size):
    errors = {}
    attempts = {
        "op": lambda: collectives.ring_all_reduce(torch.ones(4), op="max"),
        "avg_int": lambda: collectives.ring_reduce_scatter(torch.ones(4, dtype=torch.int64),
                                                           op="avg"),
        "src": lambda: collectives.broadcast(torch.ones(4), src=world_size),
        "sizes": lambda: collectives.ring_all_gather(torch.ones(3), [3] * (world_size + 1)),
        "scalar": lambda: collectives.ring_all_gather(torch.tensor(1.0)),
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
    assert "src=2 is not a rank" in errors["src"]
    assert "sizes=[3, 3, 3]" in errors["sizes"]
    assert "reshape(1)" in errors["scalar"]


def test_calling_a_primitive_without_a_process_group_explains_how():
    assert not dist.is_initialized()
    with pytest.raises(RuntimeError, match="launch.spawn"):
        collectives.ring_all_reduce(torch.ones(3))


def rank_one_skips_the_collective(rank, world_size):
    if rank == 1:
        time.sleep(600)  # never joins; rank 0's bounded waits must give up first
        return "skipped"
    collectives.ring_all_reduce(torch.ones(8), timeout_s=2)
    return "finished"


def test_every_wait_is_bounded():
    # Were rank 0's wait unbounded, nothing would end before spawn's own timeout, and spawn would
    # raise RankTimeoutError naming both ranks; a bounded wait makes rank 0 fail on its own.
    with pytest.raises(launch.RankFailedError) as caught:
        launch.spawn(rank_one_skips_the_collective, world_size=2, timeout_s=60)
    assert caught.value.rank == 0
    assert "ring_all_reduce" in caught.value.rank_traceback
    assert "TimeoutError: rank 0 of 2 waited 2 s in all_reduce" in caught.value.rank_traceback


def test_the_lessons_skipped_collective_ends_in_rank_0s_timeout_told_in_both_editions():
    with pytest.raises(launch.RankFailedError) as caught:
        launch.spawn(collectives_lab.skip_a_collective, 1.0, world_size=2, timeout_s=60)
    assert caught.value.rank == 0
    assert collectives_lab.hang_line(caught.value.rank_traceback, "en") == (
        "rank 0 of 2 gave up after 1 s in all_reduce: a message it waited for never came")
    assert collectives_lab.hang_line(caught.value.rank_traceback, "fa").startswith(
        "رتبهٔ ۰ از ۲ رتبه پس از ۱ ثانیه در کاهش همگانی دست کشید")
    with pytest.raises(ValueError, match="no TimeoutError"):
        collectives_lab.hang_line("Traceback ...\nRuntimeError: boom", "en")


def test_a_message_shorter_than_its_receive_fills_only_its_own_length_without_an_error():
    received, sent = launch.spawn(collectives_lab.short_message, world_size=2, timeout_s=60)
    assert sent is None
    assert received == [1.0] * 4 + [-1.0] * 4  # the rest of the receive keeps its old values


def chain_broadcast_cases(rank, world_size):
    """The chain broadcast (page 76b) from several sources, piece counts and lengths, and refusals."""
    results = {case: collectives_exercises.compare_chain_broadcast(rank, world_size, *case)
               for case in ((0, 1001, 4), (2, 1001, 3), (4, 3, 5), (1, 0, 2))}
    errors = []
    for bad in ({"src": world_size}, {"pieces": 0}):
        with pytest.raises(ValueError) as refused:
            collectives_exercises.chain_broadcast(torch.zeros(4), **bad)
        errors.append(str(refused.value))
    return results, errors


def test_the_chain_broadcast_equals_the_builtin_and_sends_each_piece_along_n_minus_1_hops():
    world_size = 5
    per_rank = launch.spawn(chain_broadcast_cases, world_size=world_size)
    for src, numel, pieces in per_rank[0][0]:
        rows = [results[(src, numel, pieces)] for results, _ in per_rank]
        assert all(row["equal"] for row in rows)
        assert sum(row["messages_sent"] for row in rows) == (world_size - 1) * min(pieces, numel)
        last = (src - 1) % world_size  # the end of the chain forwards nothing
        assert rows[last]["bytes_sent"] == 0 and rows[src]["bytes_received"] == 0
        assert all(row["bytes_sent"] == 4 * numel for rank, row in enumerate(rows) if rank != last)
    errors = per_rank[0][1]
    assert "src=5" in errors[0] and "pieces=0" in errors[1]


def all_to_all_cases(rank, world_size):
    """The pairwise all-to-all (page 76b) in two dtypes and a refusal of an uneven first dimension."""
    results = {case: collectives_exercises.compare_all_to_all(rank, world_size, *case)
               for case in ((world_size * 5, "float32"), (world_size, "int64"))}
    with pytest.raises(ValueError) as refused:
        collectives_exercises.pairwise_all_to_all(torch.zeros(world_size + 1))
    return results, str(refused.value)


def test_the_pairwise_all_to_all_equals_the_builtin_and_sends_n_minus_1_chunks():
    world_size = 3
    per_rank = launch.spawn(all_to_all_cases, world_size=world_size)
    for rows, dtype_name in per_rank[0][0]:
        results = [cases[(rows, dtype_name)] for cases, _ in per_rank]
        chunk_bytes = rows // world_size * 3 * (4 if dtype_name == "float32" else 8)
        assert all(r["equal"] for r in results)
        assert all(r["messages_sent"] == r["messages_received"] == world_size - 1 for r in results)
        assert all(r["bytes_sent"] == r["bytes_received"] == (world_size - 1) * chunk_bytes
                   for r in results)
    assert "shape (4,)" in per_rank[0][1] and "multiple of 3" in per_rank[0][1]


def ring_ledger_is_per_call(rank, world_size):
    ledger = CommLedger()
    for _ in range(3):
        collectives.ring_all_reduce(torch.ones(8), ledger=ledger)
    return ledger.totals()["all_reduce"]


def test_a_ledger_sums_repeated_calls():
    totals = launch.spawn(ring_ledger_is_per_call, world_size=4)[0]
    assert totals["calls"] == 3
    assert totals["bytes_sent"] == 3 * 2 * 3 * 8  # 3 calls x 2(N-1) chunks x 2 floats x 4 bytes
    assert totals["messages_sent"] == 3 * 2 * 3


def naive_versus_ring_traffic(rank, world_size, numel):
    ledger = CommLedger()
    collectives.ring_all_reduce(torch.ones(numel), ledger=ledger)
    collectives.naive_all_reduce(torch.ones(numel), ledger=ledger)
    return ledger.totals()


def test_the_naive_all_reduce_loads_rank_zero_n_over_two_times_more():
    numel, n = 4096, 4
    ledgers = launch.spawn(naive_versus_ring_traffic, numel, world_size=n)
    busiest_naive = max(l["naive_all_reduce"]["bytes_sent"] + l["naive_all_reduce"]["bytes_received"]
                        for l in ledgers)
    busiest_ring = max(l["all_reduce"]["bytes_sent"] + l["all_reduce"]["bytes_received"]
                       for l in ledgers)
    # Rank 0 of the naive scheme moves 2(N-1) x size; a ring rank 4(N-1)/N x size: N/2 times less.
    assert busiest_naive * 2 == busiest_ring * n


def test_timings_agree_across_ranks_and_feed_the_benchmark_table():
    sizes, ops = [64, 4096], [op for ours, builtin, _ in bench.PAIRS for op in (ours, builtin)]
    per_rank = launch.spawn(collectives_lab.time_primitives, sizes, 2, 0.002, world_size=2)
    rows = per_rank[0]
    assert per_rank[1] == rows  # one agreed repeat count per (op, size) and the slowest rank's time
    assert [(row["op"], row["nbytes"]) for row in rows] == [
        (op, nbytes) for nbytes in sizes for op in dict.fromkeys(ops)]
    assert all(row["seconds"] > 0 for row in rows)
    table = bench.comparison_table(rows, world_size=2)
    assert len(table) == len(bench.PAIRS) * len(sizes)
    assert (table.ratio > 0).all() and (table.ours_busbw_GBps > 0).all()


def test_the_side_by_side_run_times_auto_and_gloo_in_turn_and_agrees_across_ranks():
    ops = list(bench.SIDE_BY_SIDE)
    per_rank = launch.spawn(collectives_lab.time_primitives, [64, 4096], 2, 0.002, ops, True,
                            world_size=2)
    assert per_rank[1] == per_rank[0]
    assert [(row["op"], row["nbytes"]) for row in per_rank[0]] == [
        (op, nbytes) for nbytes in (64, 4096) for op in ops]
    assert all(row["seconds"] > 0 for row in per_rank[0])


def timing_errors(rank, world_size):
    errors = {}
    for name, args in {"size": ([100],), "op": ([64], 1, 0.01, ["ring all_to_all"]),
                       "min_trial_s": ([64], 1, 0.0)}.items():
        try:
            collectives_lab.time_primitives(rank, world_size, *args)
        except ValueError as error:
            errors[name] = str(error)
    return errors


def test_timing_arguments_are_checked_before_any_message():
    errors = launch.spawn(timing_errors, world_size=2, timeout_s=60)[0]
    assert "size 100 B is not a multiple of 4 * world_size = 8" in errors["size"]
    assert "unknown operation 'ring all_to_all': use one of 'ring all_reduce'" in errors["op"]
    assert "min_trial_s must be positive, got 0.0" in errors["min_trial_s"]


def test_an_unknown_dtype_names_the_ones_there_are():
    with pytest.raises(ValueError, match="unknown dtype 'float16': use one of 'float32'"):
        collectives_lab.make_input(0, 4, "float16")


def test_the_summary_takes_the_worst_rank_and_names_the_dtypes_outside_the_bound():
    def rank_result(diff, allowed):
        return {"float32": {"all_reduce": {"max_abs_diff": diff, "allowed": allowed,
                                           "within": diff <= allowed}},
                "int64": {"all_reduce": {"max_abs_diff": 0.0, "allowed": 0.0, "within": True}}}
    results = [rank_result(1e-7, 1e-6), rank_result(2e-6, 1e-6)]
    assert collectives_lab.worst_differences(results) == {"float32": {"all_reduce": 2e-6},
                                                          "int64": {"all_reduce": 0.0}}
    assert collectives_lab.failing_dtypes(results) == ["float32"]
    assert collectives_lab.failing_dtypes(results[:1]) == []


@pytest.mark.parametrize("world_size", [2, 4])
def test_a_naive_root_that_posts_its_receives_at_once_gives_the_naive_schemes_bits(world_size):
    # Lesson 76's exercise 7: the same messages and the same additions in the same order.
    results = launch.spawn(collectives_lab.compare_posted_naive, 4 * 1001, 3, world_size=world_size)
    assert all(result["same_bits"] for result in results), results
    assert all(len(result["naive"]) == len(result["posted"]) == 3 for result in results)

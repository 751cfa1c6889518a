"""The alpha-beta model: message and byte counts, prediction, fitting and nccl-tests bandwidths."""

import math

import pytest

from lesson_code.collectives import cost_model


@pytest.mark.parametrize("n", [1, 2, 4, 8, 64])
def test_reduce_scatter_plus_all_gather_is_one_all_reduce(n):
    size = 1 << 20
    assert (cost_model.bytes_per_rank("reduce_scatter", size, n)
            + cost_model.bytes_per_rank("all_gather", size, n)
            == cost_model.bytes_per_rank("all_reduce", size, n))
    assert (cost_model.message_count("reduce_scatter", n) + cost_model.message_count("all_gather", n)
            == cost_model.message_count("all_reduce", n))


def test_ring_bytes_approach_twice_the_tensor():
    assert cost_model.bytes_per_rank("all_reduce", 1000, 4) == 1500
    assert cost_model.bytes_per_rank("all_reduce", 1000, 1000) == pytest.approx(1998)
    assert cost_model.bytes_per_rank("naive_all_reduce", 1000, 4) == 6000


def test_broadcast_tree_rounds():
    assert [cost_model.message_count("broadcast", n) for n in (1, 2, 3, 4, 5, 8, 9)] == \
        [0, 1, 2, 2, 3, 3, 4]


def test_fit_recovers_the_parameters_it_was_given():
    alpha, beta, n = 2e-4, 1e-9, 4
    sizes = [2 ** k for k in range(10, 27, 2)]
    times = [cost_model.predict("all_reduce", s, n, alpha, beta) for s in sizes]
    fitted = cost_model.fit_alpha_beta("all_reduce", n, sizes, times)
    assert fitted.alpha == pytest.approx(alpha, rel=1e-6)
    assert fitted.beta == pytest.approx(beta, rel=1e-6)
    assert fitted.bandwidth == pytest.approx(1e9, rel=1e-6)


def test_fit_of_noisy_times_is_the_least_squares_solution():
    # Three points off a line: the fit minimises the squared residuals, so they sum to zero
    # and are orthogonal to the bytes column.
    sizes, times, n = [1000, 2000, 4000], [1.0e-3, 1.3e-3, 2.2e-3], 2
    fitted = cost_model.fit_alpha_beta("all_reduce", n, sizes, times)
    residuals = [t - cost_model.predict("all_reduce", s, n, fitted.alpha, fitted.beta)
                 for s, t in zip(sizes, times)]
    xs = [cost_model.bytes_per_rank("all_reduce", s, n) for s in sizes]
    assert abs(sum(residuals)) < 1e-15
    assert abs(sum(r * x for r, x in zip(residuals, xs))) < 1e-12
    assert max(abs(r) for r in residuals) > 1e-6  # the points really are off any line


def test_fit_needs_two_sizes():
    with pytest.raises(ValueError, match="two distinct sizes"):
        cost_model.fit_alpha_beta("all_reduce", 4, [1024, 1024], [1.0, 1.0])


def test_fit_on_one_rank_has_nothing_to_fit():
    with pytest.raises(ValueError, match="world_size 1 sends no message.*2 or more ranks"):
        cost_model.fit_alpha_beta("all_reduce", 1, [1024, 4096], [1e-6, 2e-6])


def test_bus_bandwidth_follows_nccl_tests():
    algbw, busbw = cost_model.bandwidths("all_reduce", 8e9, 2.0, 8)
    assert algbw == 4e9 and busbw == pytest.approx(4e9 * 14 / 8)
    assert cost_model.bandwidths("all_gather", 8e9, 2.0, 4)[1] == pytest.approx(3e9)
    assert cost_model.bandwidths("broadcast", 8e9, 2.0, 4)[1] == 4e9


@pytest.mark.parametrize("call, message", [
    (lambda: cost_model.message_count("all_to_all", 4), "unknown algorithm 'all_to_all': use one of"),
    (lambda: cost_model.bytes_per_rank("all_reduce", 10, 0),
     "world_size must be a positive int, got 0: pass the number of ranks"),
    (lambda: cost_model.message_count("all_reduce", True), "world_size must be a positive int"),
    (lambda: cost_model.bandwidths("naive_all_reduce", 10, 1.0, 4),
     "unknown nccl-tests algorithm 'naive_all_reduce': use one of 'all_reduce'"),
    (lambda: cost_model.bandwidths("all_reduce", 10, 0.0, 4),
     "seconds must be positive, got 0.0: pass the measured time"),
])
def test_bad_input_is_rejected_with_the_value_and_the_fix(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_latency_dominates_small_messages():
    alpha, beta = 1e-4, 1e-9
    small = cost_model.predict("all_reduce", 1024, 4, alpha, beta)
    assert 6 * alpha / small > 0.99
    large = cost_model.predict("all_reduce", 1 << 30, 4, alpha, beta)
    assert 6 * alpha / large < 0.01
    assert not math.isinf(small)


@pytest.mark.parametrize("world_size,rd,hd", [
    # (N, (messages, bytes of n=1024) for recursive doubling, the same for halving-doubling)
    (1, (0, 0), (0, 0)), (2, (1, 1024), (2, 1024)), (4, (2, 2048), (4, 1536)),
    (8, (3, 3072), (6, 1792)),
    (3, (1 + 2, 1024 + 2048), (2 + 2, 1024 + 2048)),   # p = 2, one pair folds
    (6, (2 + 2, 2048 + 2048), (4 + 2, 1536 + 2048)),   # p = 4, two pairs fold
])
def test_doubling_formulas_by_hand(world_size, rd, hd):
    for name, (messages, nbytes) in (("recursive_doubling", rd), ("halving_doubling", hd)):
        assert cost_model.message_count(name, world_size) == messages
        assert cost_model.bytes_per_rank(name, 1024, world_size) == nbytes


def test_halving_doubling_moves_the_ring_bytes_in_fewer_steps_on_powers_of_two():
    for n in (2, 4, 8, 16, 64):
        assert cost_model.bytes_per_rank("halving_doubling", 4096, n) == \
            cost_model.bytes_per_rank("all_reduce", 4096, n)
        assert cost_model.message_count("halving_doubling", n) <= \
            cost_model.message_count("all_reduce", n)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
def test_direct_algorithms_move_the_rings_bytes(n):
    for direct, ring in (("direct_reduce_scatter", "reduce_scatter"),
                         ("direct_all_gather", "all_gather"), ("direct_all_reduce", "all_reduce")):
        assert cost_model.bytes_per_rank(direct, 4096, n) == cost_model.bytes_per_rank(ring, 4096, n)
        assert cost_model.message_count(direct, n) == cost_model.message_count(ring, n)
    assert cost_model.bytes_per_rank("direct_reduce_scatter", 1024, 4) == 768


def test_naive_sharded_algorithms_load_rank_zero_like_the_naive_all_reduce():
    # Rank 0 receives 3 tensors and sends 3 quarters: (N-1)(N+1)/N n = 3.75 n on 4 ranks.
    for name in ("naive_reduce_scatter", "naive_all_gather"):
        assert cost_model.bytes_per_rank(name, 1024, 4) == 3840
        assert cost_model.message_count(name, 4) == cost_model.message_count("naive_all_reduce", 4)

"""The all-reduce choice: fitted costs pick the algorithm the cost model says is fastest."""

import pytest

from lesson_code.collectives import choose, cost_model

SIZES = [2 ** k for k in range(10, 27, 2)]


def times_from(alpha_beta: dict[str, tuple[float, float]], world_size: int = 4) -> list[dict]:
    """Rows a benchmark would give if each algorithm followed the model exactly."""
    return [{"algorithm": name, "world_size": world_size, "nbytes": n,
             "seconds": cost_model.predict(choose.MODEL_NAME[name], n, world_size, a, b)}
            for name, (a, b) in alpha_beta.items() for n in SIZES]


# One latency and one bandwidth for every algorithm: the model alone decides.
SAME = {name: (50e-6, 1e-9) for name in choose.ALL_REDUCE}


def test_the_fit_recovers_the_constants():
    costs = choose.AlgorithmCosts.from_times(times_from(SAME), source="model")
    for fit in costs.fits.values():
        assert fit.alpha == pytest.approx(50e-6, rel=1e-6)
        assert fit.beta == pytest.approx(1e-9, rel=1e-6)


def test_short_messages_take_recursive_doubling_long_ones_halving_doubling():
    costs = choose.AlgorithmCosts.from_times(times_from(SAME), source="model")
    # 4 ranks: doubling 2 steps x n bytes; halving-doubling 4 steps, 1.5 n; ring 6 steps, 1.5 n.
    # They cross where 2 alpha = 0.5 n beta, n = 4 alpha / beta = 200 kB.
    assert costs.choose(1024, 4) == "recursive_doubling"
    assert costs.choose(150_000, 4) == "recursive_doubling"
    assert costs.choose(250_000, 4) == "halving_doubling"
    assert costs.choose(2 ** 26, 4) == "halving_doubling"


def test_measured_constants_decide_when_the_model_alone_would_not():
    # A ring whose bandwidth term is measured smaller (its pieces overlap the adds) wins the
    # long messages although halving-doubling takes fewer steps.
    measured = {**SAME, "ring": (50e-6, 0.6e-9)}
    costs = choose.AlgorithmCosts.from_times(times_from(measured), source="model")
    assert costs.choose(2 ** 26, 4) == "ring"
    assert costs.choose(1024, 4) == "recursive_doubling"


def test_stored_times_round_trip(tmp_path):
    path = choose.store_times(times_from(SAME), "made by the test\nsecond line", tmp_path / "t.csv")
    assert path.read_text().startswith("# made by the test\n# second line\nalgorithm,")
    costs = choose.stored_costs(path)
    assert costs.choose(1024, 4) == "recursive_doubling"
    assert costs.source == str(path)


@pytest.mark.parametrize("collective", list(choose.ALGORITHMS))
def test_the_package_ships_stored_times_for_every_algorithm(collective):
    costs = choose.stored_costs(collective=collective)
    assert set(costs.fits) == set(choose.ALGORITHMS[collective])
    assert costs.collective == collective
    what = collective.replace("_", "-")
    assert choose.STORED_FILES[collective].read_text().startswith(f"# {what} times of ")


def test_reduce_scatter_costs_choose_the_direct_algorithm_when_its_round_is_cheaper():
    # The direct reduce-scatter sends the ring's bytes in the ring's count of messages, so only
    # the measured constants tell them apart: here its messages cost less (all sent at once).
    rows = [{"algorithm": name, "world_size": 4, "nbytes": n,
             "seconds": cost_model.predict(model, n, 4, alpha, 1e-9)}
            for name, model, alpha in (("ring", "reduce_scatter", 50e-6),
                                       ("direct", "direct_reduce_scatter", 20e-6))
            for n in SIZES]
    costs = choose.AlgorithmCosts.from_times(rows, source="model", collective="reduce_scatter")
    assert costs.choose(1024, 4) == "direct"
    assert costs.fits["ring"].alpha == pytest.approx(50e-6, rel=1e-6)


def test_costs_of_another_collective_are_refused():
    with pytest.raises(ValueError, match="unknown collective 'broadcast'"):
        choose.AlgorithmCosts.from_times([], source="none", collective="broadcast")
    with pytest.raises(ValueError, match="no reduce_scatter algorithm has times"):
        choose.AlgorithmCosts.from_times(times_from({"halving_doubling": (5e-5, 1e-9)}),
                                         source="model",
                                         collective="reduce_scatter")


def test_an_unknown_algorithm_is_named():
    import torch
    with pytest.raises(ValueError, match="unknown algorithm 'tree'"):
        choose.all_reduce(torch.ones(2), algorithm="tree")


def test_measured_times_decide_inside_their_range_and_the_model_beyond():
    # The ring measured 3x faster than its model at 4 MiB only (a step the two constants of a
    # fit cannot follow): auto takes it there and at sizes next to it, and the model elsewhere.
    rows = times_from(SAME)
    for row in rows:
        if row["algorithm"] == "ring" and row["nbytes"] == 2 ** 22:
            row["seconds"] /= 3
    costs = choose.AlgorithmCosts.from_times(rows, source="model")
    as_modelled = choose.AlgorithmCosts.from_times(times_from(SAME), source="model")
    assert as_modelled.choose(2 ** 22, 4) == "halving_doubling"
    assert costs.choose(2 ** 22, 4) == "ring"
    assert costs.expected("ring", 2 ** 22, 4) == pytest.approx(
        [r["seconds"] for r in rows if r["algorithm"] == "ring" and r["nbytes"] == 2 ** 22][0])
    # Halfway between 1 MiB and 4 MiB on log axes: the geometric mean of the two times.
    one, four = (next(r["seconds"] for r in rows if r["algorithm"] == "ring" and r["nbytes"] == n)
                 for n in (2 ** 20, 2 ** 22))
    assert costs.expected("ring", 2 ** 21, 4) == pytest.approx((one * four) ** 0.5)
    # Past the largest measured size, and on another world size, the fitted model answers.
    assert costs.expected("ring", 2 ** 28, 4) == costs.predict("ring", 2 ** 28, 4)
    assert costs.expected("ring", 2 ** 22, 8) == costs.predict("ring", 2 ** 22, 8)
    assert costs.choose(2 ** 28, 4) == min(costs.fits,
                                           key=lambda name: costs.predict(name, 2 ** 28, 4))


# A table cut short where `make bench` or a full disk stopped writing it, and what it lost.
CUTS = {"the seconds": lambda text: text[: text.rindex(",")],       # ...,4096 (no 4th field)
        "the last digits": lambda text: text[: text.rindex(",") + 1],  # ...,4096,
        "half a name": lambda text: text[: text.rindex("\n") + 4]}     # "rin"


@pytest.mark.parametrize("lost", sorted(CUTS))
def test_a_table_cut_short_is_refused_naming_its_file_and_line(tmp_path, lost):
    whole = choose.store_times(times_from(SAME), "made by the test\nsecond line",
                               tmp_path / "t.csv").read_text().rstrip("\r\n")
    damaged = tmp_path / "damaged.csv"
    damaged.write_text(CUTS[lost](whole))
    last = len(damaged.read_text().splitlines())
    with pytest.raises(ValueError, match=rf"damaged\.csv, line {last}: .* is not a whole row of "
                                         r"algorithm,world_size,nbytes,seconds: measure again"):
        choose.stored_times(damaged)
    damaged.write_text("# made by the test\nalgorithm,world_si")
    with pytest.raises(ValueError, match=r"damaged\.csv, line 2: the header is not"):
        choose.stored_times(damaged)


@pytest.fixture
def fresh_costs():
    """stored_costs and say_once forget what they read and said, before and after the test."""
    choose.stored_costs.cache_clear(), choose.say_once.cache_clear()
    yield
    choose.stored_costs.cache_clear(), choose.say_once.cache_clear()


def test_this_machines_damaged_table_gives_way_to_the_packages_in_one_line(
        tmp_path, monkeypatch, capsys, fresh_costs):
    from lesson_code.harness.timing import machine_line

    monkeypatch.setenv(choose.RESULTS_VARIABLE, str(tmp_path))
    own = choose.store_times(choose.stored_times(choose.STORED),
                             f"measured here\nmachine: {machine_line()}", tmp_path / choose.STORED.name)
    own.write_text(CUTS["the seconds"](own.read_text().rstrip()))
    assert choose.measured_here("all_reduce") == own
    for _ in range(3):  # read again and again, as every "auto" of a run may
        assert choose.stored_costs().source == str(choose.STORED)
        assert choose.stored_costs(collective="all_reduce").source == str(choose.STORED)
    said = capsys.readouterr().err.splitlines()
    assert len(said) == 1 and str(own) in said[0] and "line " in said[0], said
    assert "the package's all_reduce times" in said[0]
    with pytest.raises(ValueError, match="line "):  # asked for by name, it is not replaced
        choose.stored_costs(own)


class Unwritable:
    """A value whose text cannot be made: the write of its row fails half-way through the file."""

    def __str__(self):
        raise RuntimeError("this value cannot be written")


def test_a_store_that_fails_half_way_leaves_the_old_table_whole(tmp_path):
    path = choose.store_times(times_from(SAME), "the old table", tmp_path / "t.csv")
    before = path.read_bytes()
    rows = times_from(SAME)
    rows[len(rows) // 2]["seconds"] = Unwritable()
    with pytest.raises(RuntimeError, match="cannot be written"):
        choose.store_times(rows, "the new table", path)
    assert path.read_bytes() == before
    assert sorted(tmp_path.iterdir()) == [path]  # no new file left beside it


def test_shared_memory_is_charged_its_barriers_which_grow_with_the_ranks():
    # Each of its two barriers is a one-element naive all-reduce through rank 0
    # (`shared_memory._barrier`): 2(N - 1) messages in a row each, not one step whatever N.
    for n in (2, 3, 4, 8, 16):
        assert cost_model.message_count("shared_memory_all_reduce", n) == \
            2 * cost_model.message_count("naive_all_reduce", n)
    # Extrapolated from the book's 4 ranks, those barriers cost 16 ranks more than a naive
    # all-reduce of a small tensor, so shared memory no longer wins from 0 bytes.
    book = choose.stored_costs(choose.STORED)
    assert book.decisions(4).algorithms == ("naive", "shared_memory")
    assert book.decisions(16).algorithms[0] == "naive"

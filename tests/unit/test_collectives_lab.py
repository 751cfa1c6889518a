"""Lesson 76 without ranks: where two fitted models cross, and the ring's table of steps."""

import math

import pytest

from lesson_code import collectives_lab
from lesson_code.collectives import cost_model, ring_chunk_indices
from lesson_code.collectives.cost_model import AlphaBeta
from lesson_code.plots import collectives as figures


@pytest.mark.parametrize("world_size", [2, 4, 7])
def test_the_crossover_is_where_the_two_predicted_times_meet(world_size):
    ring, naive = AlphaBeta(alpha=1e-3, beta=1e-9), AlphaBeta(alpha=1e-4, beta=1e-9)
    crossover = collectives_lab.crossover_bytes(ring, naive, world_size)
    assert 0 < crossover < math.inf
    ring_time = cost_model.predict("all_reduce", crossover, world_size, ring.alpha, ring.beta)
    naive_time = cost_model.predict("naive_all_reduce", crossover, world_size, naive.alpha,
                                    naive.beta)
    assert ring_time == pytest.approx(naive_time, rel=1e-12)
    for nbytes, ring_faster in ((crossover / 2, False), (crossover * 2, True)):
        assert (cost_model.predict("all_reduce", nbytes, world_size, ring.alpha, ring.beta)
                < cost_model.predict("naive_all_reduce", nbytes, world_size, naive.alpha,
                                     naive.beta)) is ring_faster


def test_a_ring_that_is_never_slower_crosses_at_zero_and_one_never_faster_at_infinity():
    fast, slow = AlphaBeta(alpha=1e-5, beta=1e-9), AlphaBeta(alpha=1e-3, beta=1e-9)
    assert collectives_lab.crossover_bytes(fast, slow, 4) == 0.0
    # the naive scheme's bytes four times cheaper: on 4 ranks its 6n beta/4 is the ring's 1.5n beta
    assert collectives_lab.crossover_bytes(slow, AlphaBeta(alpha=1e-5, beta=0.25e-9), 4) == math.inf



@pytest.mark.parametrize("world_size", [2, 4, 7])
def test_a_ring_cheaper_per_message_but_dearer_per_byte_is_faster_below_its_crossover(world_size):
    # the naive scheme's bytes many times cheaper, its messages ten times dearer
    ring, naive = AlphaBeta(alpha=1e-4, beta=1e-9), AlphaBeta(alpha=1e-3, beta=0.01e-9)
    crossover = collectives_lab.crossover_bytes(ring, naive, world_size)
    assert -math.inf < crossover < 0
    size = -crossover
    for nbytes, ring_faster in ((size / 2, True), (size * 2, False)):
        assert (cost_model.predict("all_reduce", nbytes, world_size, ring.alpha, ring.beta)
                < cost_model.predict("naive_all_reduce", nbytes, world_size, naive.alpha,
                                     naive.beta)) is ring_faster
    line = collectives_lab.crossover_line(-3 * 2 ** 20, [4096], "en", readable=True)
    assert line == "model: ring faster below 3 MiB; measured: ring faster at 4 KiB"
    assert "زیر ۳ MiB" in collectives_lab.crossover_line(-3 * 2 ** 20, [4096], "fa", readable=True)
    sizes = [4096, 2 ** 24]
    assert collectives_lab.fit_agreement_line(-2 ** 21, [4096], sizes, "en") == (
        "fit and run agree: each size's faster scheme is the one the fit predicts")


def test_the_ring_table_is_the_ring_schedule_counted_from_step_one():
    table = figures.ring_schedule_table(5, "all_gather")
    assert table.index.tolist() == [f"rank {rank}" for rank in range(5)]
    assert [step for step, _ in table.columns[::2]] == ["step 1", "step 2", "step 3", "step 4"]
    for rank in range(5):
        for step in range(1, 5):
            sent, received = ring_chunk_indices("all_gather", rank, step, 5)
            assert table.loc[f"rank {rank}", (f"step {step}", "sends")] == sent
            assert table.loc[f"rank {rank}", (f"step {step}", "receives")] == received
    # steps counted from 1, as the lesson's text counts them: in step 1 of a reduce-scatter on
    # 4 ranks rank 0 sends chunk 3 and receives chunk 2; in an all-gather it sends its own
    assert ring_chunk_indices("reduce_scatter", 0, 1, 4) == (3, 2)
    assert ring_chunk_indices("reduce_scatter", 0, 3, 4) == (1, 0)  # the last step: its own
    assert ring_chunk_indices("all_gather", 2, 1, 4) == (2, 1)
    for step in (0, 4):
        with pytest.raises(ValueError, match="is not a step"):
            ring_chunk_indices("all_gather", 0, step, 4)
    shown = figures.localized(figures.ring_schedule_table(3), "fa")
    assert shown.index.tolist() == ["رتبهٔ ۰", "رتبهٔ ۱", "رتبهٔ ۲"]
    assert shown.columns.tolist()[0] == ("گام ۱", "می‌فرستد")


def test_a_bfloat16_running_sum_loses_more_as_ranks_are_added_and_a_float32_one_does_not():
    errors = {n: collectives_lab.reduction_error(n, numel=4096) for n in (4, 64, 256)}
    in_bf16 = [errors[n]["running sum in bfloat16"] for n in (4, 64, 256)]
    in_fp32 = [errors[n]["float32, result rounded to bfloat16"] for n in (4, 64, 256)]
    kept = [errors[n]["float32 throughout"] for n in (4, 64, 256)]
    assert in_bf16 == sorted(in_bf16) and in_bf16[-1] > 5 * in_bf16[0]
    # one rounding to bfloat16 at the end: below its unit roundoff 2^-9, whatever the rank count
    assert all(error < 2 ** -9 for error in in_fp32) and in_bf16[1] > 4 * in_fp32[1]
    # without that rounding, float32's own error: far below bfloat16's, within (N-1) x 2^-24
    assert all(error < (n - 1) * 2 ** -24 for n, error in zip((4, 64, 256), kept)) and kept[1] > 0
    assert all(error < 1e-3 * rounded for error, rounded in zip(kept, in_fp32))
    assert collectives_lab.reduction_error(64, numel=4096) == errors[64]  # same bits every time


def test_the_reliability_sign_names_each_size_over_20_percent_slower_than_a_larger_one():
    times = {1024: 1.3, 4096: 1.0, 65536: 1.25, 1048576: 1.1, 4194304: 2.0}
    # 1 KiB: 1.3 > 1.2 x 1.0; 64 KiB: 1.25 <= 1.2 x 1.1 = 1.32; 4 KiB and 1 MiB are the fastest
    assert collectives_lab.slower_than_larger(times) == [1024]
    assert collectives_lab.slower_than_larger(times, slack=1.1) == [1024, 65536]
    assert collectives_lab.slower_than_larger({n: float(n) for n in (1, 2, 4)}) == []  # rising
    assert collectives_lab.slower_than_larger({2: 5.0, 1: 9.0}) == [1]  # order of the keys is not used


def test_the_reliability_sign_line_in_both_editions():
    found = {"ring all_reduce": [4096, 65536], "naive all_reduce": []}
    assert collectives_lab.sign_line(found, "en") == (
        "over 20% slower than a larger size: ring all_reduce at [4096, 65536] bytes")
    persian = collectives_lab.sign_line({"کاهش همگانی حلقه‌ای": [4096, 65536],
                                         "کاهش همگانی gloo": []}, "fa")
    assert persian.startswith("بیش از ۲۰٪ کندتر از اندازه‌ای بزرگ‌تر: ")
    assert "کاهش همگانی حلقه‌ای در ۴٬۰۹۶ و ۶۵٬۵۳۶ بایت" in persian  # grouped as every byte count
    assert persian.endswith("۶۵٬۵۳۶ بایت") and "gloo" not in persian and "[" not in persian


def test_sizes_print_in_kib_and_mib_when_readable_and_in_bytes_otherwise():
    assert [collectives_lab.size_text(n, "en") for n in (4096, 2 ** 20, 12397 * 1024, 100)] == [
        "4 KiB", "1 MiB", "12.1 MiB", "100 B"]
    assert collectives_lab.size_text(9.0 * 2 ** 20 - 1, "fa") == "۹٫۰ MiB"
    assert collectives_lab.crossover_line(12397 * 1024, [], "en", largest=2 ** 24,
                                          readable=True) == (
        "model: ring faster above 12.1 MiB; measured: ring faster at no size")
    assert collectives_lab.sign_line({"ring": [4096, 65536, 2 ** 20]}, "en", readable=True) == (
        "over 20% slower than a larger size: ring at 4 KiB, 64 KiB, 1 MiB")
    line = collectives_lab.ahead_line({4096: 1.0, 2 ** 24: 3.0}, {4096: 2.0, 2 ** 24: 1.0}, 1.2,
                                      "en", readable=True)
    assert line.endswith("1.20x: ring at 4 KiB; naive at 16 MiB")
    persian = collectives_lab.sign_line({"حلقه": [4096, 2 ** 20]}, "fa", readable=True)
    assert "حلقه در ۴ KiB و ۱ MiB" in persian and "بایت" not in persian
    # without readable=True, the lines are as before: sizes in bytes (lesson 76a prints those)
    assert collectives_lab.sign_line({"ring": [4096]}, "en").endswith("ring at [4096] bytes")


@pytest.mark.parametrize("lang", ["en", "fa"])
def test_fit_and_run_agree_only_when_the_ring_was_faster_exactly_above_the_crossover(lang):
    sizes = [4096, 2 ** 20, 2 ** 24]
    agree = collectives_lab.say("fit_agrees", lang)
    assert collectives_lab.fit_agreement_line(2 ** 21, [2 ** 24], sizes, lang) == agree
    assert collectives_lab.fit_agreement_line(math.inf, [], sizes, lang) == agree
    assert collectives_lab.fit_agreement_line(0.0, sizes, sizes, lang) == agree
    # the run of a loaded machine: the fit favours the ring above 12.1 MiB, the run nowhere
    line = collectives_lab.fit_agreement_line(12397 * 1024, [], sizes, lang)
    assert line == collectives_lab.say("fit_disagrees", lang, sizes=collectives_lab.size_text(
        2 ** 24, lang))
    both = collectives_lab.fit_agreement_line(2 ** 21, [4096], sizes, lang)  # wrong on each side
    assert collectives_lab.size_text(4096, lang) in both
    assert collectives_lab.size_text(2 ** 24, lang) in both


def _two_algorithms(naive_ms, shm_ms, sizes=(2 ** 18, 2 ** 20, 2 ** 22)):
    return ([{"algorithm": "naive", "nbytes": n, "seconds": t / 1e3} for n, t in zip(sizes, naive_ms)]
            + [{"algorithm": "shared_memory", "nbytes": n, "seconds": t / 1e3}
               for n, t in zip(sizes, shm_ms)])


@pytest.mark.parametrize("lang", ["en", "fa"])
def test_the_verdict_of_exercise_5_reads_both_outer_gaps_and_the_load(lang):
    book = _two_algorithms([1.0, 2.0, 8.0], [2.4, 2.1, 3.9])  # the book's 2.38 and 2.04
    say = collectives_lab.SAY[lang]
    assert collectives_lab.switch_verdict(book, 1.86, 0.5, 2, lang).startswith(say["agrees"][:6])
    close = _two_algorithms([1.0, 2.3, 8.6], [2.2, 1.7, 10.8])  # naive won at 4 MiB too
    assert collectives_lab.switch_verdict(close, 1.86, 0.5, 2, lang).startswith(say["undecided"][:6])
    assert collectives_lab.switch_verdict(book, 1.86, 2.9, 2, lang).startswith(say["undecided"][:6])
    below = _two_algorithms([4.0, 8.0, 32.0], [1.0, 2.0, 8.0])  # shared memory won everywhere
    assert collectives_lab.switch_verdict(below, 1.86, 0.5, 2, lang).startswith(say["differs"][:6])


@pytest.mark.parametrize("lang", ["en", "fa"])
def test_an_undecided_verdict_names_the_reason_that_applied(lang):
    load, gap, clear = (collectives_lab.SAY[lang][key].split(":")[0] + ":"  # "load:", ...
                        for key in ("undecided_load", "undecided_gap", "gaps_clear"))
    book = _two_algorithms([1.0, 2.0, 8.0], [2.4, 2.1, 3.9])  # both gaps over 1.86
    loaded = collectives_lab.switch_verdict(book, 1.86, 8.64, 2, lang)
    assert load in loaded and clear in loaded and gap not in loaded
    close = _two_algorithms([1.0, 2.3, 8.6], [2.2, 1.7, 10.8])  # naive won at 4 MiB too
    quiet = collectives_lab.switch_verdict(close, 1.86, 0.5, 2, lang)
    assert gap in quiet and load not in quiet
    named, unnamed = ("4,194,304", "262") if lang == "en" else ("۴٬۱۹۴٬۳۰۴", "۲۶۲")
    assert named in quiet and unnamed not in quiet  # only the size whose gap was close


@pytest.mark.parametrize("lang", ["en", "fa"])
def test_the_load_line_warns_from_the_core_count_on(lang):
    say = collectives_lab.SAY[lang]
    warning = say["load_high"].split("{")[0]
    assert collectives_lab.load_line(10.61, 2, lang).startswith(warning)
    assert collectives_lab.load_line(2.0, 2, lang).startswith(warning)  # as loaded as the cores
    idle = collectives_lab.load_line(1.3, 2, lang)
    assert idle.startswith(say["load_low"].split("{")[0]) and "stored" not in idle
    assert collectives_lab.load_line(10.61, 2, "en") == (
        "load 10.61 on 2 cores at the start: these times describe a loaded machine; "
        "compare with the stored run only below 2")
    assert "۱۰٫۶۱" in collectives_lab.load_line(10.61, 2, "fa")  # Persian digits
    # one «با» in the advice: «فقط با بارِ زیر ۲ با اجرای …» read as two comparisons
    assert collectives_lab.load_line(10.61, 2, "fa").endswith(
        "فقط وقتی بار زیر ۲ است با اجرای ذخیره‌شده مقایسه کنید")


def test_the_printed_lines_leave_out_a_group_with_no_size():
    ring, naive = {4096: 1.0, 2 ** 20: 1.0}, {4096: 1.0, 2 ** 20: 1.0}  # neither is ahead
    assert collectives_lab.ahead_line(ring, naive, 1.2, "en", readable=True) == (
        "faster by more than the largest inversion, 1.20x: neither at 4 KiB, 1 MiB")
    persian = collectives_lab.ahead_line(ring, naive, 1.2, "fa", readable=True)
    assert persian.endswith("برابر: هیچ‌یک در ۴ KiB و ۱ MiB")
    assert collectives_lab.sign_line({"ring": [], "naive": []}, "en") == (
        "over 20% slower than a larger size: none")
    assert collectives_lab.sign_line({"حلقه": [], "ساده": []}, "fa").endswith(": هیچ")
    assert collectives_lab.crossover_line(math.inf, [], "en") == (
        "model: ring never faster (its fitted cost per byte is the higher); "
        "measured: ring faster at no size")


def test_halving_steps_record_the_listed_halving_rank_by_rank():
    on_8 = collectives_lab.halving_steps(8)
    assert on_8[0] == {"step 1": "4: 0–3", "step 2": "2: 0–1", "step 3": "1: 0"}
    assert on_8[6] == {"step 1": "2: 4–7", "step 2": "4: 6–7", "step 3": "7: 6"}
    for rank, steps in enumerate(on_8):  # the partner's distance halves, 4, 2, 1
        partners = [int(entry.split(":")[0]) for entry in steps.values()]
        assert partners == [rank ^ 4, rank ^ 2, rank ^ 1]
        assert steps["step 3"].endswith(f": {rank}")  # rank r ends with chunk r
    assert collectives_lab.halving_steps(2) == [{"step 1": "1: 0"}, {"step 1": "0: 1"}]
    for world_size in (1, 6):  # the fold is not the halving's: powers of two only
        with pytest.raises(ValueError):
            collectives_lab.halving_steps(world_size)

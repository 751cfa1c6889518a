"""Every figure of the book draws from data shaped like what its lesson measures, in both languages.

The notebooks draw these from real runs; here each figure function gets small data of the same
shape, so a change to the plotting code that breaks a figure fails here, in seconds.
"""

import matplotlib
import matplotlib.text

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from lesson_code.capstone.crash import CrashAndResume  # noqa: E402
from lesson_code.collectives import choose  # noqa: E402
from lesson_code.collectives.cost_model import AlphaBeta  # noqa: E402
from lesson_code import memory, plots  # noqa: E402
from lesson_code.plots import capstone, checkpoint, collectives, ddp, pipeline, zero  # noqa: E402

ROWS76 = [{"op": op, "nbytes": n, "seconds": 1e-4 + n * 1e-9, "repeats": 1}
          for op in ("ring all_reduce", "gloo all_reduce", "naive all_reduce")
          for n in (1024, 65536, 2 ** 20)]
TIMELINE = {"forward": (0.0, 0.001), "backward": (0.001, 0.003), "wait": (0.003, 0.0035),
            "buckets": [{"bucket": 0, "ready": 0.002, "start": 0.002, "end": 0.0025},
                        {"bucket": 1, "ready": 0.003, "start": 0.003, "end": 0.0034}]}
# overlap_model's answers for two bucket caps (MiB): one bucket, and two.
MODELS = {32: {"backward_s": 0.003, "exposed_s": 0.001, "buckets": [
               {"bytes": 8, "ready": 0.003, "start": 0.003, "end": 0.004}]},
          0.5: {"backward_s": 0.003, "exposed_s": 0.0, "buckets": [
               {"bytes": 4, "ready": 0.001, "start": 0.001, "end": 0.002},
               {"bytes": 4, "ready": 0.002, "start": 0.002, "end": 0.003}]}}
# Two variants of the stored benchmark's table (milliseconds; torch DDP keeps no wait).
PHASES = pd.DataFrame([
    {"wrapper": "naive", "comm": "ring", "bucket_mb": float("nan"), "forward_ms": 1.0,
     "backward_ms": 2.0, "wait_ms": 0.5, "check_ms": 0.1, "optimizer_ms": 0.1,
     "step_low_ms": 3.5, "step_high_ms": 4.0},
    {"wrapper": "torch", "comm": "builtin", "bucket_mb": 4.0, "forward_ms": 1.0,
     "backward_ms": 2.5, "wait_ms": float("nan"), "check_ms": float("nan"),
     "optimizer_ms": 0.1, "step_low_ms": 3.4, "step_high_ms": 3.9}])
EVENTS = [(stage, micro, kind, start, start + 0.001)  # (stage, micro-batch, F/B, start, end)
          for stage in range(2) for micro in range(2) for kind in "FB"
          for start in [0.001 * (stage + micro + (2 if kind == "B" else 0))]]
MEMORY = [{"rank": r, "parameters": 100, "gradients": 100, "optimizer": 300} for r in range(2)]
SAVES = [{"rank": r, "events": [("write", "shard", 0.001 * r, 0.002 + 0.001 * r),
                                 ("fsync", "", 0.0015 + 0.001 * r, 0.002 + 0.001 * r),
                                 ("rename", "shard", 0.002 + 0.001 * r, 0.002 + 0.001 * r)]
          + ([("publish", "step-00000001", 0.006, 0.006)] if r == 0 else [])} for r in range(2)]
LAYOUTS = [[{"rank": r, "start": 4 * r, "length": 4, "padding": 2 if r == 1 else 0} for r in range(2)],
           [{"rank": r, "start": 2 * r, "length": 2, "padding": 0} for r in range(3)]]
CAPSTONE = [{"rank": r, "memory": {"parameters": 100, "gradients": 100, "optimizer": 300},
             "numel": 50, "padding": 0} for r in range(2)]
CURVE = [{"step": s, "loss": 4.0 - 0.1 * s} for s in range(1, 7)]
CRASH = CrashAndResume(killed=CURVE[:5], continued=CURVE, uninterrupted=CURVE, crash_step=5,
                       resume_step=4, restarted_steps=1, seconds={}, same_losses=True,
                       same_checkpoint=True, report="")
UNITS78A = [("embed", 10), ("blocks.0", 20), ("head", 6)]
STAGE3 = {"units": [name for name, _ in UNITS78A], "memory": [(0.0, 100), (5.0, 180), (12.0, 90)],
          "events": [{"unit": unit, "pass": when, "action": action, "start_ms": 0.25 * i,
                      "end_ms": 0.25 * (i + 1)}
                     for i, (unit, when, action) in enumerate(
                         [(u, "forward", a) for u, _ in UNITS78A for a in ("gather", "compute", "free")]
                         + [(u, "backward", a) for u, _ in UNITS78A[::-1]
                            for a in ("gather", "compute", "reduce-scatter", "free")])]}
FIGURES = {
    "ring schedule": lambda lang: collectives.ring_schedule_figure(3, lang=lang),
    "bandwidth": lambda lang: collectives.bandwidth_figure(ROWS76, 4, lang=lang),
    "alpha-beta": lambda lang: collectives.alpha_beta_figure(
        ROWS76, {"ring all_reduce": AlphaBeta(1e-4, 1e-9)}, 4, lang=lang),
    "algorithms": lambda lang: collectives.algorithms_figure(
        choose.stored_times(), choose.stored_costs(), 4, lang=lang,
        switches=choose.predicted_switches(choose.stored_costs(), 4)),
    "modelled algorithms": lambda lang: collectives.modelled_algorithms_figure(
        choose.AlgorithmCosts(fits={"ring": AlphaBeta(5e-6, 4e-11),
                                    "halving_doubling": AlphaBeta(5e-6, 4e-11)}, source="model"),
        48, [2 ** k for k in range(10, 31)], lang=lang,
        switches=[(5178948, "halving_doubling", "ring")]),
    "busiest rank": lambda lang: collectives.busiest_rank_figure(
        {2: {"ring": 2.0, "naive": 2.0}, 4: {"ring": 3.0, "naive": 6.0}}, lang=lang),
    "overlap": lambda lang: ddp.overlap_timeline_figure([TIMELINE, TIMELINE], lang=lang),
    "phases": lambda lang: ddp.phase_breakdown_figure(PHASES, lang=lang),
    "bucket sizes": lambda lang: ddp.bucket_size_timelines_figure(MODELS, lang=lang),
    "stages": lambda lang: zero.stages_figure(7.5e9, [2, 4, 8], lang=lang),
    "zero memory": lambda lang: zero.measured_memory_figure(MEMORY, MEMORY, 25, lang=lang),
    "stage 3 timeline": lambda lang: zero.stage3_timeline_figure(
        STAGE3, memory.stage3_step(UNITS78A, 2), lang=lang),
    "layer overlap": lambda lang: zero.layer_overlap_figure(35.8, 4.1, 8.1, 856e6, lang=lang),
    "four moves": lambda lang: zero.four_moves_figure(4, lang=lang),
    "shard cuts": lambda lang: zero.shard_cuts_figure({"W1": 20, "b1": 1, "W2": 9}, 4, lang=lang),
    "gantt": lambda lang: pipeline.gantt_figure({"GPipe": EVENTS, "1F1B": EVENTS}, lang=lang),
    "rank gantt": lambda lang: pipeline.rank_gantt_figure(
        {"1F1B": [(0, 0, "F", 0, 0.0, 1.0), (1, 1, "F", 0, 1.0, 2.0), (1, 1, "B", 0, 2.0, 4.0),
                  (0, 0, "B", 0, 4.0, 6.0)],
         "ZBV": [(0, 0, "F", 0, 0.0, 0.5), (0, 3, "I", 0, 0.5, 1.0), (0, 3, "W", 0, 1.0, 1.5)]},
        lang=lang),
    "bubble": lambda lang: pipeline.bubble_figure({2: {1: 0.5, 4: 0.2}}, lang=lang,
                                                  floors={2: {1: 0.05, 4: 0.02}},
                                                  ranges={2: {1: (0.49, 0.52), 4: (0.15, 0.25)}}),
    "save timeline": lambda lang: checkpoint.save_timeline_figure(SAVES, lang=lang),
    "reshard layout": lambda lang: checkpoint.reshard_layout_figure(LAYOUTS, 6, lang=lang),
    "folder states": lambda lang: checkpoint.folder_states_figure(lang=lang),
    "save modes": lambda lang: checkpoint.save_modes_figure(20.5, 0.33, lang=lang),
    "loss": lambda lang: capstone.loss_curve_figure(
        [{"step": 1, "loss": 4.0}, {"step": 2, "loss": 3.0},
         {"event": "rollback", "to_step": 1}], lang=lang),
    "loss with a rejected step": lambda lang: capstone.loss_curve_figure(
        [{"step": 1, "loss": 4.0}, {"step": 2, "loss": 3.0}, {"step": 2, "loss": 3.0},
         {"event": "rollback", "to_step": 1, "at_step": 3, "loss": 129.0}], lang=lang),
    "capstone memory": lambda lang: capstone.memory_profile_figure(CAPSTONE, lang=lang),
    "crash and resume": lambda lang: capstone.crash_figure(CRASH, lang=lang),
    "young": lambda lang: capstone.young_figure(11135.0, (30, 5), lang=lang),
}


@pytest.mark.parametrize("lang", ["en", "fa"])
@pytest.mark.parametrize("name", sorted(FIGURES))
def test_each_figure_draws_with_its_labels(name, lang):
    figure = FIGURES[name](lang)
    try:
        texts = [t.get_text() for ax in figure.axes for t in
                 (ax.xaxis.label, ax.yaxis.label, ax.title)] + \
                [t.get_text() for t in figure.texts] + \
                [t.get_text() for ax in figure.axes for t in ax.get_xticklabels()]
        words = " ".join(texts)
        assert figure.axes and words.strip(), name
        persian = any("\u0600" <= ch <= "\u06ff" for ch in words)
        assert persian == (lang == "fa"), (name, lang, words[:200])
        figure.canvas.draw()  # lays out every artist: fails on bad data shapes
    finally:
        plt.close(figure)


def test_the_modelled_figure_names_its_one_model_and_measures_nothing():
    figure = FIGURES["modelled algorithms"]("en")
    try:
        assert figure.axes[0].get_title() == \
            "the model on 48 ranks, α = 5 µs, 1/β = 25 GB/s: nothing measured"
        # every other size from the first, as on the measured figure beside it (not 2^9, 2^12, ...)
        assert list(figure.axes[0].get_xticks()) == [2 ** k for k in range(10, 31, 2)]
    finally:
        plt.close(figure)


@pytest.mark.parametrize("lang", ["en", "fa"])
def test_the_modelled_figures_size_labels_do_not_run_together(lang):
    figure = FIGURES["modelled algorithms"](lang)
    try:
        figure.canvas.draw()  # the Persian labels ("۶۴ KiB") are made when drawn
        renderer = figure.canvas.get_renderer()
        labels = [label for label in figure.axes[0].get_xticklabels() if label.get_text()]
        boxes = sorted((label.get_window_extent(renderer) for label in labels),
                       key=lambda box: box.x0)
        space = labels[0].get_fontsize() * figure.dpi / 72 / 2  # half a letter's height, pixels
        assert len(boxes) >= 5
        assert all(right.x0 - left.x1 > space for left, right in zip(boxes, boxes[1:]))
    finally:
        plt.close(figure)


def test_an_unknown_language_is_named():
    with pytest.raises(ValueError, match="unknown language 'de'"):
        collectives.busiest_rank_figure({2: {"ring": 1.0, "naive": 1.0}}, lang="de")


PHONE_WIDTH_PX = 360  # the book's column on a phone, in CSS pixels: a figure is scaled to it
SMALLEST_PX = 8  # the smallest word a reader can make out there without zooming


def shown_texts(figure):
    """Every piece of text the drawn figure shows."""
    return [t for t in figure.findobj(matplotlib.text.Text)
            if t.get_visible() and str(t.get_text()).strip() and t.figure is not None]


@pytest.mark.parametrize("lang", ["en", "fa"])
@pytest.mark.parametrize("name", sorted(FIGURES))
def test_every_word_is_legible_on_a_phone(name, lang):
    """Scaled to a phone's column, no label, tick or legend entry is smaller than 8 pixels."""
    figure = FIGURES[name](lang)
    try:
        renderer = figure.canvas.get_renderer()
        figure.canvas.draw()
        width_pt = figure.get_tightbbox(renderer).width * 72  # what bbox_inches="tight" keeps
        smallest = min(shown_texts(figure), key=lambda t: t.get_fontsize())
        shown_px = smallest.get_fontsize() * PHONE_WIDTH_PX / width_pt
        assert shown_px >= SMALLEST_PX, (name, lang, smallest.get_text(), round(shown_px, 1))
    finally:
        plt.close(figure)


@pytest.mark.parametrize("name", sorted(FIGURES))
def test_persian_figures_have_persian_digits_and_read_right_to_left(name):
    """Drawn in Persian, a number stands in Persian digits (names such as ZeRO-1 keep theirs, and
    so does a formula such as 12P, written as the prose and the legend's 12P/N write it),
    and every label with Persian words starts right to left, also one that begins with a Latin
    word, so its words read in order."""
    figure = FIGURES[name]("fa")
    try:
        figure.canvas.draw()
        for text in shown_texts(figure):
            words = str(text.get_text())
            assert plots.persian_text(words) == words, (name, words)
            if plots.PERSIAN_LETTER.search(words):
                assert words.startswith(plots.RIGHT_TO_LEFT_MARK), (name, words)
        ticks = " ".join(str(t.get_text()) for ax in figure.axes
                         for t in ax.get_xticklabels() + ax.get_yticklabels())
        named = ticks.replace("ZeRO-1", "").replace("DDP (12P)", "")
        assert not any(ch.isascii() and ch.isdigit() for ch in named), \
            (name, ticks)
    finally:
        plt.close(figure)


def test_notebooks_show_figures_as_svg_with_words_as_paths():
    """Inside IPython the course style makes the inline backend show SVG, without a date and with
    fixed ids (so a re-run stores the same output), its words drawn as paths (no web font)."""
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    try:
        figure = FIGURES["busiest rank"]("fa")
        formats = shell.display_formatter.format(figure)[0]
        assert "image/svg+xml" in formats and "image/png" not in formats
        svg = formats["image/svg+xml"]
        assert "<text" not in svg and "<dc:date>" not in svg
        again = shell.display_formatter.format(FIGURES["busiest rank"]("fa"))[0]["image/svg+xml"]
        assert again == svg
    finally:
        plt.close("all")
        InteractiveShell.clear_instance()


def test_gantt_panels_share_one_time_axis_and_title_their_step_and_bubble():
    # Two steps of different lengths must draw at one scale: the longer step's bars end further
    # right, and each title says how long its step lasted and how much of it sat idle.
    from lesson_code.pipeline import ideal_timeline
    short = ideal_timeline("gpipe", 2, 2)                      # 9 slots: 3 + (2 + 1) * 2
    long = ideal_timeline("1f1b", 2, 2, forward=2.0, backward=4.0)  # the same step, twice as long
    figure = pipeline.gantt_figure({"short": short, "long": long}, slots=True)
    try:
        top, bottom = figure.axes[:2]
        assert top.get_xlim() == bottom.get_xlim()
        assert [ax.get_title() for ax in (top, bottom)] == [
            "short: a step of 9 slots, bubble 0.33", "long: a step of 18 slots, bubble 0.33"]
        persian = pipeline.gantt_figure({"short": short}, lang="fa", slots=True).axes[0].get_title()
        assert "۹" in persian and "۰٫۳۳" in persian
        # Two decimals always, so that 0.398 beside 0.44 reads 0.40, not 0.4.
        tenth = ideal_timeline("gpipe", 2, 9)  # bubble 1 / 10
        english, persian = [pipeline.gantt_figure({"tenth": tenth}, lang=lang, slots=True).axes[0].get_title()
                            for lang in ("en", "fa")]
        assert english == "tenth: a step of 30 slots, bubble 0.10" and persian.endswith("حباب ۰٫۱۰")
        # A step of 34.5 slots must not read 34: 1 - 24/34 is not the bubble the title gives.
        half = ideal_timeline("gpipe", 4, 8, message=0.25)
        english, persian = [pipeline.gantt_figure({"half": half}, lang=lang, slots=True).axes[0].get_title()
                            for lang in ("en", "fa")]
        assert english == "half: a step of 34.5 slots, bubble 0.30" and "۳۴٫۵" in persian
    finally:
        plt.close("all")


def test_gantt_axis_says_a_slot_is_one_blocks_forward_when_stages_differ():
    # Stages of 4 and 2 blocks draw forwards of 4 and 2 slots: the axis must not say that a
    # forward takes 1.
    from lesson_code.pipeline import ideal_timeline
    events = ideal_timeline("gpipe", 2, 2, [4, 2], [8, 4])
    try:
        labels = {lang: pipeline.gantt_figure({"x": events}, lang=lang, slots=True, per_block=True)
                  .axes[0].get_xlabel() for lang in ("en", "fa")}
        assert labels["en"] == "time (slots: one block's forward takes 1, its backward 2)"
        assert "بلوک" in labels["fa"]
        plain = pipeline.gantt_figure({"x": events}, slots=True).axes[0].get_xlabel()
        assert plain == "time (slots: a forward takes 1, a backward 2)"
    finally:
        plt.close("all")


def test_the_loss_curve_legend_names_the_curve_and_the_checkpoint_rolled_back_to():
    rows = [{"step": 1, "loss": 4.0}, {"step": 2, "loss": 3.0},
            {"event": "rollback", "to_step": 1, "at_step": 3, "loss": 129.0}]
    for lang, expected in (("en", ["loss, each step's last pass", "checkpoint rolled back to (step 1)"]),
                           ("fa", ["زیان، آخرین نوبت اجرای هر گام", "چکپوینتی که اجرا به آن بازگشت (گام ۱)"])):
        figure = capstone.loss_curve_figure(rows, lang=lang)
        try:
            texts = [t.get_text().lstrip("\u200f") for t in figure.axes[0].get_legend().get_texts()]
            assert texts[:2] == expected, texts
        finally:
            plt.close(figure)


def test_the_persian_loss_curve_says_a_steps_run_not_a_forward_or_backward_pass():
    # «گذر» is the course's word for a forward or backward pass; a step trained twice is run twice.
    assert [key for key in ("trained", "first_pass") if "گذر" in capstone.LABELS["fa"][key]] == []


def test_the_loss_curve_draws_a_replayed_steps_first_pass_beside_its_replay():
    rows = [{"step": 1, "loss": 4.0}, {"step": 2, "loss": 3.0}, {"step": 3, "loss": 2.5},
            {"event": "rollback", "to_step": 1, "at_step": 4, "loss": 129.0},
            {"step": 2, "loss": 3.0}, {"step": 3, "loss": 2.5}, {"step": 4, "loss": 2.2}]
    figure = capstone.loss_curve_figure(rows)
    try:
        lines = {line.get_label(): line for line in figure.axes[0].get_lines()}
        assert list(lines["loss, each step's last pass"].get_xdata()) == [1, 2, 3, 4]
        first = lines["first pass, undone by the rollback (shifted right)"]
        assert list(first.get_xdata()) == [2.25, 3.25] and list(first.get_ydata()) == [3.0, 2.5]
        assert first.get_markerfacecolor() == "none"
    finally:
        plt.close(figure)


def test_the_loss_curve_legend_lies_under_the_axes_and_covers_no_data():
    rows = [{"step": 1, "loss": 4.0}, {"step": 2, "loss": 3.0},
            {"event": "rollback", "to_step": 1, "at_step": 3, "loss": 129.0}]
    figure = capstone.loss_curve_figure(rows)
    try:
        figure.canvas.draw()
        renderer = figure.canvas.get_renderer()
        ax = figure.axes[0]
        box, axes_box = ax.get_legend().get_window_extent(renderer), ax.get_window_extent(renderer)
        assert box.y1 < axes_box.y0, (box, axes_box)  # wholly under the plot area
        assert box.y0 >= 0  # and still on the figure
    finally:
        plt.close(figure)


def test_the_loss_curve_ticks_whole_steps():
    rows = [{"step": step, "loss": 4.0 - step / 10} for step in range(1, 21)]
    figure = capstone.loss_curve_figure(rows)
    try:
        figure.canvas.draw()
        ticks = [tick for tick in figure.axes[0].get_xticks() if 1 <= tick <= 20]
        assert ticks and all(float(tick).is_integer() for tick in ticks), ticks
    finally:
        plt.close(figure)


@pytest.mark.parametrize("name", sorted(FIGURES))
def test_persian_labels_keep_each_parenthesis_pair_on_one_side_of_an_isolate(name):
    """A parenthesis is drawn mirrored right to left and as written inside a left-to-right
    isolate: a pair split by an isolate's edge shows as «)...)». So every isolate, and the text
    outside the isolates, holds whole pairs («زمان (ms)» isolates «(ms)» whole)."""
    figure = FIGURES[name]("fa")
    try:
        figure.canvas.draw()
        for text in shown_texts(figure):
            words = str(text.get_text())
            for piece in plots.ISOLATED.split(words):
                assert piece.count("(") == piece.count(")"), (name, words, piece)
    finally:
        plt.close(figure)


@pytest.mark.parametrize("lang", ["en", "fa"])
def test_a_modelled_timeline_says_it_is_a_model(lang):
    """Lesson 77 draws overlap_model's timeline beside a measured one: its title, lane and link
    say it is modelled, and the measured figure's words for them do not appear."""
    modelled = {key: TIMELINE[key] for key in ("backward", "wait", "buckets")}
    words = {text.get_text().removeprefix(plots.RIGHT_TO_LEFT_MARK) for text in
             ddp.overlap_timeline_figure([modelled], lang=lang, modelled=True).findobj(matplotlib.text.Text)}
    labels = ddp.LABELS[lang]
    assert {labels["modelled"], labels["modelled rank"], labels["comm model"]} <= words
    assert labels["comm"] not in words and labels["forward"] not in words
    plt.close("all")


def test_bucket_size_timelines_name_each_lane_by_its_cap():
    """Lesson 77a draws overlap_model at several bucket caps: one lane per cap, named by it, each
    with its backward, its exposed wait (none where the buckets end with the backward) and one
    all-reduce bar per bucket."""
    figure = ddp.bucket_size_timelines_figure(MODELS, lang="en")
    ax = figure.axes[0]
    # the 32 MiB cap holds both gradients: one bucket, named as such, not as "32 MiB buckets"
    assert [tick.get_text() for tick in ax.get_yticklabels()] == ["one bucket (32 MiB cap)", "0.5 MiB buckets"]
    assert ax.get_title() == ddp.LABELS["en"]["modelled"]
    assert ax.get_xlabel() == ddp.LABELS["en"]["time model"]
    widths = sorted(round(bar.get_width(), 6) for bar in ax.patches)
    assert widths == [0.0, 1.0, 1.0, 1.0, 1.0, 3.0, 3.0]  # ms: 2 backwards, 2 waits, 3 buckets
    plt.close("all")


def test_the_ring_figure_marks_complete_chunks_with_a_sum_sign():
    """Only partial sums name their ranks: a complete chunk's four digits overflow its cell."""
    fig = collectives.ring_schedule_figure(4, lang="en")
    cells = [[t.get_text() for t in ax.texts] for ax in fig.axes]
    assert cells[2].count("Σ") == 4  # after the reduce-scatter: the diagonal is complete
    assert cells[-1] == ["Σ"] * 16  # after the all-gather: every chunk on every rank
    assert not any("0123" in text for panel in cells for text in panel)
    plt.close(fig)


def test_the_capstone_memory_figure_ends_with_a_ddp_bar_of_12p_optimizer_state():
    """Beside the ranks' ZeRO-1 bars, one bar for DDP with a master copy and Adam: the same
    parameters and gradients over 12P bytes of optimizer state, N times a rank's 12P/N."""
    figure = capstone.memory_profile_figure(CAPSTONE)
    try:
        ax = figure.axes[0]
        assert [t.get_text() for t in ax.get_xticklabels()] == ["rank 0", "rank 1", "DDP (12P)"]
        bottom_segments = ax.containers[0]  # optimizer state, one bar per column
        assert [bar.get_height() for bar in bottom_segments] == [300, 300, 12 * 50]
    finally:
        plt.close(figure)


@pytest.mark.parametrize("lang", ["en", "fa"])
def test_the_stage3_timeline_numbers_each_block_in_both_lanes_and_leaves_frees_out_of_its_legend(lang):
    """Each block's forward and backward spans carry its number (the blocks are named in both
    lanes, not above one); frees, too short to see, have no legend entry."""
    figure = zero.stage3_timeline_figure(STAGE3, memory.stage3_step(UNITS78A, 2), lang=lang)
    try:
        lanes = figure.axes[1]
        marks = sorted((t.get_text(), t.get_position()[1]) for t in lanes.texts)
        assert marks == [(plots.number(0, lang), 0), (plots.number(0, lang), 1)]  # blocks.0, both lanes
        legend = [t.get_text() for t in figure.legends[0].get_texts()]
        assert zero.TIMELINE_LABELS[lang]["free"] not in legend
    finally:
        plt.close(figure)


def test_the_young_figure_draws_its_two_terms_crossing_at_youngs_interval():
    """Under the time-lost curve, the saves' C/T and the lost half-intervals T/2M are drawn; they
    cross at the marked minimum, where each is half the time lost."""
    from lesson_code.checkpoint.tools import young_interval
    figure = capstone.young_figure(11135.0, (30,))
    try:
        ax = figure.axes[0]
        total, saves, redone = ax.lines[:3]
        assert (saves.get_linestyle(), redone.get_linestyle()) == ("--", ":")
        gaps = [abs(a - b) for a, b in zip(saves.get_ydata(), redone.get_ydata())]
        crossing = saves.get_xdata()[gaps.index(min(gaps))]
        assert abs(crossing - young_interval(30, 11135.0) / 60) <= 0.25
        at = list(total.get_xdata()).index(crossing)
        assert abs(saves.get_ydata()[at] + redone.get_ydata()[at] - total.get_ydata()[at]) < 1e-9
    finally:
        plt.close(figure)


def test_the_save_timeline_draws_fsyncs_thinner_and_names_rank_0s_files_at_three_heights():
    """An fsync mostly spans its file's write, so its bar is drawn thinner than the write's; rank
    0's names of three short files in a row, 70 ms into the save, take three heights."""
    files = ["replicated.pt", "manifest.json", "manifest.sha256"]
    events = [("write", name, 0.07 + 0.001 * i, 0.07 + 0.001 * i + 0.0009)
              for i, name in enumerate(files)]
    events += [("fsync", "", 0.07 + 0.001 * i + 0.0001, 0.07 + 0.001 * i + 0.0008) for i in range(3)]
    events += [("publish", "step-00000001", 0.073, 0.073)]
    figure = checkpoint.save_timeline_figure([{"rank": 0, "events": events}], lang="en")
    try:
        ax = figure.axes[0]
        heights = {round(bar.get_height(), 2) for bar in ax.patches}
        assert len(heights) == 2 and min(heights) < max(heights) / 2
        named = [t for t in ax.texts if t.get_text()]
        assert len(named) == 3 and len({t.get_position()[1] for t in named}) == 3
    finally:
        plt.close(figure)


def test_the_loss_curve_labels_every_other_step_of_a_20_step_run():
    rows = [{"step": step, "loss": 4.0 - step / 10} for step in range(1, 21)]
    figure = capstone.loss_curve_figure(rows)
    try:
        ticks = [tick for tick in figure.axes[0].get_xticks() if 1 <= tick <= 20]
        assert ticks == list(range(2, 21, 2)), ticks  # steps 10 and 14 of the spike run are labelled
    finally:
        plt.close(figure)


def test_the_memory_figure_names_its_ddp_baseline_12p():
    for lang, expected in (("en", "DDP (12P)"), ("fa", "DDP (12P)")):  # a formula: Latin digits, as in 12P/N
        figure = capstone.memory_profile_figure(CAPSTONE, lang=lang)
        try:
            assert figure.axes[0].get_xticklabels()[-1].get_text().lstrip("\u200f") == expected
        finally:
            plt.close(figure)

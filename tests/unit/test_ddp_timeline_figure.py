"""Lesson 77's measured timeline: each bucket's ready tick carries its number and neighbouring
buckets' all-reduces alternate two shades, so that a tick can be matched with its all-reduce;
the modelled timelines (lesson 77's companion page) keep one shade and no numbers."""

import matplotlib
import pytest
from matplotlib.colors import to_hex
from matplotlib.text import Text

from lesson_code.plots import ddp

TIMELINE = {"forward": (0.0, 0.1), "backward": (0.1, 0.5), "wait": (0.5, 0.6),
            "buckets": [{"bucket": k, "ready": 0.2 + 0.1 * k, "start": 0.2 + 0.1 * k,
                         "end": 0.28 + 0.1 * k} for k in range(4)]}


def bucket_shades(figure) -> set[str]:
    ax = figure.axes[0]
    return {to_hex(patch.get_facecolor()) for patch in ax.patches} & {
        ddp.COLOURS["comm"], ddp.COLOURS["comm odd"]}


@pytest.mark.parametrize("lang, numbers", [("en", ["1", "2", "3", "4"]), ("fa", ["۱", "۲", "۳", "۴"])])
def test_the_measured_timeline_numbers_its_ticks_and_alternates_shades(lang, numbers):
    figure = ddp.overlap_timeline_figure([TIMELINE, TIMELINE], lang=lang)
    texts = [t.get_text() for t in figure.axes[0].texts]
    assert sorted(texts) == sorted(numbers * 2)
    assert bucket_shades(figure) == {ddp.COLOURS["comm"], ddp.COLOURS["comm odd"]}
    matplotlib.pyplot.close(figure)


def test_the_modelled_timeline_keeps_one_shade_and_no_numbers():
    modelled = {key: TIMELINE[key] for key in ("backward", "wait", "buckets")}
    figure = ddp.overlap_timeline_figure([modelled], lang="en", modelled=True)
    assert list(figure.axes[0].texts) == [] and bucket_shades(figure) == {ddp.COLOURS["comm"]}
    matplotlib.pyplot.close(figure)


@pytest.mark.parametrize("lang", ["en", "fa"])
def test_the_measured_legend_names_both_shades(lang):
    figure = ddp.overlap_timeline_figure([TIMELINE, TIMELINE], lang=lang)
    handles, names = figure.axes[0].get_legend_handles_labels()
    shades = {name.lstrip("\u200f"): to_hex(handle.patches[0].get_facecolor())
              for handle, name in zip(handles, names)
              if "…" in name}
    assert shades == {ddp.LABELS[lang]["comm odd"]: ddp.COLOURS["comm"],
                      ddp.LABELS[lang]["comm even"]: ddp.COLOURS["comm odd"]}
    matplotlib.pyplot.close(figure)


def test_queued_buckets_that_overlap_in_time_keep_apart_between_the_bars():
    """Five buckets ready at once and started one after another: five grey queue lines over the
    same time, each at its own height, all in the gap between the all-reduce bars (y - 0.4 to
    y + 0.4) and the compute bars (y + 0.6 to y + 1.4)."""
    queued = {"forward": (0.0, 0.1), "backward": (0.1, 0.5), "wait": (0.5, 0.9),
              "buckets": [{"bucket": k, "ready": 0.45, "start": 0.5 + 0.08 * k,
                           "end": 0.58 + 0.08 * k} for k in range(5)]}
    figure = ddp.overlap_timeline_figure([queued], lang="en")
    heights = [line.get_ydata()[0] for line in figure.axes[0].lines if len(line.get_xdata()) == 2]
    assert len(heights) == 5 and len(set(heights)) == 5
    assert all(0.4 < height < 0.6 for height in heights)
    matplotlib.pyplot.close(figure)


def test_the_measured_bucket_numbers_stand_clear_of_their_ticks():
    figure = ddp.overlap_timeline_figure([TIMELINE, TIMELINE], lang="fa")
    assert all(text.xyann[0] >= 4 for text in figure.axes[0].texts)  # points right of the tick
    matplotlib.pyplot.close(figure)


@pytest.mark.parametrize("lang, shown", [("en", "1,500"), ("fa", "۱٬۵۰۰")])
def test_the_benchmark_figure_groups_the_thousands_of_its_ticks(lang, shown):
    import pandas as pd

    row = {"comm": "ring", "bucket_mb": float("nan"), "forward_ms": 500.0, "backward_ms": 900.0,
           "wait_ms": 500.0, "check_ms": 10.0, "optimizer_ms": 10.0, "step_low_ms": 1900.0,
           "step_high_ms": 2000.0}
    figure = ddp.phase_breakdown_figure(pd.DataFrame([{**row, "wrapper": "naive"},
                                                      {**row, "wrapper": "bucketed"}]), lang=lang)
    figure.canvas.draw()
    ticks = [tick.get_text() for tick in figure.axes[0].get_yticklabels()]
    assert shown in ticks, ticks
    matplotlib.pyplot.close(figure)


def test_the_persian_figures_of_lesson_77_say_milliseconds_alike():
    # The measured timeline's time axis and the benchmark figure's axis share one unit word.
    word = "میلی‌ثانیه"
    assert word in ddp.LABELS["fa"]["time"] and word in ddp.LABELS["fa"]["ms"]
    figure = ddp.overlap_timeline_figure([TIMELINE], lang="fa")
    assert word in figure.axes[0].get_xlabel() and "(ms)" not in figure.axes[0].get_xlabel()
    matplotlib.pyplot.close(figure)


@pytest.mark.parametrize("lang", ["en", "fa"])
def test_close_ticks_keep_their_numbers_apart_and_in_order(lang):
    # As on a rank whose buckets all became ready at the end of its backward: four ticks within
    # 20 ms on a 1.7 s axis. Numbers at one height (above or below the lane) must not overlap,
    # and all read 1 to 4 left to right.
    crowded = {"forward": (0.0, 0.8), "backward": (0.8, 1.65), "wait": (1.65, 1.7),
               "buckets": [{"bucket": k, "ready": ready, "start": ready, "end": ready + 0.01}
                           for k, ready in enumerate([1.600, 1.610, 1.615, 1.620])]}
    figure = ddp.overlap_timeline_figure([TIMELINE, crowded], lang=lang)
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    texts = [t for t in figure.axes[0].texts if t.xy[1] > 2]  # the crowded rank's numbers
    assert len(texts) == 4
    boxes = [Text.get_window_extent(t, renderer) for t in texts]  # the number, not its line
    for i in range(4):
        for j in range(i + 1, 4):
            if texts[i].xyann[1] == texts[j].xyann[1]:  # at one height
                assert not boxes[i].overlaps(boxes[j]), (texts[i].get_text(), texts[j].get_text())
    in_order = sorted(zip(boxes, texts), key=lambda pair: pair[0].x0)
    assert [t.xy[0] for _, t in in_order] == sorted(t.xy[0] for t in texts)  # 1 to 4, left to right
    matplotlib.pyplot.close(figure)


def queue_lines(figure) -> list[tuple]:
    """The grey lines of a timeline: (x from, x to) in ms."""
    return [tuple(line.get_xdata()) for line in figure.axes[0].lines if line.get_color() == "0.55"]


@pytest.mark.parametrize("lang", ["en", "fa"])
def test_the_measured_timeline_draws_a_bucket_s_wait_to_start(lang):
    # Bucket 2 is ready at 300 ms but its all-reduce starts at 320 ms (the previous one still
    # ran): a grey line joins its ready tick to its bar, and the legend names it once.
    late = {**TIMELINE, "buckets": [dict(b) for b in TIMELINE["buckets"]]}
    late["buckets"][1]["start"], late["buckets"][1]["end"] = 0.32, 0.36
    figure = ddp.overlap_timeline_figure([late, late], lang=lang)
    assert [tuple(round(x, 6) for x in line) for line in queue_lines(figure)] == [(300.0, 320.0)] * 2
    names = [name.lstrip("\u200f") for name in figure.axes[0].get_legend_handles_labels()[1]]
    assert names.count(ddp.LABELS[lang]["queued"]) == 1
    matplotlib.pyplot.close(figure)
    modelled = {key: late[key] for key in ("backward", "wait", "buckets")}
    figure = ddp.overlap_timeline_figure([modelled], lang="en", modelled=True)
    assert queue_lines(figure) == []  # the modelled timelines of the companion page are unchanged
    matplotlib.pyplot.close(figure)


def test_a_rank_that_began_the_step_later_is_drawn_from_its_own_start():
    # On one clock for all ranks (ddp_lab.overlap_timeline), a rank that left the barrier 50 ms
    # after the earliest starts its forward at 50 ms: its bars keep their places, and the axis
    # still starts at the earliest rank's 0.
    shift = 0.05
    later = {phase: (TIMELINE[phase][0] + shift, TIMELINE[phase][1] + shift)
             for phase in ("forward", "backward", "wait")}
    later["buckets"] = [{**b, **{key: b[key] + shift for key in ("ready", "start", "end")}}
                        for b in TIMELINE["buckets"]]
    figure = ddp.overlap_timeline_figure([TIMELINE, later], lang="en")
    ax = figure.axes[0]
    forward = sorted(round(p.get_x(), 6) for p in ax.patches
                     if to_hex(p.get_facecolor()) == ddp.COLOURS["forward"])
    assert forward == [0.0, 50.0]
    wait_ends = sorted(round(p.get_x() + p.get_width(), 6) for p in ax.patches
                       if to_hex(p.get_facecolor()) == ddp.COLOURS["wait"])
    assert wait_ends == [600.0, 650.0]
    assert ax.get_xlim()[0] <= 0.0
    matplotlib.pyplot.close(figure)

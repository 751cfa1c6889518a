"""The scale lab's figure (lesson 78): measured bytes per rank against N beside the formulas,
drawn in both editions and legible on a phone, like every figure of the course."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from lesson_code import memory, plots  # noqa: E402
from lesson_code.plots import scale  # noqa: E402
from test_plots import PHONE_WIDTH_PX, SMALLEST_PX, shown_texts  # noqa: E402

PARAMETERS = 4_788_224
SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
# What a sweep measures, here the formulas themselves (DDP with its buckets' extra 2 bytes).
TABLE = pd.DataFrame([{"N": n, "strategy": s,
                       "model_states": memory.total_bytes(s, PARAMETERS, n)
                       + (2 * PARAMETERS if s == "DDP" else 0),
                       "sent": memory.traffic_per_step(s, PARAMETERS, n)}
                      for n in SIZES for s in memory.STAGES])


@pytest.mark.parametrize("lang", ["en", "fa"])
def test_the_scale_figure_draws_points_and_formulas_in_both_editions(lang):
    figure = scale.scale_figure(TABLE, PARAMETERS, lang)
    try:
        figure.canvas.draw()
        held, sent = figure.axes
        assert held.get_xscale() == "log" and held.get_yscale() == "log"
        assert len(held.lines) == 2 * len(memory.STAGES)  # a line and points per strategy
        ddp_points = held.lines[1].get_ydata()
        assert list(ddp_points) == pytest.approx([18 * PARAMETERS / 1e6] * len(SIZES))
        assert min(sent.lines[1].get_xdata()) == 2  # nothing sent on one rank: no point there
        # the largest N, which the page discusses, has a tick on both panels
        assert list(held.get_xticks()) == [1, 8, 64, 512]
        assert list(sent.get_xticks()) == [8, 64, 512]
        # ZeRO-3's smallest points (0.15 MB at N = 512) sit above a labelled tick
        low, high = held.get_ylim()
        labelled = [tick for tick in held.get_yticks() if low <= tick <= high]
        assert min(labelled) <= min(min(line.get_ydata()) for line in held.lines)
        texts = " ".join(str(t.get_text()) for t in shown_texts(figure))
        assert any("\u0600" <= ch <= "\u06ff" for ch in texts) == (lang == "fa")
        renderer = figure.canvas.get_renderer()
        width_pt = figure.get_tightbbox(renderer).width * 72
        smallest = min(shown_texts(figure), key=lambda t: t.get_fontsize())
        assert smallest.get_fontsize() * PHONE_WIDTH_PX / width_pt >= SMALLEST_PX
        if lang == "fa":
            assert "نقطه‌ها: اندازه‌گیری‌شده؛ خط‌ها: فرمول" in texts
            for text in shown_texts(figure):
                words = str(text.get_text())
                assert plots.persian_text(words) == words
    finally:
        plt.close(figure)


def test_the_persian_check_table_writes_each_difference_column_in_one_notation_as_english_does():
    # check_summary's columns hold 7.2e-05 beside 0.005505: pandas writes both with 6 decimals,
    # and so must the Persian table, not «۷٫۲ × ۱۰⁻⁵» beside «۰٫۰۰۵۵۰۵».
    differences = ("profiler's peak, largest relative difference", "largest gradient difference",
                   "gradient distance", "largest parameter difference", "parameter distance")
    frame = pd.DataFrame({column: [7.2e-05, 0.005505, 0.0] for column in differences}
                         | {"peak difference, bytes": [0, 512, 512]},
                         index=pd.Index(["DDP", "ZeRO-1", "ZeRO-2"], name="strategy"))
    shown = scale.table(frame, "fa")._repr_html_()
    assert shown.count("<td>۰٫۰۰۰۰۷۲</td>") == shown.count("<td>۰٫۰۰۵۵۰۵</td>") == 5
    assert "×" not in shown and "<td>۵۱۲</td>" in shown
    assert scale.table(frame, "en") is frame  # the English edition shows what pandas shows
    assert frame.iloc[0, 0] == 7.2e-05  # the caller's values stay numbers


def test_every_persian_label_of_a_largest_value_says_so():
    most = {label: persian for label, persian in scale.TABLE_LABELS.items()
            if label.endswith(", most")}
    assert len(most) == 5 and all(persian.startswith("بیشترین") for persian in most.values()), most

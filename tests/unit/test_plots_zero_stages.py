"""Lesson 78's memory-against-N figure draws ZeRO-3's working-set floor, not only its shards."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from lesson_code import memory  # noqa: E402
from lesson_code.plots import zero  # noqa: E402


WORLD_SIZES = [1, 64, 1024]


@pytest.fixture(scope="module")
def figure_and_table():
    """Lesson 78's stages figure for 7.5B parameters, and the memory table it draws."""
    fig = zero.stages_figure(7.5e9, WORLD_SIZES, layers=32)
    table = memory.memory_table(7.5e9, WORLD_SIZES)
    stage = {name: table[table.stage == name].total.to_numpy() for name in ("ZeRO-3", "DDP")}
    yield fig, stage["ZeRO-3"], stage["DDP"]
    plt.close(fig)


def dashed_line(ax):
    """The one dashed line of a panel (the test fails if there is not exactly one)."""
    dashed = [line for line in ax.get_lines() if line.get_linestyle() == "--"]
    assert len(dashed) == 1
    return dashed[0]


def test_the_stages_figure_draws_zero3_with_its_working_set_dashed(figure_and_table):
    fig, states, _ = figure_and_table
    assert list(dashed_line(fig.axes[0]).get_ydata()) == pytest.approx(list((states + 1.875e9) / 1e9))


def test_the_stages_figure_caps_zero3s_saving_with_its_working_set_dashed(figure_and_table):
    # The saving panel shows what the working set leaves: about 98.3% at N = 1024, not 100%.
    fig, states, ddp = figure_and_table
    dashed = dashed_line(fig.axes[1])
    assert list(dashed.get_ydata()) == pytest.approx(list(100 * (1 - (states + 1.875e9) / ddp)))
    assert round(dashed.get_ydata()[-1], 1) == 98.3


def test_the_stages_figure_keys_all_four_stages_above_its_first_panel():
    # A reader of the top panel alone finds the key of its solid lines there, not under the second.
    fig = zero.stages_figure(7.5e9, [1, 64, 1024])
    top, bottom = fig.axes
    keys = [text.get_text() for text in top.get_legend().get_texts()]
    assert keys == [*memory.STAGES, "ZeRO-3 + working set (32 layers)"]
    assert bottom.get_legend() is None
    plt.close(fig)


def test_the_shard_cuts_of_the_mlp_split_two_weights_and_leave_two_zeros_of_padding():
    sizes = {"W1": 2048, "b1": 64, "W2": 4096, "b2": 64, "W3": 640, "b3": 10}
    assert zero.shard_cuts(list(sizes.values()), 4) == [1731, 3462, 5193]
    for lang in ("en", "fa"):
        fig = zero.shard_cuts_figure(sizes, 4, lang=lang)
        ax = fig.axes[0]
        dashed = [line.get_xdata()[0] for line in ax.get_lines() if line.get_linestyle() == "--"]
        assert dashed == [1731, 3462, 5193]
        assert list(ax.get_xticks()) == [0, 1731, 3462, 5193, 6922] and ax.get_xlim() == (0, 6924)
        shown = [text.get_text() for text in ax.texts]
        assert [name for name in sizes if name in shown] == list(sizes)
        padding = "padding: 2 zeros" if lang == "en" else "\u200fپدینگ: ۲ صفر"
        assert padding in shown
        plt.close(fig)
    with pytest.raises(ValueError, match="world_size=9"):
        zero.shard_cuts_figure(sizes, 9)


def test_the_four_moves_footer_keeps_its_formula_left_to_right_in_persian():
    # Without an isolate the bidi algorithm shows "S = ⌈Ψ/N⌉" as "⌈Ψ/N⌉ = S" in a Persian line.
    assert "\u2066S = ⌈Ψ/N⌉\u2069" in zero.MOVES_LABELS["fa"]["elements"]

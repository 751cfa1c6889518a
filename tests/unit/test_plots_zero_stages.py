"""Lesson 78's memory-against-N figure draws ZeRO-3's working-set floor, not only its shards."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from lesson_code import memory  # noqa: E402
from lesson_code.plots import zero  # noqa: E402


def test_the_stages_figure_draws_zero3_with_its_working_set_dashed():
    world_sizes = [1, 64, 1024]
    fig = zero.stages_figure(7.5e9, world_sizes, layers=32)
    top = fig.axes[0]
    dashed = [line for line in top.get_lines() if line.get_linestyle() == "--"]
    assert len(dashed) == 1
    table = memory.memory_table(7.5e9, world_sizes)
    states = table[table.stage == "ZeRO-3"].total.to_numpy()
    assert list(dashed[0].get_ydata()) == pytest.approx(list((states + 1.875e9) / 1e9))
    plt.close(fig)

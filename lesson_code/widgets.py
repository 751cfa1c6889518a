"""Interactive widgets for readers running the notebooks (lesson 78's memory calculator).

They draw from `lesson_code.memory` and never launch ranks. The rendered book shows a static
figure instead (widgets need a live kernel), so every widget has a static twin in `plots`.

    from lesson_code import widgets
    widgets.memory_calculator()        # in Jupyter: sliders for P, N, stage and precision
    widgets.memory_calculator("fa")    # the same, labelled in Persian, its table right to left
"""

from __future__ import annotations

import ipywidgets
import pandas as pd

from lesson_code import memory
from lesson_code.language import check_language
from lesson_code.plots import zero as figures

PRECISIONS = {"mixed (bf16 + fp32 master)": memory.MIXED_ADAM, "fp32": memory.FP32_ADAM}
# The controls' labels, and the precisions as a dropdown shows them, in each edition.
LABELS = {
    "en": {"billions": "P (billions)", "world_size": "N", "stage": "stage", "precision": "precision",
           "mixed (bf16 + fp32 master)": "mixed (bf16 + fp32 master)", "fp32": "fp32"},
    "fa": {"billions": "P (میلیارد)", "world_size": "N", "stage": "مرحلهٔ ZeRO", "precision": "دقت عددی",
           "mixed (bf16 + fp32 master)": "ترکیبی (bf16 با وزن‌های اصلی fp32)", "fp32": "fp32"},
}


def memory_table_for(billions: float, world_size: int, stage: str, precision: str) -> pd.DataFrame:
    """Per-rank GB of parameters, gradients and optimizer state for one choice, and the total."""
    parts = memory.bytes_per_rank(stage, billions * 1e9, world_size, PRECISIONS[precision])
    table = pd.DataFrame({"GB per rank": {k: v / 1e9 for k, v in parts.items()}})
    table.loc["total"] = table["GB per rank"].sum()
    return table.round(2)


def memory_calculator(lang: str = "en") -> ipywidgets.interactive:
    """Sliders for parameters (billions), N, stage and precision; shows the per-rank table.
    Labelled in `lang` ("en" or "fa"; ValueError for another), the table through lesson 78's
    `plots.zero.localized`, so that in Persian it reads right to left in the glossary's words."""
    labels = LABELS[check_language(lang)]
    # auto_display: show what the function returns, as ipywidgets.interact does; a bare
    # interactive only keeps it in .result, and the calculator would show sliders and no table
    return ipywidgets.interactive(
        lambda billions, world_size, stage, precision: figures.localized(
            memory_table_for(billions, world_size, stage, precision), lang),
        {"auto_display": True},
        billions=ipywidgets.FloatLogSlider(value=7.0, base=10, min=-1, max=3, step=0.05,
                                           description=labels["billions"]),
        world_size=ipywidgets.IntSlider(value=8, min=1, max=1024, description=labels["world_size"]),
        stage=ipywidgets.Dropdown(options=list(memory.STAGES), value="ZeRO-1",
                                  description=labels["stage"]),
        precision=ipywidgets.Dropdown(options=[(labels[name], name) for name in PRECISIONS],
                                      description=labels["precision"]),
    )

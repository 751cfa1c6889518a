"""Interactive widgets for readers running the notebooks (lesson 78's memory calculator).

They draw from `lesson_code.memory` and never launch ranks. The rendered book shows a static
figure instead (widgets need a live kernel), so every widget has a static twin in `plots`.

    from lesson_code import widgets
    widgets.memory_calculator()        # in Jupyter: sliders for P, N, stage and precision
"""

from __future__ import annotations

import ipywidgets
import pandas as pd

from lesson_code import memory

PRECISIONS = {"mixed (bf16 + fp32 master)": memory.MIXED_ADAM, "fp32": memory.FP32_ADAM}


def memory_table_for(billions: float, world_size: int, stage: str, precision: str) -> pd.DataFrame:
    """Per-rank GB of parameters, gradients and optimizer state for one choice, and the total."""
    parts = memory.bytes_per_rank(stage, billions * 1e9, world_size, PRECISIONS[precision])
    table = pd.DataFrame({"GB per rank": {k: v / 1e9 for k, v in parts.items()}})
    table.loc["total"] = table["GB per rank"].sum()
    return table.round(2)


def memory_calculator() -> ipywidgets.interactive:
    """Sliders for parameters (billions), N, stage and precision; shows the per-rank table."""
    return ipywidgets.interactive(
        memory_table_for,
        billions=ipywidgets.FloatLogSlider(value=7.0, base=10, min=-1, max=3, step=0.05,
                                           description="P (billions)"),
        world_size=ipywidgets.IntSlider(value=8, min=1, max=1024, description="N"),
        stage=ipywidgets.Dropdown(options=list(memory.STAGES), value="ZeRO-1"),
        precision=ipywidgets.Dropdown(options=list(PRECISIONS)),
    )

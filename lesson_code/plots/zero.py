"""Figures of lesson 78: memory per rank of DDP and ZeRO stages against N, and measured vs formula.

The first two are drawn from `lesson_code.memory` (arithmetic); the third from bytes measured on
real ranks by `zero_lab.memory_profile`.
"""

from __future__ import annotations

from matplotlib.figure import Figure

from lesson_code import memory
from lesson_code.plots import label_ranks, start_figure

LABELS = {
    "en": {"ranks": "ranks N", "per_rank": "GB per rank", "saving": "saving vs DDP (%)",
           "title": "Mixed-precision Adam, {p:g}B parameters", "measured": "measured",
           "formula": "formula 12 × shard", "bytes": "optimizer bytes per rank", "rank": "rank",
           "ddp": "DDP (every rank holds all)", "zero1": "ZeRO-1"},
    "fa": {"ranks": "تعداد رتبه‌ها N", "per_rank": "گیگابایت در هر رتبه",
           "saving": "صرفه‌جویی نسبت به DDP (٪)", "title": "Adam با دقت ترکیبی، {p:g} میلیارد پارامتر",
           "measured": "اندازه‌گیری‌شده", "formula": "فرمول 12 × شارد",
           "bytes": "بایت‌های بهینه‌ساز در هر رتبه", "rank": "رتبه",
           "ddp": "DDP (هر رتبه همه را دارد)", "zero1": "ZeRO-1"},
}


def stages_figure(params: float, world_sizes: list[int], lang: str = "en") -> Figure:
    """Two panels against N: GB per rank of each stage, and its saving over DDP in percent."""
    table = memory.memory_table(params, world_sizes)
    labels, fig, (left, right) = start_figure(LABELS, lang, 1, 2, figsize=(10, 3.8))
    for stage in memory.STAGES:
        rows = table[table.stage == stage]
        left.plot(rows.N, rows.total / 1e9, marker="o", label=stage)
        right.plot(rows.N, rows.saving_percent, marker="o", label=stage)
    for ax, ylabel in ((left, labels["per_rank"]), (right, labels["saving"])):
        ax.set_xscale("log", base=2)
        ax.set_xticks(world_sizes, [str(n) for n in world_sizes])
        ax.set_xlabel(labels["ranks"])
        ax.set_ylabel(ylabel)
    left.set_yscale("log")
    right.legend(fontsize=8)
    fig.suptitle(labels["title"].format(p=params / 1e9), fontsize=10)
    fig.tight_layout()
    return fig


def measured_memory_figure(zero: list[dict], ddp: list[dict], shard_numel: int,
                           lang: str = "en") -> Figure:
    """Optimizer bytes per rank, measured, under DDP and ZeRO-1, beside the formula 12 x shard."""
    labels, fig, ax = start_figure(LABELS, lang, figsize=(6.5, 3.6))
    ranks = [row["rank"] for row in zero]
    width = 0.38
    ax.bar([r - width / 2 for r in ranks], [row["optimizer"] for row in ddp], width,
           label=labels["ddp"], color="#c7c7c7")
    ax.bar([r + width / 2 for r in ranks], [row["optimizer"] for row in zero], width,
           label=f"{labels['zero1']} ({labels['measured']})", color="#1f77b4")
    ax.axhline(12 * shard_numel, color="#d62728", linestyle="--", label=labels["formula"])
    return label_ranks(fig, ax, ranks, labels, labels["bytes"])

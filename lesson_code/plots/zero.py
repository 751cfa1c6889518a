"""Figures of lesson 78: memory per rank of DDP and ZeRO stages against N, and measured vs formula.

The first two are drawn from `lesson_code.memory` (arithmetic); the third from bytes measured on
real ranks by `zero_lab.memory_profile`.
"""

from __future__ import annotations

from matplotlib.figure import Figure

from lesson_code import memory
from lesson_code.plots import FIGURE_WIDTH, label_ranks, legend_below, number, start_figure
from lesson_code.plots.ddp import localized as localized_with

LABELS = {
    "en": {"ranks": "ranks N", "per_rank": "GB per rank", "saving": "saving vs DDP (%)",
           "title": "Mixed-precision Adam, {p}B parameters", "measured": "measured",
           "formula": "formula 12 × shard", "bytes": "optimizer bytes per rank", "rank": "rank",
           "ddp": "DDP (every rank holds all)", "zero1": "ZeRO-1"},
    "fa": {"ranks": "تعداد رتبه‌ها N", "per_rank": "گیگابایت در هر رتبه",
           "saving": "صرفه‌جویی نسبت به DDP (٪)", "title": "Adam با دقت ترکیبی، {p} میلیارد پارامتر",
           "measured": "اندازه‌گیری‌شده", "formula": "فرمول ۱۲ × شارد",
           "bytes": "بایت‌های بهینه‌ساز در هر رتبه", "rank": "رتبه",
           "ddp": "DDP (هر رتبه همه را دارد)", "zero1": "ZeRO-1"},
}


# The tables of lesson 78 in Persian: English label -> Persian term (book/fa/glossary.md).
TABLE_LABELS = {
    "params": "پارامترها", "grads": "گرادیان‌ها", "optimizer": "بهینه‌ساز",
    "parameters": "پارامترها", "gradients": "گرادیان‌ها", "total": "جمع", "rank": "رتبه",
    "GB per rank under DDP": "گیگابایت در هر رتبه زیر DDP", "GB per rank": "گیگابایت در هر رتبه",
    "stage": "مرحله", "saving": "صرفه‌جویی (٪)", "bytes_per_param": "بایت برای هر پارامتر",
    "saving_percent": "صرفه‌جویی (٪)", "step": "گام", "ddp": "DDP", "zero": "ZeRO-1",
    "naive_zero": "ZeRO ساده‌لوحانه", "torch_zero": "ZeroRedundancyOptimizer",
    "all_reduce": "کاهش همگانی", "reduce_scatter": "کاهش و پخش", "all_gather": "گردآوری همگانی",
    "ZeRO-1 on 4 ranks": "ZeRO-1 روی ۴ رتبه", "torch.optim.Adam, one process": "torch.optim.Adam، یک فرایند",
    "DDP optimizer": "بهینه‌ساز DDP", "ZeRO-1 optimizer": "بهینه‌ساز ZeRO-1", "12 x shard": "۱۲ × شارد",
    "max |parameter - torch.optim.Adam|": "بیشینهٔ |پارامتر − torch.optim.Adam|",
    "forward": "گذر رفت", "backward": "گذر برگشت", "comm": "ارتباطات", "MB sent": "MB فرستاده",
    "optimizer compute": "محاسبهٔ بهینه‌ساز", "MB sent per step": "MB فرستاده در هر گام",
    "vs our ddp": "نسبت به DDP ما", "vs torch zero": "نسبت به ZeroRedundancyOptimizer",
    "bytes per parameter": "بایت برای هر پارامتر", "bytes sent, measured": "بایت فرستاده، اندازه‌گیری‌شده",
    "bytes sent, formula": "بایت فرستاده، فرمول", "memory per rank": "حافظه در هر رتبه",
    "model, ranks": "مدل، رتبه‌ها", "none fits": "هیچ‌کدام جا نمی‌شود",
}


def localized(table, lang: str):
    """`table` with its labels in edition `lang` (Persian terms from TABLE_LABELS for "fa")."""
    return localized_with(table, lang, TABLE_LABELS)


def stages_figure(params: float, world_sizes: list[int], lang: str = "en") -> Figure:
    """Two panels against N: GB per rank of each stage, and its saving over DDP in percent."""
    table = memory.memory_table(params, world_sizes)
    labels, fig, (left, right) = start_figure(LABELS, lang, 2, 1, figsize=(FIGURE_WIDTH, 7))
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
    legend_below(right, ncol=2)
    fig.suptitle(labels["title"].format(p=number(f"{params / 1e9:g}", lang)))
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
    return label_ranks(fig, ax, ranks, labels, labels["bytes"], lang)

"""Figure and tables of lesson 78's scale lab: bytes per rank measured on 1 to 512 simulated
ranks, beside the formulas of `lesson_code.memory`, for DDP and each ZeRO stage.

The points are what `scale_lab.sweep` measured (a table of it); the lines are the formulas for
the same model, so a reader sees where the course's code holds what the formula says and where
it holds more (DDP's buckets, ZeRO-1's gradient shard).
"""

from __future__ import annotations

from matplotlib.figure import Figure

from lesson_code import language, memory
from lesson_code.plots import FIGURE_WIDTH, number, start_figure
from lesson_code.plots.tables import translate

LABELS = {
    "en": {"ranks": "ranks N (simulated)", "held": "MB of model state per rank",
           "sent": "MB sent per rank per step", "measured": "measured",
           "formula": "formula", "title": "MiniGPT, {p} million parameters: points measured, lines the formula"},
    "fa": {"ranks": "تعداد رتبه‌ها N (شبیه‌سازی‌شده)", "held": "مگابایت وضعیت مدل در هر رتبه",
           "sent": "مگابایت فرستادهٔ هر رتبه در هر گام", "measured": "اندازه‌گیری‌شده",
           "formula": "فرمول", "title": "MiniGPT با {p} میلیون پارامتر (نقطه‌ها: اندازه‌گیری‌شده؛ خط‌ها: فرمول)"},
}
# The scale lab's tables in Persian: English label -> Persian term (book/fa/glossary.md).
TABLE_LABELS = {
    **language.TERMS,
    "strategy": "راهبرد", "paper GB": "مقاله (گیگابایت)", "formula GB": "فرمول (گیگابایت)",
    "measured GB": "اندازه‌گیری‌شده (گیگابایت)", "agrees": "هم‌خوان",
    "beyond the paper GB": "بیرون از شمارش مقاله (گیگابایت)",
    "peak in the step GB": "بیشینهٔ حافظه در گام (گیگابایت)",
    "peak during setup GB": "بیشینهٔ حافظه هنگام راه‌اندازی (گیگابایت)",
    # scale_lab.sweep_summary
    "MB model state": "وضعیت مدل (مگابایت)", "formula MB": "فرمول (مگابایت)",
    "MB sent": "فرستاده (مگابایت)", "formula MB sent": "فرستاده طبق فرمول (مگابایت)",
    "formula's tensors exact": "تنسورهای فرمول، دقیق", "held GB": "نگه‌داشته (گیگابایت)",
    "MB peak in the step": "بیشینهٔ حافظه در گام (مگابایت)",
    "MB peak during setup": "بیشینهٔ حافظه هنگام راه‌اندازی (مگابایت)",
    # scale_lab.check_summary
    "held equal": "نگه‌داشته برابر", "sent equal": "فرستاده برابر",
    "messages equal": "پیام‌ها برابر", "peak equal": "بیشینهٔ حافظه برابر",
    "peak difference, bytes": "اختلاف بیشینهٔ حافظه (بایت)",
    "profiler's peak, largest relative difference": "بیشترین اختلاف نسبیِ بیشینهٔ پروفایلر",
    "profiler's peak gap, bytes": "فاصلهٔ بیشینهٔ پروفایلر از ردیاب (بایت)",
    "largest gradient difference": "بیشترین اختلاف گرادیان‌ها",
    "gradient distance": "فاصلهٔ نسبی گرادیان‌ها",
    "largest parameter difference": "بیشترین اختلاف پارامترها",
    "parameter distance": "فاصلهٔ نسبی پارامترها",
    # scale_lab.peak_summary
    "made before the step GB": "پدیدآمده پیش از گام (گیگابایت)",
    "made in the forward GB": "پدیدآمده در گذر رفت (گیگابایت)",
    "made in the backward GB": "پدیدآمده در گذر برگشت (گیگابایت)",
    "made in the optimizer GB": "پدیدآمده در بخشِ بهینه‌ساز (گیگابایت)",
    "peak at": "تابعِ در حال اجرا در بیشینه",
    # scale_lab.pipelined.summary
    "layers per stage, fewest": "کمترین شمار لایه در یک مرحله",
    "layers per stage, most": "بیشترین شمار لایه در یک مرحله",
    "parameter MB per stage, least": "کمترین حجم پارامترهای یک مرحله (مگابایت)",
    "parameter MB per stage, most": "بیشترین حجم پارامترهای یک مرحله (مگابایت)",
    "bytes sent, most": "بیشترین بایت‌های فرستاده", "protocol's bytes, most": "بیشترین بایت‌های پروتکل",
    "activations kept, most": "بیشترین شمار فعال‌سازی‌های نگه‌داشته",
}
COLORS = {"DDP": "#7f7f7f", "ZeRO-1": "#1f77b4", "ZeRO-2": "#2ca02c", "ZeRO-3": "#d62728"}
# DDP, ZeRO-1 and ZeRO-2 send the same bytes: markers of other shapes and sizes keep all three
# visible where their points fall on one another.
MARKERS = {"DDP": dict(marker="o", markersize=9, fillstyle="none"),
           "ZeRO-1": dict(marker="s", markersize=6), "ZeRO-2": dict(marker="^", markersize=4),
           "ZeRO-3": dict(marker="D", markersize=4)}


def scale_figure(table, parameters: int, lang: str = "en",
                 precision: memory.Precision = memory.MIXED_ADAM, dtype_bytes: int = 2) -> Figure:
    """Two panels against N (log scale): MB each rank holds after a step (parameters, gradients
    and optimizer state, measured: `model_states` of `table`, a `scale_lab.sweep`) and MB it
    sends per step (`sent`), each strategy's points beside its formula's line
    (memory.total_bytes and memory.traffic_per_step for `parameters` and `precision`)."""
    labels, fig, (held, sent) = start_figure(LABELS, lang, 1, 2, figsize=(FIGURE_WIDTH, 4.2))
    sizes = sorted(set(int(n) for n in table.N))
    lines = [n for n in sizes if n > 1]  # traffic is 0 on one rank: no point on a log axis
    for strategy, rows in table.groupby("strategy", sort=False):
        points = {"color": COLORS[strategy], "linestyle": "none", **MARKERS[strategy]}
        held.plot(sizes, [memory.total_bytes(strategy, parameters, n, precision) / 1e6
                          for n in sizes], color=COLORS[strategy], linewidth=1.2)
        held.plot(rows.N, rows.model_states / 1e6, label=strategy, **points)
        sent.plot(lines, [memory.traffic_per_step(strategy, parameters, n, dtype_bytes) / 1e6
                          for n in lines], color=COLORS[strategy], linewidth=1.2)
        shown = rows[rows.N > 1]
        sent.plot(shown.N, shown.sent / 1e6, **points)
    for ax, ylabel, shown in ((held, labels["held"], sizes), (sent, labels["sent"], lines)):
        ax.set_xscale("log", base=2)
        # every third N counted back from the largest (1, 8, 64, 512 and 8, 64, 512): few
        # enough to read on a phone, and the largest N, which the text discusses, among them
        ticks = shown[::-3][::-1] if len(shown) > 5 else shown
        ax.set_xticks(ticks, [str(n) for n in ticks])
        ax.set_xlabel(labels["ranks"])
        ax.set_ylabel(ylabel)
    held.set_yscale("log")
    # from 0.1 MB, so that ZeRO-3's smallest points (0.15 MB at N = 512) sit above a labelled tick
    held.set_ylim(bottom=0.1)
    fig.legend(*held.get_legend_handles_labels(), loc="lower center", ncol=4,
               markerfirst=lang != "fa")  # in Persian, each key's marker right of its name
    fig.suptitle(labels["title"].format(p=number(f"{parameters / 1e6:.1f}", lang)))
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig


def table(frame, lang: str = "en"):
    """`frame` (`scale_lab.paper_summary`, `sweep_summary`, `check_summary`,
    `pipelined.summary`) with its labels in edition `lang`: Persian terms from TABLE_LABELS for
    "fa", unchanged for "en". The values are never touched: the Persian table shows pandas'
    digits for each column, as the English one does ("0.000072" is «۰٫۰۰۰۰۷۲»)."""
    return translate(frame, {"fa": TABLE_LABELS}, lang)

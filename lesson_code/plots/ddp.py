"""Figures of lesson 77: the overlap timeline of a bucketed step, and time per phase per wrapper.

Both are drawn from measurements: `ddp_lab.overlap_timeline` (events of one real step on every
rank) and `ddp_lab.time_steps` (median seconds per phase).
"""

from __future__ import annotations

from matplotlib.figure import Figure

from lesson_code import ddp_lab, language
from lesson_code.plots import FIGURE_WIDTH, legend_below, start_figure
from lesson_code.plots.tables import translate

LABELS = {
    "en": {"forward": "forward", "backward": "backward", "wait": "waiting for buckets",
           "comm": "bucket all-reduce (ring thread)", "ready": "bucket ready",
           "optimizer": "optimizer", "time": "time since the step began (ms)", "rank": "rank",
           "ms": "milliseconds per step", "wrapper": "wrapper",
           "naive": "naive", "bucketed": "bucketed", "torch": "torch"},
    "fa": {"forward": "گذر رفت", "backward": "گذر برگشت", "wait": "انتظار برای باکت‌ها",
           "comm": "کاهش همگانی باکت (رشتهٔ حلقه)", "ready": "باکت آماده",
           "optimizer": "بهینه‌ساز", "time": "زمان از آغاز گام (ms)", "rank": "رتبه",
           "ms": "میلی‌ثانیه در هر گام", "wrapper": "پوشاننده",
           **{name: ddp_lab.WORDS[name] for name in ddp_lab.WRAPPERS}},
}
COLOURS = {"forward": "#8fbbd9", "backward": "#1f77b4", "wait": "#d62728", "comm": "#ff9f4a",
           "optimizer": "#2ca02c"}


def overlap_timeline_figure(timelines: list[dict], lang: str = "en") -> Figure:
    """One lane pair per rank: compute (forward, backward, wait) above, bucket reductions below."""
    labels, fig, ax = start_figure(LABELS, lang, figsize=(FIGURE_WIDTH, 1.6 + 0.9 * len(timelines)))
    for rank, timeline in enumerate(timelines):
        y = rank * 2.5
        for phase in ("forward", "backward", "wait"):
            start, end = timeline[phase]
            ax.barh(y + 1, 1e3 * (end - start), left=1e3 * start, height=0.8,
                    color=COLOURS[phase], label=labels[phase] if rank == 0 else None)
        for bucket in timeline["buckets"]:
            ax.barh(y, 1e3 * (bucket["end"] - bucket["start"]), left=1e3 * bucket["start"],
                    height=0.8, color=COLOURS["comm"], edgecolor="white",
                    label=labels["comm"] if rank == 0 and bucket["bucket"] == 0 else None)
            ax.plot(1e3 * bucket["ready"], y + 0.5, "k|", markersize=10,
                    label=labels["ready"] if rank == 0 and bucket["bucket"] == 0 else None)
    ax.set_yticks([rank * 2.5 + 0.5 for rank in range(len(timelines))],
                  [language.numbered(labels["rank"], rank, lang) for rank in range(len(timelines))])
    ax.invert_yaxis()
    ax.set_xlabel(labels["time"])
    legend_below(ax, ncol=2)
    fig.tight_layout()
    return fig


def phase_breakdown_figure(phases: dict[str, dict[str, float]], lang: str = "en") -> Figure:
    """Stacked bar per wrapper: forward, backward, wait (exposed communication), optimizer.

    `phases[name]` maps phase names to seconds (as returned by ddp_lab.time_steps); for torch
    DDP the wait is not separable and is part of backward.
    """
    labels, fig, ax = start_figure(LABELS, lang, figsize=(6.5, 3.8))
    names = list(phases)
    bottoms = [0.0] * len(names)
    for phase in ("forward", "backward", "wait", "optimizer"):
        heights = [1e3 * phases[name][phase] if phases[name][phase] == phases[name][phase] else 0.0
                   for name in names]
        ax.bar(range(len(names)), heights, bottom=bottoms, color=COLOURS[phase], label=labels[phase])
        bottoms = [b + h for b, h in zip(bottoms, heights)]
    ax.set_xticks(range(len(names)), [labels.get(name, name) for name in names])
    ax.set_ylabel(labels["ms"])
    ax.set_xlabel(labels["wrapper"])
    legend_below(ax, ncol=2)
    fig.tight_layout()
    return fig


# The tables of lesson 77 in Persian: English label -> Persian term (book/fa/glossary.md).
TABLE_LABELS = {
    "rank": "رتبه", "norm before": "نُرم پیش از بازپخش", "norm after": "نُرم پس از بازپخش",
    "model": "مدل", "optimizer": "بهینه‌ساز", "wrapper": "پوشاننده", "comm": "ارتباطات",
    "ranks_identical": "رتبه‌ها یکسان", "max_param_diff": "بیشینهٔ اختلاف پارامتر",
    "max_loss_diff": "بیشینهٔ اختلاف زیان", "first_loss": "زیان نخستین گام",
    "last_loss": "زیان آخرین گام", "accumulation": "میکرودسته‌ها",
    "forward": "گذر رفت", "backward": "گذر برگشت", "step": "گام", "wait": "انتظار",
    "overlapped comm": "ارتباط هم‌پوشان",
    "all-reduce calls": "فراخوانی‌های کاهش همگانی", "messages sent": "پیام‌های فرستاده",
    "bytes sent": "بایت‌های فرستاده", "bucket MB": "اندازهٔ باکت (MB)",
    "vs torch": "نسبت به DDP در PyTorch", "communicator": "ارتباط‌دهنده", "parameters": "پارامترها", "figure": "کمیت", "value": "مقدار",
    "key-bias gradient": "گرادیان بایاس کلید", "Adam eps": "`eps` در Adam",
    "first step / lr": "گام نخست / `lr`", "smallest max_param_diff": "کمینهٔ بیشینهٔ اختلاف پارامتر",
    "largest max_param_diff": "بیشینهٔ بیشینهٔ اختلاف پارامتر",
    "buckets": "تعداد باکت‌ها", "exposed comm, model (ms)": "ارتباط پنهان‌نشده، مدل (ms)",
    "backward + exposed, model (ms)": "گذر برگشت + ارتباط پنهان‌نشده، مدل (ms)",
    "wait, measured (ms)": "انتظار، اندازه‌گیری‌شده (ms)",
    "backward + wait, measured (ms)": "گذر برگشت + انتظار، اندازه‌گیری‌شده (ms)",
    **ddp_lab.WORDS,  # values: the runs' models, optimizers, wrappers and communicators
}


def localized(table, lang: str, labels: dict[str, str] = TABLE_LABELS):
    """`table` (a DataFrame or Series) to show in edition `lang`: for "fa" its index and column
    labels, their names and a Series' name become the Persian terms in `labels` (labels it lacks
    stay as they are; `plots.tables.translate`); for "en" it is returned unchanged. The values are
    never touched, so the code that computed and checked the table reads English labels in both
    editions. Raises ValueError for another language."""
    return translate(table, {"fa": labels}, lang)

"""Figures of lesson 81: the loss curve drawn from the run's metrics (the rows of metrics.jsonl,
read with capstone.report.read_metrics), the memory profile of every rank, and a run killed
part-way and continued beside one that never stopped (capstone.crash.crash_and_continue), and
lesson 81a's time lost against the save interval in Young's model.

    loss_curve_figure(read_metrics("capstone-run/metrics.jsonl"), lang="fa")
    crash_figure(crash_and_continue("/tmp/lesson81-crash"), lang="fa")
    young_figure(mtbf_s=11135.0, saves_s=(30, 5), lang="fa")
"""

from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FuncFormatter, MaxNLocator, NullLocator

from lesson_code import language
from lesson_code.plots import label_ranks, legend, legend_below, number, start_figure
from lesson_code.plots.tables import translate

LABELS = {
    "en": {"step": "step", "loss": "loss", "rollback": "checkpoint rolled back to (step {step})",
           "trained": "loss, each step's last pass", "rank": "rank",
           "first_pass": "first pass, undone by the rollback (shifted right)",
           "bytes": "bytes per rank", "parameters": "parameters", "gradients": "gradients",
           "optimizer": "optimizer state", "formula": "12P/N", "diverged": "rejected step (loss {loss:.0f})",
           "never_stopped": "never stopped", "killed": "killed after step {step}",
           "continued": "run again: continued from step {step}", "crash": "a rank killed",
           "resume": "checkpoint it continued from", "save": "a save of {save} s", "ddp": "DDP (12P)",
           "young": "Young's interval", "interval": "save interval T (min), modelled",
           "lost": "time lost (%)", "saves": "saves, C/T", "redone": "steps trained again, T/2M"},
    "fa": {"step": "گام", "loss": "زیان", "rollback": "چکپوینتی که اجرا به آن بازگشت (گام {step})",
           "trained": "زیان، آخرین نوبت اجرای هر گام", "rank": "رتبه",
           "first_pass": "نوبت نخست، که بازگشت بی‌اثرش کرد (کمی به راست)",
           "bytes": "بایت در هر رتبه", "parameters": "پارامترها", "gradients": "گرادیان‌ها",
           "optimizer": "وضعیت بهینه‌ساز", "formula": "12P/N", "diverged": "گام ردشده (زیان {loss:.0f})",
           "never_stopped": "اجرای بی‌وقفه", "killed": "کشته‌شده پس از گام {step}",
           "continued": "اجرای دوباره: ادامه از گام {step}", "crash": "کشته شدن یک رتبه",
           "resume": "چکپوینتی که اجرا از آن ادامه یافت", "save": "ذخیرهٔ {save} ثانیه‌ای", "ddp": "DDP (12P)",
           "young": "فاصلهٔ یانگ", "interval": "فاصلهٔ ذخیره T (دقیقه)، برآوردشده",
           "lost": "زمان ازدست‌رفته (درصد)", "saves": "ذخیره‌ها، C/T",
           "redone": "آموزش دوبارهٔ گام‌ها، T/2M"},
}

# Table labels of the Persian edition (the English labels are the keys).
TABLE_WORDS = {"fa": {
    **language.TERMS,
    "grad_norm": "نُرم گرادیان", "param_norm": "نُرم پارامترها", "step_time_s": "زمان گام (ثانیه)",
    "optimizer": "وضعیت بهینه‌ساز",
    "event": "رویداد", "reason": "دلیل", "to_step": "بازگشت به گام", "at_step": "گام ردشده",
    "(a) loss falls at every step": "(الف) زیان در هر گام پایین می‌آید",
    "(b) same parameter norm on every rank, every step": "(ب) نُرم پارامترها در همهٔ رتبه‌ها و همهٔ گام‌ها یکسان است",
    "(c) optimizer bytes = 12P/N on every rank": "(ج) بایت‌های بهینه‌ساز در هر رتبه = 12P/N",
    "(d) tensors of the step-10 and step-20 checkpoints restore byte for byte":
        "(د) تنسورهای چکپوینت‌های گام‌های ۱۰ و ۲۰ بایت‌به‌بایت بازیابی می‌شوند",
    "command": "فرمان", "median_s": "میانه (ثانیه)", "runs_s": "اجراها (ثانیه)",
    "loss_rows": "سطرهای زیان", "same_losses": "زیان‌های یکسان",
    "2 ranks, half the heads each": "۲ رتبه، هر کدام نیمی از سرها",
    "1 rank, all heads": "۱ رتبه، همهٔ سرها",
    "final loss, never stopped": "زیان پایانی، بی‌وقفه",
    "final loss, resumed from step 10": "زیان پایانی، ادامه از چکپوینت گام ۱۰",
    "rollback": "بازگشت به چکپوینت", "previous_loss": "زیان گام قبل",
    "limit": "مرز محافظ",
    "DDP + Adam: 8P": "DDP با Adam: 8P", "DDP + master copy + Adam: 12P": "DDP با رونوشت اصلی و Adam: 12P",
    "largest loss gap": "بیشترین اختلاف زیان‌ها",
    "largest gradient-norm gap, relative": "بیشترین اختلاف نسبی نُرم گرادیان",
    "largest loss gap to the unclipped run": "بیشترین اختلاف زیان‌ها با اجرای بدون بریدن",
    "broadcast, then optimizer": "نخست بازپخش، سپس بهینه‌ساز",
    "optimizer, then broadcast": "نخست بهینه‌ساز، سپس بازپخش",
    "final parameters, relative distance": "فاصلهٔ نسبی پارامترهای پایانی",
    "mean time between unexpected stops (h)": "میانگین زمان میان دو توقف پیش‌بینی‌نشده (ساعت)",
    "save interval, Young (min)": "فاصلهٔ ذخیره با قاعدهٔ یانگ (دقیقه)",
    "time lost to saves and recomputed steps (%)": "زمان ازدست‌رفته در ذخیره‌ها و آموزش دوبارهٔ گام‌ها (درصد)",
    "parameters (GB)": "پارامترها (گیگابایت)", "gradients (GB)": "گرادیان‌ها (گیگابایت)",
    "optimizer state (GB)": "وضعیت بهینه‌ساز (گیگابایت)",
    "lesson_code.capstone (ours)": "lesson_code.capstone (کد ما)",
    "killed after step": "کشته‌شده پس از گام", "resumed from step": "ادامه از گام",
    "steps trained twice": "گام‌هایی که دو بار آموزش دیدند",
    "same losses": "زیان‌های یکسان",
    "same last checkpoint": "آخرین چکپوینت یکسان",
    "collective": "عملیات جمعی", "calls": "فراخوانی‌ها", "bytes_sent": "بایت‌های فرستاده‌شده",
    "bytes_received": "بایت‌های دریافت‌شده",
    "data position": "جایگاه داده", "optimizer state": "وضعیت بهینه‌ساز",
    "RNG state": "وضعیت مولد اعداد تصادفی", "steps and losses": "گام‌ها و زیان‌ها", "params": "پارامترها",
    "master": "وزن‌های اصلی fp32", "exp_avg": "گشتاور اول Adam", "exp_avg_sq": "گشتاور دوم Adam",
    "optimizer_step": "شمارندهٔ گام Adam", "rng_state": "وضعیت مولد اعداد تصادفی",
    "first step with another loss": "نخستین گامی که زیانش فرق دارد",
    "step-20 loss minus the uninterrupted run's": "زیان گام ۲۰ منهای زیان اجرای بی‌وقفه",
    "MiniGPT, 4 ranks: reduce-scatter and all-gather (µs)": "MiniGPT، ۴ رتبه: کاهش و پخش، سپس گردآوری همگانی (میکروثانیه)",
    "MiniGPT, 4 ranks: two one-number all-reduces (µs)": "MiniGPT، ۴ رتبه: دو کاهش همگانیِ یک‌عددی (میکروثانیه)",
    "7B, 64 ranks: reduce-scatter of bf16 gradients and all-gather of bf16 parameters (s)":
        "۷ میلیارد پارامتر، ۶۴ رتبه: کاهش و پخشِ گرادیان‌های bf16، سپس گردآوری همگانیِ پارامترهای bf16 (ثانیه)",
    "7B, 64 ranks: compute of 65,536 tokens at 400 TFLOP/s (s)":
        "۷ میلیارد پارامتر، ۶۴ رتبه: محاسبهٔ ۶۵٬۵۳۶ توکن با ۴۰۰ ترافلاپ بر ثانیه (ثانیه)",
    "fastest run (s)": "سریع‌ترین اجرا (ثانیه)", "slowest run (s)": "کندترین اجرا (ثانیه)",
    "step, median (ms)": "گام، میانه (میلی‌ثانیه)", "save (ms)": "ذخیره (میلی‌ثانیه)",
    "save, in steps": "ذخیره، برحسب شمار گام‌ها",
    "save interval, Young, M = 1,000 steps (steps)":
        "فاصلهٔ ذخیره با قاعدهٔ یانگ، با میانگین ۱٬۰۰۰ گام میان دو خرابی (گام)",
    "1. two one-number all-reduces, recursive doubling (µs)":
        "۱. دو کاهش همگانیِ یک‌عددی، دوبرابرسازی بازگشتی (میکروثانیه)",
    "2. save interval, Young, 5 s save (min)": "۲. فاصلهٔ ذخیره با قاعدهٔ یانگ، ذخیرهٔ ۵ ثانیه‌ای (دقیقه)",
    "2. time lost, 5 s save (%)": "۲. زمان ازدست‌رفته، ذخیرهٔ ۵ ثانیه‌ای (درصد)",
    "3. 7B, 8 ranks: 128 all-reduces at 25 GB/s (s)":
        "۳. ۷ میلیارد پارامتر، ۸ رتبه: ۱۲۸ کاهش همگانی با ۲۵ گیگابایت بر ثانیه (ثانیه)",
    "3. 7B, 8 ranks: 128 all-reduces on NVLink, 450 GB/s (s)":
        "۳. ۷ میلیارد پارامتر، ۸ رتبه: ۱۲۸ کاهش همگانی روی NVLink با ۴۵۰ گیگابایت بر ثانیه (ثانیه)",
    "5. the loss and the squared norm in one all-reduce, ring (µs)":
        "۵. زیان و مجذور نُرم در یک کاهش همگانی، حلقه (میکروثانیه)",
    "1,024 GPUs: mean time between stops (h)": "۱٬۰۲۴ GPU: میانگین زمان میان دو توقف (ساعت)",
    "1,024 GPUs: save interval, Young (min)": "۱٬۰۲۴ GPU: فاصلهٔ ذخیره با قاعدهٔ یانگ (دقیقه)",
    "1,024 GPUs: time lost (%)": "۱٬۰۲۴ GPU: زمان ازدست‌رفته (درصد)",
}}


def table(frame, lang: str = "en"):
    """A lesson-81 table with its labels in `lang` (`plots.tables.translate`)."""
    return translate(frame, TABLE_WORDS, lang)


def loss_curve_figure(rows: list[dict], lang: str = "en") -> Figure:
    """Loss per step from metrics rows (step records and guard events), rollbacks marked.

    The line joins each step's last pass; a step trained again after a rollback has its first
    pass drawn as hollow markers a quarter step to the right, where the replay cannot hide it.

    A rollback event that names the step it rejected (`at_step`) is drawn there with its loss,
    joined to the last accepted step before it; the loss axis is then logarithmic, so a spike a
    hundred times the loss stays on the figure beside the curve it interrupted, with labelled
    ticks at 2, 3 and 4 for that curve.
    """
    steps = [r for r in rows if "step" in r and "event" not in r]
    last = {r["step"]: index for index, r in enumerate(steps)}  # each step's last pass
    kept = [r for index, r in enumerate(steps) if last[r["step"]] == index]
    undone = [r for index, r in enumerate(steps) if last[r["step"]] != index]  # trained again later
    events = any(r.get("event") for r in rows)  # a legend then, under the axes: more height
    labels, fig, ax = start_figure(LABELS, lang, figsize=(6.5, 4.6 if events else 3.6))
    line, = ax.plot([r["step"] for r in kept], [r["loss"] for r in kept], marker="o", markersize=3,
                    label=labels["trained"])
    for event in (r for r in rows if r.get("event") == "rollback"):
        ax.axvline(event["to_step"], color="#d62728", linestyle=":",
                   label=number(labels["rollback"].format(step=event["to_step"]), lang))
        if "at_step" in event:
            before = [r for r in steps if r["step"] == event["at_step"] - 1]
            xs = [event["at_step"] - 1, event["at_step"]] if before else [event["at_step"]]
            ys = [before[-1]["loss"], event["loss"]] if before else [event["loss"]]
            ax.plot(xs, ys, linestyle="--", color="#d62728", linewidth=1)
            ax.plot(event["at_step"], event["loss"], "x", color="#d62728", markersize=9,
                    label=number(labels["diverged"].format(loss=event["loss"]), lang))
            ax.set_yscale("log")
            # labelled ticks inside the normal range too, so that its curve can be read
            ax.yaxis.set_major_locator(FixedLocator([2, 3, 4, 6, 10, 20, 50, 100, 200]))
            ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: number(f"{value:g}", lang)))
            ax.yaxis.set_minor_locator(NullLocator())
    if undone:  # a replay lands on its first pass when the fault fires once: shift that pass aside
        ax.plot([r["step"] + 0.25 for r in undone], [r["loss"] for r in undone], "o", markersize=5,
                markerfacecolor="none", color=line.get_color(), label=labels["first_pass"])
    # steps are whole (no tick at 2.5), and up to 20 steps every other one is labelled (10, 14)
    ax.xaxis.set_major_locator(MaxNLocator(nbins=12, integer=True, steps=[1, 2, 5, 10]))
    ax.set_xlabel(labels["step"])
    ax.set_ylabel(labels["loss"])
    if events:
        legend_below(ax, ncol=2)  # under the axes: it covers neither the curve nor the step line
    fig.tight_layout()
    return fig


def young_figure(mtbf_s: float, saves_s: tuple[float, ...] = (30,), lang: str = "en") -> Figure:
    """Young's model, not a measurement: the time lost (%) against the save interval T from 1
    to 60 minutes, one curve per save time C in `saves_s`, each minimum, T = sqrt(2 C M), marked.
    Under the first curve its two terms are dashed, the saves' C/T and the half-intervals lost,
    T/2M: they cross at that minimum, where each is half the time lost."""
    from lesson_code.checkpoint.tools import time_lost, young_interval
    labels, fig, ax = start_figure(LABELS, lang, figsize=(6.5, 3.6))
    minutes = [quarter / 4 for quarter in range(4, 4 * 60 + 1)]
    for index, save_s in enumerate(saves_s):
        lost = [100 * time_lost(60 * t, save_s, mtbf_s) for t in minutes]
        line, = ax.plot(minutes, lost, label=number(labels["save"].format(save=save_s), lang))
        if index == 0:  # the two terms of the sum, which cross at Young's interval
            ax.plot(minutes, [100 * save_s / (60 * t) for t in minutes], "--", color=line.get_color(),
                    linewidth=1, label=labels["saves"])
            ax.plot(minutes, [100 * 60 * t / (2 * mtbf_s) for t in minutes], ":", color=line.get_color(),
                    linewidth=1.2, label=labels["redone"])
        best = young_interval(save_s, mtbf_s)
        ax.plot(best / 60, 100 * time_lost(best, save_s, mtbf_s), "o", color=line.get_color(),
                label=labels["young"] if index == 0 else None)
    ax.set_ylim(0, 4 * 100 * time_lost(young_interval(max(saves_s), mtbf_s), max(saves_s), mtbf_s))
    ax.set_xlabel(labels["interval"])
    ax.set_ylabel(labels["lost"])
    legend(ax)
    fig.tight_layout()
    return fig


def memory_profile_figure(results: list[dict], lang: str = "en") -> Figure:
    """Stacked bars per rank (optimizer state at the bottom, then gradients and parameters) and
    the line 12P/N (+ padding), which meets the top of the optimizer segment when ZeRO-1 holds.

    A last bar, "DDP (12P)", stacks the same parts for DDP with a master copy and Adam: rank 0's
    parameters and gradients over 12P bytes of optimizer state, whole on every rank."""
    labels, fig, ax = start_figure(LABELS, lang, figsize=(6.5, 3.6))
    ranks = [r["rank"] for r in results]
    numel, padding = results[0]["numel"], results[0]["padding"]
    ddp = {**results[0]["memory"], "optimizer": 12 * numel}
    columns = [r["memory"] for r in results] + [ddp]
    positions = ranks + [len(ranks) + 0.25]  # a little apart from the ranks' bars
    bottoms = [0] * len(columns)
    for part, colour in (("optimizer", "#1f77b4"), ("gradients", "#c7c7c7"), ("parameters", "#8fbbd9")):
        heights = [memory[part] for memory in columns]
        ax.bar(positions, heights, bottom=bottoms, color=colour, label=labels[part])
        bottoms = [b + h for b, h in zip(bottoms, heights)]
    ax.axhline(12 * (numel + padding) / len(results), color="#d62728", linestyle="--",
               label=labels["formula"])
    fig = label_ranks(fig, ax, ranks, labels, labels["bytes"], lang)  # the legend under the bars
    ax.set_xticks(positions, [language.numbered(labels["rank"], r, lang) for r in ranks] + [labels["ddp"]])
    fig.tight_layout()
    return fig


def crash_figure(result, lang: str = "en") -> Figure:
    """Loss per step of a run killed part-way, the same command run again, and a run that never
    stopped (`capstone.crash.CrashAndResume`): the crash and the checkpoint resumed from marked.

    The run again draws only the steps it trained itself; they lie on the steps the killed run
    trained after that checkpoint, and both on the uninterrupted run's curve, when the resume is
    exact.
    """
    labels, fig, ax = start_figure(LABELS, lang, figsize=(6.5, 4.6))
    curve = lambda rows: ([r["step"] for r in rows if "event" not in r],  # noqa: E731
                          [r["loss"] for r in rows if "event" not in r])
    ax.plot(*curve(result.uninterrupted), color="#c7c7c7", linewidth=6, label=labels["never_stopped"])
    ax.plot(*curve(result.killed), color="#1f77b4", marker="o", markersize=4,
            label=number(labels["killed"].format(step=result.crash_step), lang))
    after = [r for r in result.continued if r.get("step", 0) > result.resume_step]
    ax.plot(*curve(after), color="#ff7f0e", linestyle="--", marker="x", markersize=7,
            label=number(labels["continued"].format(step=result.resume_step), lang))
    ax.axvline(result.crash_step, color="#d62728", linestyle="-", linewidth=1, label=labels["crash"])
    ax.axvline(result.resume_step, color="#2ca02c", linestyle=":", linewidth=1.5,
               label=labels["resume"])
    ax.set_xlabel(labels["step"])
    ax.set_ylabel(labels["loss"])
    legend_below(ax, ncol=2)  # under the axes: no curve is covered
    fig.tight_layout()
    return fig

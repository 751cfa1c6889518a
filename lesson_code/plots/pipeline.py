"""Figures and tables of lesson 79: Gantt charts of pipeline steps, the bubble against m.

Drawn from events measured on real ranks by `pipeline_lab.timed_steps` (or made by
`pipeline.ideal_timeline`): (stage, micro-batch, "F" or "B", start, end), in seconds from the
step's start.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from lesson_code.pipeline import bubble_fraction, theoretical_bubble
from lesson_code import language
from lesson_code.plots import FIGURE_WIDTH, legend_below, number, start_figure
from lesson_code.plots.tables import translate

LABELS = {
    "en": {"stage": "stage", "time": "time (ms)", "slots": "time (slots: a forward takes 1, a backward 2)",
           "block_slots": "time (slots: one block's forward takes 1, its backward 2)", "F": "forward", "B": "backward",
           "micro": "micro-batches m", "bubble": "bubble (idle fraction)",
           "measured": "measured, P = {p}", "formula": "(P − 1)/(m + P − 1), P = {p}",
           "floor": "imbalance floor, P = {p}", "model": "model of unequal stages, P = {p}",
           "panel": "{name}: a step of {span} ms, bubble {bubble}",
           "panel_slots": "{name}: a step of {span} slots, bubble {bubble}",
           "rank": "rank", "I": "backward, input's gradient (I)", "W": "backward, weights' gradient (W)",
           "later": "the rank's later stage (hatched)",
           "rank_slots": "time (slots: a forward of all a rank's layers takes 1)",
           "panel_rank": "{name}: a step of {span} slots, idle {bubble}"},
    "fa": {"stage": "مرحله", "time": "زمان (میلی‌ثانیه)", "slots": "زمان (بازه‌ها: هر گذر رفت ۱ بازه و هر گذر برگشت ۲ بازه)",
           "block_slots": "زمان (بازه‌ها: گذر رفتِ هر بلوک ۱ بازه و گذر برگشتش ۲ بازه)", "F": "گذر رفت", "B": "گذر برگشت",
           "micro": "تعداد میکرودسته‌ها m", "bubble": "حباب (کسر زمان بیکاری)",
           "measured": "اندازه‌گیری‌شده، P = {p}", "formula": "(P − 1)/(m + P − 1)، P = {p}",
           "floor": "کف ناترازی، P = {p}", "model": "مدل مرحله‌های نابرابر، P = {p}",
           "panel": "{name}: گامی {span} میلی‌ثانیه‌ای، حباب {bubble}",
           "panel_slots": "{name}: گامی {span} بازه‌ای، حباب {bubble}",
           "rank": "رتبه", "I": "گذر برگشت، گرادیان ورودی (I)", "W": "گذر برگشت، گرادیان وزن‌ها (W)",
           "later": "مرحلهٔ دومِ هر رتبه (هاشورخورده)",
           "rank_slots": "زمان (بازه‌ها: گذر رفتِ همهٔ لایه‌های یک رتبه ۱ بازه طول می‌کشد)",
           "panel_rank": "{name}: گامی {span} بازه‌ای، بیکاری {bubble}"},
}
# Table labels of the Persian edition (the English labels are the keys).
TABLE_WORDS = {"fa": {
    **language.TERMS,
    "layers": "لایه‌ها", "order": "ترتیب",
    "schedule": "زمان‌بندی", "extra_warmup": "گرم‌کردن اضافه (`extra_warmup`)",
    "max_grad_diff": "بیشینهٔ اختلاف گرادیان", "loss_diff": "اختلاف زیان",
    "all_layers_once": "هر لایه یک بار", "replica": "نسخه",
    "lowest": "کمترین", "highest": "بیشترین",
    "imbalance_floor": "کف ناترازی", "step_s": "ثانیه در هر گام", "bubble": "حباب",
    "computed_by": "حساب‌شده با",
    "max grad diff": "بیشینهٔ اختلاف گرادیان", "bubble, balanced": "حباب، متوازن",
    "bubble, 5 + 3 layers": "حباب، ۵ + ۳ لایه", "micro-batches": "میکرودسته‌ها",
    "stage 0 under GPipe": "مرحلهٔ ۰ در GPipe", "stage 0 under 1F1B": "مرحلهٔ ۰ در 1F1B",
    "balanced": "متوازن", "5 + 3 layers": "۵ + ۳ لایه", "floor": "کف ناترازی",
    # values: the schedules as pipeline.SCHEDULES names them, and the layers of MiniGPT
    "gpipe": "GPipe", "1f1b": "1F1B", "embedding": "لایهٔ جاسازی", "block": "بلوک",
    "head": "لایهٔ خروجی", "unequal_model": "مدل مرحله‌های نابرابر",
    "reshard_after_forward": "`reshard_after_forward`", "units": "واحدهای FSDP",
    "all_gathers": "شمار گردآوری همگانی", "reduce_scatters": "شمار کاهش و پخش",
    "gradient_elements_kept": "عنصرهای گرادیانِ نگه‌داشته", "stage_parameters": "پارامترهای مرحله",
    "rank_0_stages": "مرحله‌های رتبهٔ ۰", "rank_1_stages": "مرحله‌های رتبهٔ ۱",
    "times_the_stored_1F1B_step": "چند برابرِ گام 1F1B در محک ذخیره‌شده",
    "or, instead: Megatron's distributed optimizer": "یا به‌جای آن: بهینه‌ساز توزیع‌شدهٔ Megatron",
    "per GPU, split over 8: Megatron's state + 1F1B activations":
        "برای هر GPU، با تقسیم روی ۸: وضعیت Megatron و فعال‌سازی‌های 1F1B",
    "per GPU, split over 8: ZeRO-1 state + 1F1B activations":
        "برای هر GPU، با تقسیم روی ۸: وضعیت ZeRO-1 و فعال‌سازی‌های 1F1B",
    "left out: stage 0's embedding, unsplit": "کنارگذاشته‌شده: جاسازیِ مرحلهٔ ۰، بدون تقسیم",
    "boundaries_crossed": "مرزهای پیموده‌شده در مسیر رفت",
    "model state, Adam in mixed precision": "وضعیت مدل، Adam با دقت ترکیبی",
    "bf16 weights ZeRO-3 gathers per pass": "وزن‌های bf16 که ZeRO-3 در هر گذر گرد می‌آورد",
    "bf16 activations at one cut, per sequence": "فعال‌سازی‌های bf16 در یک برش، برای هر دنباله",
    "ZeRO-3 rank, sent per step (at least)": "هر رتبهٔ ZeRO-3، ارسال در هر گام (دست‌کم)",
    "pipeline stage, sent per step": "هر مرحلهٔ پایپلاین، ارسال در هر گام",
    "stage at P = 8, sent per step: all-reduce of its bf16 gradients over its 8 replicas":
        "هر مرحله در P = ۸، ارسال در هر گام: کاهش همگانی گرادیان‌های bf16 آن روی ۸ رونوشتش",
    "stage at P = 8, sent per step: ZeRO-3 over its 8 replicas (one gather per step)":
        "هر مرحله در P = ۸، ارسال در هر گام: ZeRO-3 روی ۸ رونوشتش (یک گردآوری در هر گام)",
    "stage at P = 8, in all, with the all-reduce (350 GB a rank between steps: does not fit)":
        "هر مرحله در P = ۸، روی هم، با کاهش همگانی (۳۵۰ گیگابایت برای هر رتبه میان گام‌ها: جا نمی‌شود)",
    "stage at P = 8, in all, with ZeRO-3 (44 GB a rank between steps)":
        "هر مرحله در P = ۸، روی هم، با ZeRO-3 (۴۴ گیگابایت برای هر رتبه میان گام‌ها)",
    "GB sent per step: gradients": "گیگابایت ارسالی در هر گام: گرادیان‌ها",
    "GB sent per step: in all": "گیگابایت ارسالی در هر گام: روی هم",
    "GB on stage 0 at the step's peak, at least": "گیگابایت روی مرحلهٔ ۰ در بیشینهٔ حافظهٔ گام، دست‌کم",
    "fits in 80 GB": "جا شدن در ۸۰ گیگابایت", "yes": "بله", "no": "خیر",
    "all-reduce over the 8 replicas": "کاهش همگانی روی ۸ رونوشت", "ZeRO-3 over the 8 replicas": "ZeRO-3 روی ۸ رونوشت",
    "stage total: one micro-batch of one sequence": "کل مرحله: یک میکرودسته با یک دنباله",
    "stage total: GPipe, m = 32": "کل مرحله: GPipe، m = ۳۲", "stage total: 1F1B, stage 0": "کل مرحله: 1F1B، مرحلهٔ ۰",
    "model state of one stage of 8": "وضعیت مدلِ یکی از ۸ مرحله",
    "the same, tensor parallel over 8 GPUs": "همان، با موازی‌سازی تنسوری روی هشت GPU",
    "the same, and ZeRO-1 over 8 replicas": "همان، و ZeRO-1 روی ۸ نسخه",
    "GPipe with re-materialization, m = 32": "GPipe با بازمحاسبه، m = ۳۲",
    "per GPU, split over 8: 1F1B, stage 0": "برای هر GPU، با تقسیم روی ۸: 1F1B، مرحلهٔ ۰",
    "this run, GPipe": "این اجرا، GPipe", "this run, 1F1B": "این اجرا، 1F1B",
    "stored benchmark, 1F1B": "محک ذخیره‌شده، 1F1B",
    "message at one cut, one sequence": "پیام در یک برش، یک دنباله",
    "forward of one stage of 8, one sequence": "گذر رفتِ یکی از ۸ مرحله، یک دنباله",
    "ms (modelled)": "میلی‌ثانیه (مدل‌سازی‌شده)", "P_times_busy": "P (۱ − حباب)",
    "unsplit_loss": "زیان مدل تقسیم‌نشده", "norm": "نُرم گرادیان",
    "unsplit_norm": "نُرم گرادیان مدل تقسیم‌نشده", "max_weight_diff": "بیشینهٔ اختلاف وزن",
    "stage_0_own_norm": "نُرم خودِ مرحلهٔ ۰", "stage_1_own_norm": "نُرم خودِ مرحلهٔ ۱",
    "own_norm_weight_diff": "بیشینهٔ اختلاف وزن، هر مرحله با نُرم خودش",
    "held_on_rank_0_virtual_stages": "فعال‌سازی‌های مرحلهٔ مجازیِ نگه‌داشته روی رتبهٔ ۰",
    "a slot, lesson 79's step at P = 2, m = 16 (ms)": "یک بازه، گام درس ۷۹ در P = ۲ و m = ۱۶ (میلی‌ثانیه)",
    "0.3 slot: one message (ms)": "۰٫۳ بازه: یک پیام (میلی‌ثانیه)",
    "one message: 8 sequences' float32 activation (kB)": "یک پیام: فعال‌سازی float32 هشت دنباله (کیلوبایت)",
    "lesson 76: naive all-reduce of one message's 262 kB, 4 ranks: 6 transfers (ms)":
        "درس ۷۶: کاهش همگانی ساده‌لوحانهٔ ۲۶۲ کیلوبایتِ یک پیام، ۴ رتبه: ۶ انتقال (میلی‌ثانیه)",
    "from the stored benchmarks": "از محک‌های ذخیره‌شده",
    "held_on_rank_0": "میکرودسته‌های نگه‌داشته روی رتبهٔ ۰", "held_on_last_rank": "میکرودسته‌های نگه‌داشته روی رتبهٔ آخر",
    "stages_per_rank": "مرحله‌ها در هر رتبه", "modelled_idle": "سهم بیکاری (مدل‌سازی‌شده)",
    "messages_each_way": "پیام‌ها در هر جهت برای هر میکرودسته", "whole_stages_held": "معادل مرحله‌های کامل",
    "tied gradient, sent by each stage": "گرادیان ماتریس مشترک، فرستادهٔ هر مرحله",
    "activation gradients, sent by the last stage": "گرادیان فعال‌سازی‌ها، فرستادهٔ مرحلهٔ آخر",
    "bytes per step": "بایت در هر گام", "GB": "گیگابایت",
    "after the all-reduce": "پس از کاهش همگانی", "each copy's own share": "سهم خودِ هر رونوشت",
    "the same, each of 8 ranks sending 1/8": "همان، هر یک از ۸ رتبه یک‌هشتمِ آن را می‌فرستد",
    "forward of one stage of 8, over 8 GPUs": "گذر رفتِ یکی از ۸ مرحله، روی هشت GPU",
    "share of a forward": "سهم از یک گذر رفت",
    "max_abs_grad": "بیشینهٔ قدر مطلق گرادیان", "relative_diff": "اختلاف نسبی",
    "micro_batches_of_rank_layers": "میکرودسته‌ها، بر حسب همهٔ لایه‌های رتبه", "order_from": "منبع ترتیب",
    "ideal_gpipe": "آرمانی، GPipe", "ideal_1f1b": "آرمانی، 1F1B",
    "tied gradient, sent by each stage (ring model)": "گرادیان ماتریس مشترک، فرستادهٔ هر مرحله (مدل حلقه)",
    "held_bytes": "بایت‌های نگه‌داشته میان گذرها", "peak_bytes": "بیشینهٔ بایت‌های هم‌زمان در حافظه",
    "step_ratio": "نسبت زمان گام (۴ مرحله به ۲)",
    "micro_batch_bytes": "بایت‌های یک میکرودسته",
    "forwards": "گذرهای رفت", "recompute": "بازمحاسبه",
    "fill and drain: 2 (P - 1) messages": "پر و خالی شدن پایپلاین: ۲ (P − ۱) پیام",
    "1F1B step, m = 32 (backward = 2 forwards)": "گام 1F1B، m = ۳۲ (هر گذر برگشت برابر دو گذر رفت)",
    "share of the step": "سهم از گام",
    "stage total: 1F1B re-materialized, stage 1": "کل مرحله: 1F1B با بازمحاسبه، مرحلهٔ ۱",
    "note, left out: the last stage's bf16 logits, one sequence":
        "یادداشت، کنارگذاشته‌شده: لوجیت‌های bf16 مرحلهٔ آخر، یک دنباله",
    "ms, whole message": "میلی‌ثانیه، پیام کامل", "ms, 1/8 per rank": "میلی‌ثانیه، یک‌هشتم برای هر رتبه",
    "micro-batches held on stage 0": "میکرودسته‌های نگه‌داشته روی مرحلهٔ ۰",
    "1F1B, one more warm-up forward": "1F1B، با یک گذر رفتِ اضافه در گرم‌کردن",
    "per GPU, split over 8: 1F1B re-materialized, stage 1": "برای هر GPU، با تقسیم روی ۸: 1F1B با بازمحاسبه، مرحلهٔ ۱",
    "per GPU, split over 8: GPipe re-materialized, m = 32": "برای هر GPU، با تقسیم روی ۸: GPipe با بازمحاسبه، m = ۳۲",
    "note: one micro-batch, attention matrix stored, 96 heads": "یادداشت: یک میکرودسته، با ذخیرهٔ ماتریس توجه، ۹۶ سر",
    "1F1B model at the measured busy times": "مدل 1F1B با زمان‌های مشغولیِ اندازه‌گیری‌شده",
    "model, 0.3 slot per message": "مدل، ۰٫۳ بازه برای هر پیام",
}}



def table(frame, lang: str = "en"):
    """A lesson-79 table with its labels in `lang` (`plots.tables.translate`)."""
    return translate(frame, TABLE_WORDS, lang)


COLOURS = {"F": "#8fbbd9", "B": "#1f77b4", "I": "#ff7f0e", "W": "#2ca02c"}


def gantt_figure(runs: dict[str, list[tuple]], lang: str = "en", slots: bool = False,
                 per_block: bool = False) -> Figure:
    """One Gantt panel per schedule: a row per stage, a box per forward/backward, numbered.

    Times are seconds of a measured step, drawn in milliseconds; with `slots`, the time units
    of `pipeline.ideal_timeline` (a forward takes 1), drawn as they are. The panels share one
    time axis, so that a longer step draws longer, and each title gives its step's length (to a
    tenth of a slot, in whole milliseconds) and `pipeline.bubble_fraction`. With `per_block`
    (and `slots`), the axis says that a slot is one block's forward, for stages whose forwards
    last their number of blocks."""
    scale = 1 if slots else 1e3
    labels, fig, axes = start_figure(LABELS, lang, len(runs), 1, figsize=(FIGURE_WIDTH, 1.4 + 1.8 * len(runs)),
                                     squeeze=False, sharex=True)
    for ax, (title, events) in zip(axes[:, 0], runs.items()):
        stages = sorted({e[0] for e in events})
        span = scale * (max(e[4] for e in events) - min(e[3] for e in events))
        span = round(span, 1) if slots and round(span, 1) != round(span) else round(span)  # 34.5 slots
        ax.set_title(labels["panel_slots" if slots else "panel"].format(
            name=title, span=number(span, lang),
            bubble=language.number(bubble_fraction(events, len(stages)), lang, ".2f")))
        for stage, micro, kind, start, end in events:
            ax.barh(stage, scale * (end - start), left=scale * start, height=0.7,
                    color=COLOURS[kind], edgecolor="white")
            ax.text(scale * (start + end) / 2, stage, number(micro, lang), ha="center", va="center",
                    fontsize=10, color="black" if kind == "F" else "white")
        ax.set_yticks(stages, [language.numbered(labels["stage"], s, lang) for s in stages])
        ax.invert_yaxis()
    axes[-1, 0].set_xlabel(labels[("block_slots" if per_block else "slots") if slots else "time"])
    handles = [plt.Rectangle((0, 0), 1, 1, color=COLOURS[k]) for k in "FB"]
    fig.legend(handles, [labels["F"], labels["B"]], loc="lower center", ncol=2,
               markerfirst=lang != "fa")
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig


def rank_gantt_figure(runs: dict[str, list[tuple]], lang: str = "en") -> Figure:
    """One Gantt panel per schedule, a row per rank: the events of
    `pipeline_exercises.modelled_events`, (rank, stage, kind, micro-batch, start, end), in its
    slots (a forward of all a rank's layers takes 1). A box per F, B, I or W, hatched when it
    belongs to a stage after the rank's first. The panels share one time axis; each title gives
    its step's length and its idle fraction, 1 - busy / (ranks x step)."""
    labels, fig, axes = start_figure(LABELS, lang, len(runs), 1, figsize=(FIGURE_WIDTH, 1.4 + 1.5 * len(runs)),
                                     squeeze=False, sharex=True)
    kinds = []
    for ax, (title, events) in zip(axes[:, 0], runs.items()):
        ranks = sorted({e[0] for e in events})
        first = {rank: min(e[1] for e in events if e[0] == rank) for rank in ranks}
        span = max(e[5] for e in events)
        idle = 1 - sum(e[5] - e[4] for e in events) / (len(ranks) * span)
        ax.set_title(labels["panel_rank"].format(name=title, span=language.number(span, lang, "g"),
                                                 bubble=language.number(idle, lang, ".2f")))
        for rank, stage, kind, _, start, end in events:
            ax.barh(rank, end - start, left=start, height=0.7, color=COLOURS[kind], edgecolor="white",
                    linewidth=0.5, hatch="///" if stage != first[rank] else None)
            kinds += [kind] if kind not in kinds else []
        ax.set_yticks(ranks, [language.numbered(labels["rank"], r, lang) for r in ranks])
        ax.invert_yaxis()
    axes[-1, 0].set_xlabel(labels["rank_slots"])
    shown = [k for k in "FBIW" if k in kinds]
    handles = [plt.Rectangle((0, 0), 1, 1, color=COLOURS[k]) for k in shown]
    handles.append(plt.Rectangle((0, 0), 1, 1, facecolor="#999999", edgecolor="white", hatch="///"))
    fig.legend(handles, [labels[k] for k in shown] + [labels["later"]], loc="lower center", ncol=2,
               markerfirst=lang != "fa")
    fig.tight_layout(rect=(0, 0.05 + 0.04 * ((len(handles) + 1) // 2), 1, 1))
    return fig


def bubble_figure(measured: dict[int, dict[int, float]], lang: str = "en",
                  floors: dict[int, dict[int, float]] | None = None,
                  models: dict[int, dict[int, float]] | None = None,
                  ranges: dict[int, dict[int, tuple[float, float]]] | None = None) -> Figure:
    """Measured bubble against m (points) beside (P - 1)/(m + P - 1) (lines), for each P.

    `measured[P][m]` is the measured idle fraction with P stages and m micro-batches;
    `ranges[P][m]`, when given, its (lowest, highest) over the measured steps (error bars);
    `floors[P][m]`, when given, the measured imbalance floor (dotted); `models[P][m]`, when
    given, a modelled bubble, such as 1F1B's `pipeline.ideal_timeline` of unequal stages (dashed).
    """
    labels, fig, ax = start_figure(LABELS, lang, figsize=(6.5, 3.8))
    for stages, by_m in sorted(measured.items()):
        ms = sorted(by_m)
        # "P = 2" is a formula, as the prose's $P = 2$: its digit stays Latin in Persian too, like
        # the 1s of (P − 1)/(m + P − 1) beside it (plots.LATIN_SPAN), so no entry mixes digits.
        line, = ax.plot(ms, [theoretical_bubble(stages, m) for m in ms], "-",
                        label=labels["formula"].format(p=stages))
        spread = None
        if ranges and stages in ranges:  # distances below and above each point
            spread = [[by_m[m] - ranges[stages][m][0] for m in ms],
                      [ranges[stages][m][1] - by_m[m] for m in ms]]
        ax.errorbar(ms, [by_m[m] for m in ms], yerr=spread, fmt="o", capsize=3,
                    color=line.get_color(), label=labels["measured"].format(p=stages))
        for lines, style, key in ((models, "--", "model"), (floors, ":", "floor")):
            if lines and stages in lines:
                ax.plot(ms, [lines[stages][m] for m in ms], style, color=line.get_color(),
                        label=labels[key].format(p=stages))
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted({m for by_m in measured.values() for m in by_m}))
    ax.get_xaxis().set_major_formatter(plt.ScalarFormatter())
    ax.set_xlabel(labels["micro"])
    ax.set_ylabel(labels["bubble"])
    ax.set_ylim(0, 1)
    legend_below(ax, ncol=2)
    fig.tight_layout()
    return fig

"""Figures of lesson 77: the overlap timeline of a bucketed step, and time per phase per variant.

Both are drawn from measurements: `ddp_lab.overlap_timeline` (events of one real step on every
rank) and the stored benchmark (`bench.ddp`: median milliseconds per phase of each variant).
"""

from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.font_manager import FontProperties
from matplotlib.ticker import FuncFormatter

from lesson_code import ddp_lab, language
from lesson_code.plots import FIGURE_WIDTH, legend_below, start_figure
from lesson_code.plots.tables import translate

LABELS = {
    "en": {"forward": "forward", "backward": "backward", "wait": "waiting for the all-reduces",
           "check": "check and copy-back", "comm": "bucket all-reduce (ring thread)",
           "comm odd": "bucket all-reduce, buckets 1, 3, … (ring thread)",
           "comm even": "bucket all-reduce, buckets 2, 4, … (ring thread)",
           "ready": "bucket ready", "queued": "ready, all-reduce not yet started",
           "optimizer": "optimizer", "rank": "rank",
           "time": "time since the earliest rank began the step (ms)",
           "comm model": "bucket all-reduce (modelled link)", "modelled rank": "modelled rank",
           "modelled": "modelled, not measured",
           "lane": "{mb} MiB buckets", "one lane": "one bucket ({mb} MiB cap)", "time model": "time since the backward began (ms)",
           "ms": "ms per step", "range": "range of the rounds' steps",
           "variant": "variant (bucket size in MiB)", "naive": "naive", "bucketed": "bucketed",
           "torch": "torch DDP", "ring": "ring", "builtin": "built-in"},
    "fa": {"forward": "گذر رفت", "backward": "گذر برگشت", "wait": "انتظار برای کاهش‌های همگانی",
           "check": "بررسی و کپی در گرادیان‌ها", "comm": "کاهش همگانی باکت (رشتهٔ حلقه)",
           "comm odd": "کاهش همگانی باکت‌های ۱، ۳، … (رشتهٔ حلقه)",
           "comm even": "کاهش همگانی باکت‌های ۲، ۴، … (رشتهٔ حلقه)",
           "ready": "باکت آماده", "queued": "آماده، کاهش همگانی هنوز آغاز نشده",
           "optimizer": "بهینه‌ساز",
           # Milliseconds in words, as the benchmark figure's axis of the same page says them.
           "time": "زمان از آغاز گام در زودترین رتبه (میلی‌ثانیه)",
           "comm model": "کاهش همگانی باکت (پیوند مدل‌شده)", "modelled rank": "رتبهٔ مدل‌شده",
           "modelled": "مدل‌شده، نه اندازه‌گیری‌شده",
           "lane": "باکت‌های {mb} MiB", "one lane": "یک باکت، سقف {mb} MiB", "time model": "زمان از آغاز گذر برگشت (ms)",
           "rank": "رتبه",
           "ms": "میلی‌ثانیه در هر گام", "range": "گسترهٔ زمان گام در دورها",
           # No parentheses around «MiB»: its left-to-right isolate would split the pair.
           "variant": "گونه، اندازهٔ باکت به MiB",
           **{name: ddp_lab.WORDS[name] for name in (*ddp_lab.WRAPPERS, "ring", "builtin")}},
}
TICK_GAP_PT = 4  # a bucket number's distance right of its ready tick, in points
QUEUED_MIN_S = 1e-3  # a measured all-reduce that starts this long after its bucket is ready
QUEUE_STEP = 0.045  # lane units between the heights of grey queue lines that overlap in time
QUEUE_HEIGHTS = 5  # on the tick and two each side: all inside the 0.2 gap between the bars
COLOURS = {"forward": "#8fbbd9", "backward": "#1f77b4", "wait": "#d62728", "check": "#9467bd",
           "comm": "#ff9f4a", "comm odd": "#c4620f", "optimizer": "#2ca02c"}


def overlap_timeline_figure(timelines: list[dict], lang: str = "en", modelled: bool = False,
                            lanes: list[str] | None = None) -> Figure:
    """One lane pair per rank: compute (forward, backward, wait and, when the timeline has it,
    the check and copy-back) above, bucket reductions below. With `modelled`, timelines of
    `ddp_lab.overlap_model`, titled and labelled as a model (its link, a modelled rank, or
    `lanes`: one name per timeline)."""
    labels, fig, ax = start_figure(LABELS, lang, figsize=(FIGURE_WIDTH, 1.6 + 0.9 * len(timelines)))
    comm = labels["comm model"] if modelled else labels["comm"]
    numbers = []  # (rank, level, ready ms, y, text) of each measured bucket's ready tick
    queued_named = False  # the legend names the grey queue line once
    for rank, timeline in enumerate(timelines):
        y = rank * 2.5
        for phase in [p for p in ("forward", "backward", "wait", "check") if p in timeline]:
            start, end = timeline[phase]
            ax.barh(y + 1, 1e3 * (end - start), left=1e3 * start, height=0.8,
                    color=COLOURS[phase], label=labels[phase] if rank == 0 else None)
        queue_ends = []  # of each height a grey queue line may take, where its last line ends
        for bucket in timeline["buckets"]:
            # Measured: neighbouring buckets in two shades, and each ready tick numbered, so
            # that a tick can be matched with the all-reduce it starts (bucket 1 first); the
            # numbers alternate above and below the lane, so that close ticks' numbers stay apart;
            # the legend names both shades (buckets 1, 3, ... light; 2, 4, ... dark).
            darker = not modelled and bucket["bucket"] % 2 == 1  # buckets 2, 4, ... from 1
            shade = comm if modelled else labels["comm even" if darker else "comm odd"]
            first_of_its_shade = rank == 0 and bucket["bucket"] < (1 if modelled else 2)
            ax.barh(y, 1e3 * (bucket["end"] - bucket["start"]), left=1e3 * bucket["start"],
                    height=0.8, color=COLOURS["comm odd" if darker else "comm"], edgecolor="white",
                    label=shade if first_of_its_shade else None)
            ax.plot(1e3 * bucket["ready"], y + 0.5, "k|", markersize=10,
                    label=labels["ready"] if rank == 0 and bucket["bucket"] == 0 else None)
            if not modelled and bucket["start"] - bucket["ready"] >= QUEUED_MIN_S:
                # Measured: a grey line from the ready tick to the bar's start shows the wait
                # for the previous all-reduce to end, or for a core. Lines that overlap in time
                # take different heights (the first free one of: on the tick, below, above), and
                # each ends in a short bar, so that queued buckets never merge into one line.
                level = next((i for i, end in enumerate(queue_ends) if end <= bucket["ready"]),
                             len(queue_ends))
                queue_ends[level:level + 1] = [bucket["start"]]
                height = level % QUEUE_HEIGHTS  # a sixth overlapping line shares a height
                queue_y = y + 0.5 + QUEUE_STEP * ((height + 1) // 2) * (1 if height % 2 else -1)
                ax.plot([1e3 * bucket["ready"], 1e3 * bucket["start"]], [queue_y] * 2, color="0.55",
                        lw=1.0, solid_capstyle="butt", marker="|", markevery=[1], markersize=4,
                        label=None if queued_named else labels["queued"])
                queued_named = True
            if not modelled:
                numbers.append((rank, bucket["bucket"] % 2, 1e3 * bucket["ready"], y + 0.5,
                                language.number(bucket["bucket"] + 1, lang)))
    if lanes is None:
        lanes = ([labels["modelled rank"]] if modelled else
                 [language.numbered(labels["rank"], rank, lang) for rank in range(len(timelines))])
    ax.set_yticks([rank * 2.5 + 0.5 for rank in range(len(timelines))], lanes)
    if modelled:
        ax.set_title(labels["modelled"])
    ax.invert_yaxis()
    ax.set_xlabel(labels["time model" if modelled else "time"])
    legend_below(ax, ncol=2)
    fig.tight_layout()
    _number_ticks(fig, ax, numbers)
    return fig


def _number_ticks(fig: Figure, ax, numbers: list[tuple]) -> None:
    """Write each bucket's number beside its ready tick, alternately above and below the lane.

    Where close ticks would make the numbers at one height overlap, a number moves right, past
    the previous one, and a thin line joins it to its tick: the numbers keep their order and
    every one stays readable. Drawn once the layout is final, as positions are worked out in
    points from the axes' width."""
    if not numbers:
        return
    low, high = ax.get_xlim()
    points_per_ms = ax.bbox.width * 72 / fig.dpi / (high - low)
    digit = 0.6 * FontProperties(size="small").get_size_in_points()  # a digit's width, about
    right_edge: dict[tuple, float] = {}  # (rank, level): where the last number there ends, pt
    for rank, level, ready_ms, y, text in sorted(numbers, key=lambda n: (n[0], n[2])):
        tick = (ready_ms - low) * points_per_ms
        offset = max(TICK_GAP_PT, right_edge.get((rank, level), -1e9) + 1.5 - tick)
        moved = offset > TICK_GAP_PT
        ax.annotate(text, (ready_ms, y), xytext=(offset, 5 if level else -5),
                    textcoords="offset points", ha="left", va="center", fontsize="small",
                    arrowprops=dict(arrowstyle="-", lw=0.5, color="0.3", shrinkA=0, shrinkB=0)
                    if moved else None)
        right_edge[(rank, level)] = tick + offset + digit * len(text)


def bucket_size_timelines_figure(models: dict[float, dict], lang: str = "en") -> Figure:
    """One modelled lane pair per bucket size: `models` maps a bucket cap (MiB) to what
    `ddp_lab.overlap_model` returns for it. Each lane shows the backward, the exposed wait after
    it, and every bucket's all-reduce on the modelled link, with the moment its bucket is ready.
    A lane whose cap leaves one bucket is named as one bucket, not as buckets of that size."""
    timelines = []
    for model in models.values():
        end = model["backward_s"] + model["exposed_s"]
        timelines.append({"backward": (0.0, model["backward_s"]), "wait": (model["backward_s"], end),
                          "buckets": [{**bucket, "bucket": index}
                                      for index, bucket in enumerate(model["buckets"])]})
    lanes = [LABELS[lang]["one lane" if len(model["buckets"]) == 1 else "lane"].format(mb=f"{mb:g}")
             for mb, model in models.items()]  # a cap that holds every gradient: one bucket
    return overlap_timeline_figure(timelines, lang, modelled=True, lanes=lanes)


def variant_label(row, labels: dict[str, str], lang: str) -> str:
    """A variant of the stored benchmark in two lines: its wrapper, then (for ours with buckets)
    its all-reduce and bucket size in MiB ("bucketed\nring 4")."""
    name = labels[row["wrapper"]]
    if row["wrapper"] == "naive":
        return name
    size = language.number(float(row["bucket_mb"]), lang, "g")
    return f"{name}\n{size}" if row["wrapper"] == "torch" else f"{name}\n{labels[row['comm']]} {size}"


def phase_breakdown_figure(bench, lang: str = "en") -> Figure:
    """Stacked bar per variant of the stored benchmark (`stored.load("ddp")`): the median
    forward, backward, wait (exposed communication), check and copy-back, and optimizer, in ms,
    with the range of the rounds' steps as a line. For torch DDP the wait and the rest are not
    separable and are part of its backward. The y axis stops a little above the highest bar and
    the second-highest line, so that one far-off round does not squeeze the rest: a line cut
    there carries its top, in ms, as text. Its ticks group thousands as that text does (1,500)."""
    labels, fig, ax = start_figure(LABELS, lang, figsize=(FIGURE_WIDTH, 4.2))
    rows = [row for _, row in bench.iterrows()]
    bottoms = [0.0] * len(rows)
    for phase in ("forward", "backward", "wait", "check", "optimizer"):
        heights = [0.0 if row[f"{phase}_ms"] != row[f"{phase}_ms"] else row[f"{phase}_ms"]
                   for row in rows]
        ax.bar(range(len(rows)), heights, bottom=bottoms, color=COLOURS[phase], label=labels[phase])
        bottoms = [b + h for b, h in zip(bottoms, heights)]
    highs = sorted(row["step_high_ms"] for row in rows)
    top = 1.08 * max(*bottoms, highs[-2] if len(highs) > 1 else highs[-1])
    for index, row in enumerate(rows):
        high = row["step_high_ms"]
        ax.plot([index, index], [row["step_low_ms"], min(high, top)], color="black", lw=1.5,
                label=labels["range"] if index == 0 else None)
        if high > top:
            ax.text(index + 0.1, top, language.number(high, lang, ",.0f") + " ↑",
                    ha="left", va="top", fontsize="small")
    ax.set_ylim(0, top)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda ms, _: language.number(ms, lang, ",.0f")))
    ax.set_xticks(range(len(rows)), [variant_label(row, labels, lang) for row in rows],
                  fontsize="small")
    ax.set_ylabel(labels["ms"])
    ax.set_xlabel(labels["variant"])
    handles, names = ax.get_legend_handles_labels()  # the line's key after the phases'
    legend_below(ax, ncol=3, below=0.9, handles=handles[1:] + handles[:1], labels=names[1:] + names[:1])
    fig.tight_layout()
    return fig


# The tables of lesson 77 in Persian: English label -> Persian term (book/fa/glossary.md).
TABLE_LABELS = {
    **language.TERMS,
    "norm before": "نُرم پیش از بازپخش", "norm after": "نُرم پس از بازپخش",
    "model": "مدل", "wrapper": "پوشاننده", "comm": "ارتباط",
    "ranks_identical": "رتبه‌ها یکسان", "max_param_diff": "بیشینهٔ اختلاف پارامتر",
    "max_param_diff_vs_torch": "بیشینهٔ اختلاف پارامتر با DDP در PyTorch",
    "max_loss_diff": "بیشینهٔ اختلاف زیان", "first_loss": "زیان نخستین گام",
    "last_loss": "زیان آخرین گام", "accumulation": "تعداد میکرودسته‌ها",
    "wait": "انتظار", "after backward": "پس از گذر برگشت",
    "forward ends": "پایان گذر رفت", "backward ends": "پایان گذر برگشت", "wait ends": "پایان انتظار",
    "wait after own backward": "انتظار پس از گذر برگشتِ خودش",
    "clipped once, after the average": "یک بار، پس از میانگین‌گیری",
    "clipped after every backward": "پس از هر گذر برگشت", "clip_grad_norm_ runs": "جای `clip_grad_norm_`",
    "check": "بررسی و کپی در گرادیان‌ها", "check (ms)": "بررسی (ms)", "step low": "کوتاه‌ترین گام در دورها",
    "step high": "بلندترین گام در دورها", "vs torch low": "نسبت به DDP در PyTorch، کمترین",
    "vs torch high": "نسبت به DDP در PyTorch، بیشترین", "vs one bucket": "نسبت به یک باکت",
    "vs one bucket low": "نسبت به یک باکت، کمترین", "vs one bucket high": "نسبت به یک باکت، بیشترین",
    "gradient tensors": "تنسورهای گرادیان",
    "latency, modelled (ms)": "تأخیر، مدل‌شده (ms)", "bytes, modelled (ms)": "بایت‌ها، مدل‌شده (ms)",
    "exposed comm, modelled (ms)": "ارتباط پنهان‌نشده، مدل‌شده (ms)",
    "backward + exposed, modelled (ms)": "گذر برگشت + ارتباط پنهان‌نشده، مدل‌شده (ms)",
    "link floor, modelled (ms)": "کف پیوند، مدل‌شده (ms)",
    "comm before backward end": "ارتباط پیش از پایان گذر برگشت",
    "each rank's loss": "زیان هر رتبه", "mean of its own tokens": "میانگین زیانِ توکن‌های خودش",
    "sum / global token count": "جمع / تعداد سراسری توکن‌ها",
    "largest difference from one process": "بزرگ‌ترین اختلاف با یک فرایند",
    "relative to the largest gradient element": "نسبت به بزرگ‌ترین عنصر گرادیان",
    "max_param_diff, float32": "بیشینهٔ اختلاف پارامتر، `float32`",
    "max_param_diff, bfloat16": "بیشینهٔ اختلاف پارامتر، `bfloat16`",
    "first-order estimate s·lr·N·2⁻⁸·max|g|": "برآورد مرتبهٔ اول `s·lr·N·2⁻⁸·max|g|`",
    "started during backward": "کاهش‌های همگانیِ آغازشده در حین گذر برگشت",
    "largest difference from the mean gradient": "بزرگ‌ترین اختلاف با میانگین گرادیان‌ها",
    "gradient all-reduces": "کاهش‌های همگانی گرادیان", "messages sent": "پیام‌های فرستاده‌شده",
    "bytes sent": "بایت‌های فرستاده‌شده",
    "check all-reduces (one number, outside the ledger)":
        "کاهش‌های همگانی بررسی (یک عدد، بیرون از دفتر ارتباطات)",
    "bucket MiB": "اندازهٔ باکت (MiB)",
    "vs torch": "نسبت به DDP در PyTorch", "communicator": "ارتباط‌دهنده", "figure": "کمیت",
    "key-bias gradient": "گرادیان بایاس کلید", "Adam eps": "`eps` در Adam",
    "first step / lr": "گام نخست / `lr`",
    "smallest max_param_diff": "کوچک‌ترین مقدار بیشینهٔ اختلاف پارامتر",
    "largest max_param_diff": "بزرگ‌ترین مقدار بیشینهٔ اختلاف پارامتر",
    "estimate 2 steps lr g/(g+eps)": "برآورد ۲ × گام‌ها × `lr` × g/(g+eps)",
    "hidden comm": "ارتباط پنهان‌شده", "comm during backward": "ارتباط هم‌زمان با گذر برگشت",
    "measured / model": "اندازه‌گیری‌شده / مدل",
    "exposed comm, α = 0 (ms)": "ارتباط پنهان‌نشده، α = ۰ (ms)",
    "efficiency, α = 0": "کارایی مقیاس‌پذیری، α = ۰",
    "mean over the 10 examples": "میانگین روی ۱۰ نمونه", "mean loss": "میانگین زیان",
    "all-reduced sums, padded": "جمع‌های کاهش همگانی‌شده، با پدینگ",
    "all-reduced sums, padding left out": "جمع‌های کاهش همگانی‌شده، بدون پدینگ",
    "evaluation": "ارزیابی",
    "buckets, our rule": "تعداد باکت‌ها، قاعدهٔ ما",
    "buckets, PyTorch's rule": "تعداد باکت‌ها، قاعدهٔ PyTorch",
    "benchmark MiniGPT": "MiniGPT محک", "cluster GPT-2 (modelled)": "GPT-2 در خوشه (مدل‌شده)",
    "buckets": "تعداد باکت‌ها", "exposed comm, model (ms)": "ارتباط پنهان‌نشده، مدل (ms)",
    "backward + exposed, model (ms)": "گذر برگشت + ارتباط پنهان‌نشده، مدل (ms)",
    "wait, measured (ms)": "انتظار، اندازه‌گیری‌شده (ms)",
    "GPUs": "تعداد GPUها", "step, model (ms)": "گام، مدل (ms)",
    "efficiency, model": "کارایی مقیاس‌پذیری، مدل", "speed-up, model": "تسریع، مدل",
    "backward + wait, measured (ms)": "گذر برگشت + انتظار، اندازه‌گیری‌شده (ms)",
    "step, measured (ms)": "گام، اندازه‌گیری‌شده (ms)",
    "key biases": "بایاس‌های کلید", "other parameters": "پارامترهای دیگر",
    "vs one process": "در برابر یک فرایند", "ours vs torch": "پوشانندهٔ ما در برابر DDP در PyTorch",
    "query bias": "بایاس پرسش", "key bias": "بایاس کلید", "value bias": "بایاس مقدار",
    "largest |gradient|": "بیشینهٔ |گرادیان|",
    "forward inside no_sync": "فقط گذر رفت درون `no_sync`",
    "backward inside no_sync": "فقط گذر برگشت درون `no_sync`",
    "gradients agree across ranks": "گرادیان‌های رتبه‌ها یکسان",
    "epoch 0": "دورهٔ ۰", "epoch 1": "دورهٔ ۱",
    "10 examples, drop_last=False": "۱۰ نمونه، `drop_last=False`",
    "10 examples, drop_last=True": "۱۰ نمونه، `drop_last=True`",
    **ddp_lab.WORDS,  # values: the runs' models, optimizers, wrappers and communicators
}


def localized(table, lang: str):
    """`table` (a DataFrame or Series) to show in edition `lang`: for "fa" its index and column
    labels, their names and a Series' name become the Persian terms in TABLE_LABELS (labels it
    lacks stay as they are; `plots.tables.translate`); for "en" it is returned unchanged. The
    values are never touched, so the code that computed and checked the table reads English
    labels in both editions, and the Persian table shows the English one's digits. Raises
    ValueError for another language."""
    return translate(table, {"fa": TABLE_LABELS}, lang)

"""Figures of lesson 78: memory per rank of DDP and ZeRO stages against N, and measured vs formula.

The first two are drawn from `lesson_code.memory` (arithmetic); the third from bytes measured on
real ranks by `zero_lab.memory_profile`. Lesson 78a's `stage3_timeline_figure` draws one ZeRO-3
step measured by `zero_lab.stage3_timeline` beside `memory.stage3_step`'s model.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from lesson_code import language, memory
from lesson_code.plots import (FIGURE_WIDTH, label_ranks, legend, number,
                               start_figure)
from lesson_code.plots.tables import translate

LABELS = {
    "en": {"ranks": "ranks N", "per_rank": "GB per rank", "saving": "saving vs DDP (%)",
           "title": "Mixed-precision Adam, {p}B parameters\n"
                    "model states; dashed: ZeRO-3 with its working set", "measured": "measured",
           "working": "ZeRO-3 + working set ({n} layers)",
           "formula": "formula 12 × shard", "bytes": "optimizer bytes per rank", "rank": "rank",
           "ddp": "DDP (every rank holds all)", "zero1": "ZeRO-1"},
    "fa": {"ranks": "تعداد رتبه‌ها N", "per_rank": "گیگابایت در هر رتبه",
           "saving": "صرفه‌جویی نسبت به DDP (٪)",
           "title": "Adam با دقت ترکیبی، {p} میلیارد پارامتر\n"
                    "\u200fوضعیت‌های مدل؛ خط‌چین: ZeRO-3 با حافظهٔ کاری‌اش",
           "working": "ZeRO-3 + حافظهٔ کاری ({n} لایه)",
           "measured": "اندازه‌گیری‌شده", "formula": "فرمول ۱۲ × شارد",
           "bytes": "بایت‌های بهینه‌ساز در هر رتبه", "rank": "رتبه",
           "ddp": "DDP (هر رتبه همه را دارد)", "zero1": "ZeRO-1"},
}


# The tables of lesson 78 in Persian: English label -> Persian term (book/fa/glossary.md).
TABLE_LABELS = {
    **language.TERMS,
    "params": "پارامترها", "grads": "گرادیان‌ها", "total": "جمع",
    "GB per rank under DDP": "گیگابایت در هر رتبه زیر DDP", "GB per rank": "گیگابایت در هر رتبه",
    "saving": "صرفه‌جویی (٪)", "bytes_per_param": "بایت برای هر پارامتر",
    "saving_percent": "صرفه‌جویی (٪)", "ddp": "DDP", "zero": "ZeRO-1",
    "naive_zero": "ZeRO ساده‌لوحانه", "torch_zero": "ZeroRedundancyOptimizer",
    "ZeRO-1 on 4 ranks": "ZeRO-1 روی ۴ رتبه", "torch.optim.Adam, one process": "torch.optim.Adam، یک فرایند",
    "DDP optimizer": "بهینه‌ساز DDP", "ZeRO-1 optimizer": "بهینه‌ساز ZeRO-1", "12 x shard": "۱۲ × شارد",
    "DDP + fp32-master Adam optimizer": "بهینه‌ساز DDP با Adam و وزن‌های اصلی fp32",
    "BucketedDDP optimizer": "بهینه‌ساز BucketedDDP",
    "DDP + ZeroRedundancyOptimizer": "DDP با ZeroRedundancyOptimizer",
    "naive step": "گام ساده‌لوحانه",
    "saving vs DDP (%)": "صرفه‌جویی نسبت به DDP (٪)",
    "torch.optim.AdamW, two groups": "torch.optim.AdamW، دو گروه",
    "torch.optim.AdamW, decay on all": "torch.optim.AdamW، واپاشی وزن روی همه",
    "largest difference, ZeRO-1 with groups": "بیشینهٔ قدر مطلق اختلاف، ZeRO-1 با گروه‌ها",
    "largest difference from torch.optim.Adam": "بیشینهٔ قدر مطلق اختلاف پارامترها با torch.optim.Adam",
    "relative L2 (%)": "فاصلهٔ نسبی L2 (٪)", "largest difference": "بیشینهٔ قدر مطلق اختلاف",
    "largest gradient": "بیشینهٔ قدر مطلق گرادیان",
    **{f"ZeRO-1, N={n}": f"ZeRO-1، N={n}" for n in (1, 2, 3, 4)},
    "ZeroRedundancyOptimizer, N=4": "ZeroRedundancyOptimizer، N=4",
    "the bound the cell asserts": "کرانی که سلول وارسی می‌کند",
    "comm": "ارتباطات", "MB sent": "مگابایت فرستاده",
    "optimizer compute": "محاسبهٔ بهینه‌ساز", "MB sent per step": "مگابایتِ فرستاده‌شده در هر گام",
    "vs our ddp": "نسبت به DDP ما", "vs torch zero": "نسبت به ZeroRedundancyOptimizer",
    "paper: bf16 + fp32 master (MIXED_ADAM)": "مقاله: bf16 با رونوشت اصلی fp32 (MIXED_ADAM)",
    "autocast, fp32 weights (FP32_ADAM)": "torch.autocast، وزن‌های fp32 (FP32_ADAM)",
    "our float32 runs (FP32_MASTER_ADAM)": "اجراهای float32 ما (FP32_MASTER_ADAM)",
    "bytes per parameter": "بایت برای هر پارامتر", "bytes sent, measured": "بایت فرستاده، اندازه‌گیری‌شده",
    "bytes sent, formula": "بایت فرستاده، فرمول", "memory per rank": "حافظه در هر رتبه",
    "model, ranks": "مدل، رتبه‌ها", "none fits": "هیچ‌کدام جا نمی‌شود",
    "H100 80 GB": "H100 با ۸۰ گیگابایت", "H200 141 GB": "H200 با ۱۴۱ گیگابایت",
    "B200 180 GB": "B200 با ۱۸۰ گیگابایت",
    "7B, N=8": "۷ میلیارد پارامتر، ۸ رتبه", "7B, N=64": "۷ میلیارد پارامتر، ۶۴ رتبه",
    "70B, N=8": "۷۰ میلیارد پارامتر، ۸ رتبه", "70B, N=64": "۷۰ میلیارد پارامتر، ۶۴ رتبه",
    "s at 50 GB/s (400 Gb/s network)": "ثانیه با ۵۰ گیگابایت بر ثانیه (شبکهٔ ۴۰۰ گیگابیت بر ثانیه)",
    "GB in backward": "گیگابایت در گذر برگشت", "GB in forward": "گیگابایت در گذر رفت",
    "GB in all": "کل گیگابایت", "GB in all, fp32 reduction": "کل گیگابایت، کاهش در fp32",
    "s of traffic in backward at 50 GB/s": "ثانیه‌های ترافیک در گذر برگشت، با ۵۰ گیگابایت بر ثانیه",
    "s of traffic in forward at 50 GB/s": "ثانیه‌های ترافیک در گذر رفت، با ۵۰ گیگابایت بر ثانیه",
    "s of traffic in all at 450 GB/s": "کل ثانیه‌های ترافیک، با ۴۵۰ گیگابایت بر ثانیه",
    "traffic at 50 GB/s (s)": "ترافیک با ۵۰ گیگابایت بر ثانیه (ثانیه)",
    "compute, 1 sequence (s)": "محاسبه، ۱ دنباله (ثانیه)",
    "compute, 8 sequences (s)": "محاسبه، ۸ دنباله (ثانیه)",
    "DDP + fp32-master Adam (ours)": "DDP با Adam و وزن‌های اصلی fp32 (کد ما)",
    "NaiveDDP + fp32-master Adam": "NaiveDDP با Adam و وزن‌های اصلی fp32",
    "Megatron-LM, fused Adam": "Megatron-LM، Adam ادغام‌شده",
    "DDP + autocast, bucket copy, fused Adam": "DDP با torch.autocast، رونوشت در باکت‌ها، Adam ادغام‌شده",
    "DDP + autocast, bucket view, fused Adam": "DDP با torch.autocast، نمای باکت، Adam ادغام‌شده",
    "the same, with autocast's bf16 weight casts": "همان، با رونوشت‌های bf16 وزن‌ها در torch.autocast",
    "DDP + autocast, bucket view, foreach Adam": "DDP با torch.autocast، نمای باکت، Adam چندتنسوری",
    "DDP + torch.optim.Adam": "DDP با torch.optim.Adam",
    "ZeRO-1 (ours)": "ZeRO-1 (کد ما)",
    "ZeRO-1 without a master copy": "ZeRO-1 بدون رونوشت اصلی",
    "bytes per parameter, float32 model": "بایت برای هر پارامتر، مدل float32",
    "gradient norm, 4 ranks": "نُرم گرادیان، ۴ رتبه", "clip_grad_norm_, one process": "clip_grad_norm_، یک فرایند",
    "optimizer bytes": "بایت‌های بهینه‌ساز", "measured on rank 0": "اندازه‌گیری‌شده روی رتبهٔ ۰",
    "formula 12 P/N, with padding": "فرمول ۱۲ × P/N، با پدینگ",
    "formula 12 P/N, without padding": "فرمول ۱۲ × P/N، بدون پدینگ",
    "run of exercise 3": "اجرای تمرین ۳", "stored benchmark": "محک ذخیره‌شده",
    "formula (MB)": "فرمول (مگابایت)", "peak (MB)": "بیشینه (مگابایت)",
    "after backward (MB)": "پس از گذر برگشت (مگابایت)", "after backward": "پس از گذر برگشت",
    "gradients at the peak": "گرادیان‌ها در لحظهٔ بیشینه", "gradients after step": "گرادیان‌ها پس از گام",
    "peak": "بیشینه", "bytes on rank 0": "بایت روی رتبهٔ ۰",
    "ranks of 4": "شمار رتبه‌ها از ۴", "inf on rank 1": "بی‌نهایت روی رتبهٔ ۱",
    "2e38 on every rank": "۲ × ۱۰³⁸ روی همهٔ رتبه‌ها", "local gradient finite (before the reduce)": "گرادیان محلی متناهی (پیش از کاهش)",
    "took step 1": "گام ۱ را انجام دادند", "took step 2": "گام ۲ را انجام دادند",
    "implementation": "پیاده‌سازی",
    "lowest stage that fits": "پایین‌ترین مرحله‌ای که جا می‌شود", "ranks N": "تعداد رتبه‌ها N",
}


def localized(table, lang: str):
    """`table` with its labels in edition `lang` (Persian terms from TABLE_LABELS for "fa")."""
    return translate(table, {"fa": TABLE_LABELS}, lang)


def stages_figure(params: float, world_sizes: list[int], lang: str = "en",
                  layers: int = 32) -> Figure:
    """Two panels against N: GB per rank of each stage, and its saving over DDP in percent.

    Both panels also draw, dashed, ZeRO-3's shards plus its working set for `layers` equal layers
    (`memory.stage3_working_bytes`, bf16 reduction): the floor that does not shrink with N, and the
    saving below 100% it leaves.
    """
    table = memory.memory_table(params, world_sizes)
    ddp = table[table.stage == "DDP"].set_index("N").total
    labels, fig, (left, right) = start_figure(LABELS, lang, 2, 1, figsize=(FIGURE_WIDTH, 7.4))
    for stage in memory.STAGES:
        rows = table[table.stage == stage]
        line, = left.plot(rows.N, rows.total / 1e9, marker="o", label=stage)
        right.plot(rows.N, rows.saving_percent, marker="o", label=stage)
        if stage == "ZeRO-3":
            working = memory.stage3_working_bytes(params / layers)
            dashed, = left.plot(rows.N, (rows.total + working) / 1e9, linestyle="--",
                                color=line.get_color(),
                                label=labels["working"].format(n=number(str(layers), lang)))
            floor = 100 * (1 - (rows.total.to_numpy() + working) / ddp.loc[rows.N].to_numpy())
            right.plot(rows.N, floor, linestyle="--", color=line.get_color())  # the saving it caps
    legend(left, handles=[*left.get_lines()[:-1], dashed], loc="lower center", ncol=3,
           bbox_to_anchor=(0.5, 1.02))  # the key of both panels, above the first
    for ax, ylabel in ((left, labels["per_rank"]), (right, labels["saving"])):
        ax.set_xscale("log", base=2)
        ax.set_xticks(world_sizes, [str(n) for n in world_sizes])
        ax.set_xlabel(labels["ranks"])
        ax.set_ylabel(ylabel)
    left.set_yscale("log")
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


# Lesson 78a: one ZeRO-3 step, unit by unit (`zero_lab.stage3_timeline` beside `memory.stage3_step`).
TIMELINE_LABELS = {
    "en": {"held": "MB held on rank 0", "time": "ms from the step's start (under the profiler)",
           "measured": "measured, from torch's allocator", "model": "model: shards, gathered units, buckets",
           "forward": "forward", "backward": "backward", "optimizer": "optimizer step",
           "gather": "gather", "compute": "compute", "reduce-scatter": "reduce-scatter",
           "free": "free", "embed": "embedding", "block": "block", "head": "head"},
    "fa": {"held": "مگابایت نگه‌داشته روی رتبهٔ ۰",
           "time": "میلی‌ثانیه از آغاز گام (با نیم‌رخ‌نگارِ روشن)",
           "measured": "اندازه‌گیری‌شده، از تخصیص‌دهندهٔ torch",
           "model": "مدل: شاردها، واحدهای گردآوری‌شده، باکت‌ها",
           "forward": "گذر رفت", "backward": "گذر برگشت", "optimizer": "گام بهینه‌ساز",
           "gather": "گردآوری", "compute": "محاسبه", "reduce-scatter": "کاهش و پخش",
           "free": "آزادسازی", "embed": "لایهٔ جاسازی", "block": "بلوک", "head": "لایهٔ خروجی"},
}
ACTION_COLOURS = {"gather": "#1f77b4", "compute": "#2ca02c", "reduce-scatter": "#ff7f0e",
                  "free": "#7f7f7f"}
OPTIMIZER_COLOUR = "#c7c7c7"


def unit_label(name: str, lang: str = "en") -> str:
    """A unit of MiniGPT as the figures and tables of lesson 78a name it: "block 2" for
    "blocks.2" («بلوک ۲»), "embedding" for "embed", "head"; another name as it is."""
    words = TIMELINE_LABELS[language.check_language(lang)]
    prefix, _, index = name.partition(".")
    if prefix == "blocks" and index.isdigit():
        return language.numbered(words["block"], int(index), lang)
    return words.get(name, name) if name in ("embed", "head") else name


def stage3_timeline_figure(timeline: dict, model: list[dict], lang: str = "en") -> Figure:
    """One ZeRO-3 step on one rank: above, the bytes held (measured, and `memory.stage3_step`'s
    model placed at the end of each measured event); below, each unit's gather, compute,
    reduce-scatter and free in forward and in backward, each block's spans marked with its number,
    then the optimizer step. Frees, too short to see, are left out of the legend."""
    labels, fig, (top, lanes) = start_figure(
        TIMELINE_LABELS, lang, 2, 1, figsize=(FIGURE_WIDTH, 5.6), sharex=True,
        gridspec_kw={"height_ratios": [3, 1.3]})
    times, held = zip(*timeline["memory"])
    top.step(times, [b / 1e6 for b in held], where="post", color="#333333", linewidth=1.2,
             label=labels["measured"])
    modelled = {(e["unit"], e["pass"], e["action"]): e["held"] for e in model}
    ends = [0.0] + [e["end_ms"] for e in timeline["events"]]
    levels = [model[0]["held"]] + [modelled[e["unit"], e["pass"], e["action"]]
                                   for e in timeline["events"]]
    top.step(ends, [b / 1e6 for b in levels], where="post", color="#d62728", linestyle="--",
             label=labels["model"])
    top.set_ylabel(labels["held"])
    top.set_ylim(bottom=0)
    legend(top, loc="lower right")
    rows = {"forward": 1, "backward": 0}
    for event in timeline["events"]:
        lanes.barh(rows[event["pass"]], event["end_ms"] - event["start_ms"], left=event["start_ms"],
                   height=0.7, color=ACTION_COLOURS[event["action"]], edgecolor="none")
    last = timeline["events"][-1]["end_ms"]
    lanes.barh(0, times[-1] - last, left=last, height=0.7, color=OPTIMIZER_COLOUR)
    for unit in (u for u in timeline["units"] if u.startswith("blocks.")):  # its number, in its spans
        for when, row in rows.items():
            span = [e for e in timeline["events"] if e["unit"] == unit and e["pass"] == when]
            lanes.text((span[0]["start_ms"] + span[-1]["end_ms"]) / 2, row,
                       number(int(unit.partition(".")[2]), lang), ha="center", va="center",
                       color="white", fontsize=10)
    lanes.set_yticks(list(rows.values()), [labels[when] for when in rows])
    lanes.set_ylim(-0.5, 1.5)
    lanes.set_xlabel(labels["time"])
    shown = {action: c for action, c in ACTION_COLOURS.items() if action != "free"}  # too short to see
    _colour_legend(fig, {**shown, "optimizer": OPTIMIZER_COLOUR}, labels, lang, 0.11)
    return fig


def _colour_legend(fig, colours: dict[str, str], labels: dict[str, str], lang: str,
                   bottom: float) -> None:
    """A legend of one colour patch per part of `colours`, named by `labels`, under the figure,
    whose axes end `bottom` (a fraction of its height) above its foot."""
    handles = [plt.Rectangle((0, 0), 1, 1, color=colour) for colour in colours.values()]
    fig.legend(handles, [labels[part] for part in colours], loc="lower center", ncol=3,
               markerfirst=lang != "fa")
    fig.tight_layout(rect=(0, bottom, 1, 1))


# The tables of lesson 78a in Persian: its own labels, beside lesson 78's (`TABLE_LABELS`).
STAGES_LABELS = {
    "unit": "واحد", "shard": "شارد (عنصر)", "gathered bytes": "بایت‌های گردآوری‌شده",
    "max |difference| after 10 steps": "بیشینهٔ |اختلاف| پس از ۱۰ گام",
    "ZeRO-2 vs torch.optim.Adam": "ZeRO-2 در برابر torch.optim.Adam",
    "ZeRO-3 vs torch.optim.Adam": "ZeRO-3 در برابر torch.optim.Adam",
    "fully_shard vs torch.optim.Adam": "`fully_shard` در برابر torch.optim.Adam",
    "ZeRO-3 vs fully_shard": "ZeRO-3 در برابر `fully_shard`",
    "zero2": "ZeRO-2", "zero3": "ZeRO-3", "step_ms": "گام (ms)", "comm_ms": "ارتباطات (ms)",
    "MB_sent_per_step": "مگابایتِ فرستاده‌شده در هر گام", "vs_ddp": "نسبت به DDP",
    "GB sent per rank": "گیگابایت فرستادهٔ هر رتبه",
    "seconds at 50 GB/s": "ثانیه با ۵۰ گیگابایت بر ثانیه",
    "s through network cards, 50 GB/s each": "ثانیه از راه کارت‌های شبکه، هر کدام ۵۰ گیگابایت بر ثانیه",
    "s over NVLink, 450 GB/s": "ثانیه روی NVLink، ۴۵۰ گیگابایت بر ثانیه",
    "gap (MB)": "فاصله (مگابایت)", "excess (MB)": "مازاد (مگابایت)", "optimizer step": "گام بهینه‌ساز",
    "peak_in": "بیشینه در", "held": "نگه‌داشته میان گام‌ها", "gathered": "گردآوری‌شده",
    "peak, this run": "بیشینه، همین اجرا",
    "peak, stored": "بیشینه، جدول ذخیره‌شده", "model's peak": "بیشینهٔ مدل حافظه",
    "forward peak, stored": "بیشینهٔ گذر رفت، جدول ذخیره‌شده",
    "MB on one rank": "مگابایت روی یک رتبه", "backward's peak (MB)": "بیشینهٔ گذر برگشت (مگابایت)",
    "bucket MB": "اندازهٔ باکت (مگابایت)", "held between steps (MB)": "نگه‌داشته میان گام‌ها (مگابایت)",
    "bucket cap (MiB)": "سقف باکت (مبی‌بایت)", "largest bucket (MB)": "بزرگ‌ترین باکت (مگابایت)",
    "added by the peak (MB)": "افزوده تا بیشینه (مگابایت)",
    "block and bucket, share of the peak": "سهم یک بلوک و باکتش از بیشینه",
    "ZeRO-3 (ours)": "ZeRO-3 (کد ما)", "FSDP2 stage in a pipeline": "مرحلهٔ FSDP2 در پایپلاین",
    "elements per step / Ψ(N-1)/N": "عنصر در هر گام / Ψ(N-1)/N",
    "micro-batches G": "تعداد میکرودسته‌ها G",
    "held between steps": "نگه‌داشته میان گام‌ها",
    "held after forward, unfreed": "نگه‌داشته پس از گذر رفت، بی‌آزادسازی",
    "ZeRO-2 formula": "فرمول ZeRO-2", "bytes on one rank": "بایت روی یک رتبه",
    "activations": "فعال‌سازی‌ها", "working set, fp32 reduction": "حافظهٔ کاری، کاهش fp32",
    "usable (90%)": "قابل‌استفاده (۹۰٪)",
    "activations and two left-out terms": "فعال‌سازی‌ها و دو موردِ کنارگذاشته",
    "states": "وضعیت مدل", "backward's peak": "بیشینهٔ گذر برگشت", "step's peak": "بیشینهٔ گام",
    "fits in 135.7 GB": "در ۱۳۵٫۷ گیگابایت جا می‌شود", "configuration": "پیکربندی",
    "FSDP2, fused AdamW": "FSDP2، AdamW ادغام‌شده", "FSDP2, foreach AdamW": "FSDP2، AdamW با `foreach`",
    "ZeRO-3 (ours), 2 + 2 + 12": "ZeRO-3 (کد ما)، ۲ + ۲ + ۱۲",
    "cost per step": "هزینه در هر گام", "GB": "گیگابایت", "GB/s": "گیگابایت بر ثانیه", "s": "ثانیه",
    "PCIe to the GPU, per GPU": "PCIe به سوی GPU، برای هر GPU",
    "PCIe back to the CPU, per GPU": "PCIe بازگشت به CPU، برای هر GPU",
    "Adam on the CPU, all 8 shards": "Adam روی CPU، هر ۸ شارد",
    "PCIe copies in host memory, all 8 GPUs": "رونوشت‌های PCIe در حافظهٔ میزبان، هر هشت GPU",
    "FSDP2, gradient sync off until the last": "FSDP2، همگام‌سازی گرادیان خاموش تا آخرین میکرودسته",
    "FSDP2, also set_reshard_after_backward(False)": "FSDP2، با `set_reshard_after_backward(False)` هم",
    "ms, modelled": "میلی‌ثانیه، مدل‌سازی‌شده",
    "all-gather of one layer (bf16)": "گردآوری همگانی یک لایه (bf16)",
    "reduce-scatter of one layer (fp32)": "کاهش و پخش یک لایه (fp32)",
    "backward of one layer": "گذر برگشت یک لایه",
    "backward of one layer, recomputing": "گذر برگشت یک لایه، با بازمحاسبه",
    "latency of one collective": "تأخیر یک عملیات جمعی",
    "latency of a step's 240 collectives": "تأخیر ۲۴۰ عملیات جمعی یک گام",
    "nodes of 8, bf16, bound": "گره‌های ۸تایی، bf16، کران بالا",
    "nodes of 8, fp32, bound": "گره‌های ۸تایی، fp32، کران بالا",
    "nodes of 8, bf16, walk": "گره‌های ۸تایی، bf16، لایه‌به‌لایه",
    "nodes of 8, fp32, walk": "گره‌های ۸تایی، fp32، لایه‌به‌لایه",
    "FSDP2, bf16 gather, fp32 reduction": "FSDP2، گردآوری bf16، کاهش fp32",
    "ZeRO-3 (ours), float32": "ZeRO-3 (کد ما)، float32",
    "MB allocated": "مگابایتِ تخصیص‌یافته", "before the step": "پیش از گام",
    "in forward": "در گذر رفت", "in backward": "در گذر برگشت", "in a gather": "در گردآوری",
    "in a reduce-scatter": "در کاهش و پخش", "in the step": "در گام بهینه‌ساز",
    "held between steps (MB), lowest rank": "نگه‌داشته میان گام‌ها (مگابایت)، کمترین میان رتبه‌ها",
    "peak (MB), lowest rank": "بیشینه (مگابایت)، کمترین میان رتبه‌ها",
    "peak (MB), highest rank": "بیشینه (مگابایت)، بیشترین میان رتبه‌ها",
}


def stages_table(table, lang: str):
    """A table of lesson 78a to show in edition `lang` (`localized`, with `STAGES_LABELS` too)."""
    return translate(table, {"fa": {**TABLE_LABELS, **STAGES_LABELS}}, lang)


# Lesson 78c: one decoder layer's backward beside its traffic, modelled (`cost_model.predict`).
OVERLAP_LABELS = {
    "en": {"time": "ms, modelled", "compute": "computation", "network": "network cards",
           "layer": "layer {i}", "gather": "all-gather (bf16)", "reduce": "reduce-scatter (fp32)",
           "backward": "backward", "held": "Working set in layer {i}'s backward: {gb} GB",
           "traffic": "gather {g}\nreduce-scatter {r}"},
    "fa": {"time": "میلی‌ثانیه، مدل‌سازی‌شده", "compute": "محاسبه", "network": "کارت‌های شبکه",
           "layer": "لایهٔ {i}", "gather": "گردآوری همگانی (bf16)", "reduce": "کاهش و پخش (fp32)",
           "backward": "گذر برگشت", "held": "حافظهٔ کاری در گذر برگشت لایهٔ {i}: {gb} گیگابایت",
           "traffic": "گردآوری {g}\nکاهش و پخش {r}"},
}


def layer_overlap_figure(backward_ms: float, gather_ms: float, reduce_ms: float, unit_params: float,
                         reduce_bytes: float = 4, layer: int = 41, lang: str = "en") -> Figure:
    """Three decoder layers' backward (`layer` + 1, `layer`, `layer` - 1) on the computation's
    lane, and under each the traffic it hides, labelled by layer: the next layer's all-gather, then
    the finished layer's reduce-scatter, end to end for the time they share the network cards. The title
    gives what stage 3 holds whole meanwhile, `memory.stage3_working_bytes` of a bf16 unit of
    `unit_params`: (2 + 2 + 2 + `reduce_bytes`) bytes per parameter. Times modelled, in ms."""
    labels, fig, ax = start_figure(OVERLAP_LABELS, lang, figsize=(FIGURE_WIDTH, 3.2))
    colours = {"backward": ACTION_COLOURS["compute"], "gather": ACTION_COLOURS["gather"],
               "reduce": ACTION_COLOURS["reduce-scatter"]}
    for k, name in enumerate((layer + 1, layer, layer - 1)):
        start = k * backward_ms
        ax.barh(1, backward_ms, left=start, height=0.6, color=colours["backward"], edgecolor="white")
        ax.text(start + backward_ms / 2, 1, labels["layer"].format(i=number(name, lang)), ha="center",
                va="center", color="white", fontsize=11)
        ax.barh(0, gather_ms, left=start, height=0.6, color=colours["gather"])
        ax.barh(0, reduce_ms, left=start + gather_ms, height=0.6, color=colours["reduce"])
        ax.text(start + 0.01 * backward_ms, -0.35, labels["traffic"].format(
            g=number(name - 1, lang), r=number(name + 1, lang)), ha="left", va="top", fontsize=10)
    held = memory.stage3_working_bytes(unit_params, memory.Precision(2, 2, 0), reduce_bytes)
    ax.set_title(labels["held"].format(i=number(layer, lang),
                                        gb=number(round(held / 1e9, 1), lang)))
    ax.set_yticks([0, 1], [labels["network"], labels["compute"]])
    ax.set_ylim(-1.1, 1.5)
    ax.set_xlim(0, 3 * backward_ms)
    ax.set_xlabel(labels["time"])
    _colour_legend(fig, colours, labels, lang, 0.1)
    return fig


# Lesson 78: ZeRO-1's optimizer step as four moves on one flat vector, rank by rank.
MOVES_LABELS = {
    "en": {"rank": "rank",
           "flatten": "1. flatten: each rank's whole gradient of its own data (model's dtype)",
           "reduce": "2. reduce-scatter: rank r keeps its shard, averaged (model's dtype)",
           "adam": "3. Adam on the shard, in fp32: its three stripes are the master, m and v",
           "gather": "4. all-gather: every rank gets the whole updated model (model's dtype)",
           "elements": "N shards of S = ⌈Ψ/N⌉ elements; the last ends in zero padding (hatched)",
           "shard": "shard"},
    "fa": {"rank": "رتبه",
           "flatten": "۱. تخت‌سازی: هر رتبه گرادیان کامل دادهٔ خودش را دارد (نوع دادهٔ مدل)",
           "reduce": "۲. کاهش و پخش: رتبهٔ r شارد خودش را، میانگین‌گرفته، نگه می‌دارد (نوع دادهٔ مدل)",
           "adam": "۳. Adam روی شارد، در fp32: سه نوارش رونوشت اصلی، m و v است",
           "gather": "۴. گردآوری همگانی: هر رتبه کل مدلِ به‌روزشده را می‌گیرد (نوع دادهٔ مدل)",
           "elements": "شاردها: N تا، هر کدام \u2066S = ⌈Ψ/N⌉\u2069 عنصر؛ آخرینشان با صفرِ پدینگ تمام می‌شود (هاشورخورده)",
           "shard": "شارد"},
}
SHARD_COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
                 "#7f7f7f"]


def four_moves_figure(world_size: int = 4, lang: str = "en") -> Figure:
    """ZeRO-1's step on `world_size` ranks, one panel per move: the flat gradient every rank holds
    whole, the averaged shard the reduce-scatter leaves rank r, the fp32 master and two moments
    Adam updates on it, and the whole model the all-gather hands back. Shard r in colour r; the
    last shard's padding hatched (drawn wider than it is, to be seen). A schematic: no data."""
    if not 1 <= world_size <= len(SHARD_COLOURS):
        raise ValueError(f"world_size={world_size!r}: give 1 to {len(SHARD_COLOURS)}, such as 4")
    labels, fig, axes = start_figure(MOVES_LABELS, lang, 4, 1, figsize=(FIGURE_WIDTH, 8.4),
                                     sharex=True)
    ranks = range(world_size)
    for ax, move in zip(axes, ("flatten", "reduce", "adam", "gather")):
        for r in ranks:
            y = world_size - 1 - r
            for s in ranks:
                own, colour = s == r, SHARD_COLOURS[s]
                if move == "flatten" or move == "gather":
                    ax.barh(y, 1, left=s, height=0.7, color=colour, edgecolor="white",
                            alpha=0.35 if move == "flatten" else 1.0)
                elif not own:
                    ax.barh(y, 1, left=s, height=0.7, color="none", edgecolor="#c7c7c7")
                elif move == "reduce":
                    ax.barh(y, 1, left=s, height=0.7, color=colour, edgecolor="white")
                else:  # the fp32 master copy and Adam's two moments of the shard
                    for k in range(3):
                        ax.barh(y - 0.25 + 0.25 * k, 1, left=s, height=0.2, color=colour)
            ax.barh(y, 0.1, left=world_size - 0.1, height=0.7, color="white", hatch="///",
                    edgecolor="#333333", linewidth=0)
        ax.set_title(labels[move], fontsize=11, loc="right" if lang == "fa" else "left")
        ax.set_yticks([world_size - 1 - r for r in ranks],
                      [language.numbered(labels["rank"], r, lang) for r in ranks])
        ax.set_xlim(0, world_size)
        ax.set_ylim(-0.6, world_size - 0.4)
    axes[-1].set_xticks([s + 0.5 for s in ranks],
                        [language.numbered(labels["shard"], s, lang) for s in ranks])
    axes[-1].set_xlabel(labels["elements"])
    fig.tight_layout()
    return fig


# Lesson 78: where the cuts between shards fall in a real model's parameters.
CUTS_LABELS = {
    "en": {"parameters": "parameters", "shards": "shards", "rank": "rank",
           "elements": "element of the flat vector; dashed: the cuts between shards",
           "padding": "padding: {n} zeros"},
    "fa": {"parameters": "پارامترها", "shards": "شاردها", "rank": "رتبه",
           "elements": "عنصرِ بردار تخت؛ خط‌چین: برش‌های میان شاردها",
           "padding": "پدینگ: {n} صفر"},
}


def shard_cuts(sizes: list[int], world_size: int) -> list[int]:
    """The flat offsets where shard r + 1 starts, r = 0 .. `world_size` - 2: multiples of
    ceil(sum(sizes) / world_size), as `ZeroOptimizer` cuts its padded flat vector."""
    shard = -(-sum(sizes) // world_size)
    return [shard * r for r in range(1, world_size)]


def shard_cuts_figure(sizes: dict[str, int], world_size: int = 4, lang: str = "en") -> Figure:
    """Two bars over one flat vector: above, the parameters in registration order (`sizes`:
    short name -> element count), below, the shards of `world_size` ranks in their colours, with
    a dashed line at each cut (`shard_cuts`) through both, so a reader sees which tensors a cut
    splits. Names of parameters under 4% of the vector stand above their bar. Drawn to scale:
    the padding, a few elements, is named at the vector's end, not drawn."""
    if not 1 <= world_size <= len(SHARD_COLOURS):
        raise ValueError(f"world_size={world_size!r}: give 1 to {len(SHARD_COLOURS)}, such as 4")
    labels, fig, ax = start_figure(CUTS_LABELS, lang, figsize=(FIGURE_WIDTH, 2.9))
    total = sum(sizes.values())
    cuts = shard_cuts(list(sizes.values()), world_size)
    shard = cuts[0] if cuts else total  # every shard is as long as the first
    start = 0
    for k, (name, numel) in enumerate(sizes.items()):
        ax.barh(1, numel, left=start, height=0.6, color="#bdbdbd" if k % 2 else "#e0e0e0",
                edgecolor="white", linewidth=0.5)
        inside = numel >= 0.04 * total
        ax.text(start + numel / 2, 1 if inside else 1.45, name, ha="center",
                va="center" if inside else "bottom", fontsize=11)
        start += numel
    for r in range(world_size):
        ax.barh(0, min(shard, total - r * shard), left=r * shard, height=0.6,
                color=SHARD_COLOURS[r], edgecolor="white", linewidth=0.5)
        ax.text(r * shard + shard / 2, 0, language.numbered(labels["rank"], r, lang),
                ha="center", va="center", color="white", fontsize=11)
    for cut in cuts:
        ax.axvline(cut, ymin=0.02, ymax=0.9, color="#333333", linestyle="--", linewidth=1)
    if shard * world_size > total:
        ax.text(total, -0.45, labels["padding"].format(n=number(shard * world_size - total, lang)),
                ha="right", va="top", fontsize=11)
    ax.set_xticks([0, *cuts, total], [number(x, lang) for x in [0, *cuts, total]])
    ax.set_yticks([0, 1], [labels["shards"], labels["parameters"]])
    ax.set_xlim(0, shard * world_size)
    ax.set_ylim(-1.0, 1.9)
    ax.set_xlabel(labels["elements"])
    fig.tight_layout()
    return fig

"""Figures of lesson 76: the ring schedule, measured bandwidth, the alpha-beta fit, ring vs naive.

The ring figure and the ring's table of steps are drawn from `collectives.ring_chunk_indices`,
the same function the ring uses, so the picture cannot drift from the code. The other figures
take rows measured by `collectives_lab.time_primitives` (or read from the stored tables) or
ledger totals from `collectives_lab.measure_ledgers`.
Drawn by lesson 76's notebook (notebooks/en/76-collectives.ipynb); the measurements they show come
from `python -m lesson_code.bench collectives` or the notebook's own runs.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from lesson_code import language
from lesson_code.collectives_lab import RELIABILITY_SLACK, slower_than_larger
from lesson_code.collectives import cost_model
from lesson_code.collectives import ring_chunk_indices
from lesson_code.plots import FIGURE_WIDTH, check_language, legend_below, start_figure
from lesson_code.plots.tables import translate

LABELS = {
    "en": {
        "reduce_scatter": "reduce-scatter, step {step}", "all_gather": "all-gather, step {step}",
        "rank": "rank", "chunk": "chunk", "size": "tensor size (bytes)",
        "busbw": "bus bandwidth (MB/s)", "time": "time (ms)", "ranks": "ranks N",
        "busiest": "bytes through\nthe busiest rank\n(× tensor size)",  # three lines: fits the axis
        "ring_title": "Ring on {n} ranks: digits = ranks whose data a chunk holds, Σ = all;\n"
                      "outlined = sent this step to the rank below (mod {n})",
        "fit": "{op}: α = {alpha:.3f} ms per step, 1/β = {bw:.3f} GB/s",
        "fit_naive": "{op}: α = {alpha:.3f} ms per message, 1/β = {bw:.3f} GB/s",
        "naive": "naive (via rank 0)", "ring": "ring", "direct": "direct",
        "shared_memory": "shared memory (one machine)",
        "recursive_doubling": "recursive doubling", "halving_doubling": "halving-doubling",
        "model": "solid: measured, joined as auto reads them; dashed: the fitted model",
        "switch": "auto's switch",
        "modelled": "the model on {n} ranks, α = {alpha:g} µs, 1/β = {bw:g} GB/s: nothing measured",
        "model_switch": "the model's switch", "time_us": "time (µs)",
        "measured_on": "measured here, {date}", "measured_points": "measured: {points}",
        "filled": "{op} (filled)", "hollow": "{op} (hollow)",
        "ringed": "ringed: over {percent:.0f}% slower than a larger size",
        "ring_limit": "the ring's limit as N grows: 4",
    },
    "fa": {
        "reduce_scatter": "کاهش و پخش، گام {step}", "all_gather": "گردآوری همگانی، گام {step}",
        "rank": "رتبه", "chunk": "تکه", "size": "اندازهٔ تنسور",  # its ticks say KiB, MiB
        "busbw": "پهنای باند گذرگاه (MB/s)", "time": "زمان (ms)", "ranks": "تعداد رتبه‌ها N",
        "busiest": "بایت‌های عبوری از\nپرکارترین رتبه\n(× اندازهٔ تنسور)",  # three lines: fits the axis
        "ring_title": "حلقه با {n} رتبه: رقم‌ها = رتبه‌هایی که داده‌شان در تکه آمده است، Σ = همه؛\n"
                      "قاب پررنگ = ارسال در همین گام به رتبهٔ پایینی (به پیمانهٔ {n})",
        # the formulas isolated left to right, in Latin digits as every formula of a figure
        # (libraqm reorders Persian digits inside an isolate): "α = 1.955 ms" keeps its order
        "fit": "{op}: \u2066α = {alpha:.3f} ms\u2069 برای هر گام، \u20661/β = {bw:.3f} GB/s\u2069",
        "fit_naive": "{op}: \u2066α = {alpha:.3f} ms\u2069 برای هر پیام، \u20661/β = {bw:.3f} GB/s\u2069",
        "naive": "ساده‌لوحانه (از راه رتبهٔ ۰)", "ring": "حلقه", "direct": "مستقیم",
        "shared_memory": "حافظهٔ مشترک (یک دستگاه)",
        "recursive_doubling": "دوبرابرسازی بازگشتی", "halving_doubling": "نیم‌سازی و دوبرابرسازی",
        "model": ("خط پیوسته: اندازه‌گیری‌ها، به هم وصل‌شده همان‌گونه که auto می‌خواندشان؛ "
                  "خط‌چین: مدل برازش‌شده"),
        "switch": "نقطهٔ تغییر auto",
        "modelled": "مدل روی {n} رتبه، \u2066α = {alpha:g} µs\u2069، \u20661/β = {bw:g} GB/s\u2069: هیچ چیز اندازه‌گیری نشده است",
        "model_switch": "نقطهٔ تغییرِ مدل", "time_us": "زمان (µs)",
        # the date isolated left to right in Latin digits, as the formulas: 2026-12-06 in order
        "measured_on": "اندازه‌گیری‌شده در اینجا، \u2066{date}\u2069",
        "measured_points": "اندازه‌گیری: {points}",
        "filled": "{op} (توپر)", "hollow": "{op} (توخالی)",
        "ringed": "دایره‌دار: بیش از {percent:.0f}٪ کندتر از اندازه‌ای بزرگ‌تر",
        "ring_limit": "حد حلقه با بزرگ شدن N: ۴",
    },
}


# The operations the timing figures draw (collectives_lab.time_primitives' names), as a legend
# names them: in English as measured, in Persian the glossary's terms.
OPERATIONS = {
    "en": {},
    "fa": {"ring all_reduce": "کاهش همگانی حلقه‌ای", "gloo all_reduce": "کاهش همگانی gloo",
           "naive all_reduce": "کاهش همگانی ساده‌لوحانه", "auto all_reduce": "کاهش همگانی auto"},
}


def operation(op: str, lang: str) -> str:
    """The name of a timed operation ("ring all_reduce") as a figure of `lang` shows it."""
    return OPERATIONS[check_language(lang)].get(op, op)


def _measured(rows: list[dict], op: str) -> list[tuple[int, float]]:
    """(bytes, seconds) of `op` in rows from `collectives_lab.time_primitives`, by size."""
    return sorted((row["nbytes"], row["seconds"]) for row in rows if row["op"] == op)


def _finish(fig: Figure, ax, xlabel: str, ylabel: str, legend_size: float | None = None,
            keys: list[Line2D] = ()) -> Figure:
    """Label the axes, add the legend (the labelled lines, then `keys`, entries drawn on no data)
    and tighten the layout; return `fig`."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    handles, texts = ax.get_legend_handles_labels()
    handles += list(keys)
    legend_below(ax, ncol=1, fontsize=legend_size, handles=handles,
                 labels=texts + [key.get_label() for key in keys])
    fig.tight_layout()
    return fig


def ring_states(world_size: int) -> list[tuple[str, int, list[list[frozenset]], set]]:
    """Simulate which ranks' data each (rank, chunk) holds after every ring step.

    Returns (phase, step, state, sent) per step, where state[r][c] is the set of ranks whose
    contribution rank r's chunk c contains and `sent` the (rank, chunk) pairs sent in that step.
    """
    state = [[frozenset({rank}) for _ in range(world_size)] for rank in range(world_size)]
    frames = []
    for phase in ("reduce_scatter", "all_gather"):
        for step in range(world_size - 1):
            sent, new_state = set(), [row[:] for row in state]
            for rank in range(world_size):
                send_index, recv_index = ring_chunk_indices(phase, rank, step + 1, world_size)
                sent.add((rank, send_index))
                left = (rank - 1) % world_size
                incoming = state[left][recv_index]
                new_state[rank][recv_index] = (incoming | state[rank][recv_index]
                                               if phase == "reduce_scatter" else incoming)
            state = new_state
            frames.append((phase, step, state, sent))
    return frames


def ring_schedule_table(world_size: int, phase: str = "reduce_scatter") -> pd.DataFrame:
    """Which chunk each rank sends right and receives from the left at each step of a ring
    `phase`: rows "rank r", columns ("step k", "sends" / "receives") for k = 1 .. N-1, the steps
    the figure, the lesson and `ring_chunk_indices` count from 1."""
    steps = {}
    for step in range(1, world_size):
        chunks = [ring_chunk_indices(phase, rank, step, world_size) for rank in range(world_size)]
        steps[(f"step {step}", "sends")] = [sent for sent, _ in chunks]
        steps[(f"step {step}", "receives")] = [received for _, received in chunks]
    return pd.DataFrame(steps, index=[f"rank {rank}" for rank in range(world_size)])


RANK_SEPARATOR = {"en": "", "fa": "\u066c"}  # between the ranks a partial sum holds: 023, ۰٬۲٬۳


def ring_schedule_figure(world_size: int = 4, lang: str = "en") -> Figure:
    """Grid per ring step (rows: ranks, columns: chunks), coloured by contributions held;
    a complete chunk shows a sum sign, a partial sum the ranks it holds."""
    frames = ring_states(world_size)
    steps = world_size - 1
    labels, fig, axes = start_figure(LABELS, lang, 2, steps, figsize=(FIGURE_WIDTH, 0.6 + 2 * FIGURE_WIDTH / steps),
                                     squeeze=False)
    colours = plt.get_cmap("Blues")
    for index, (phase, step, state, sent) in enumerate(frames):
        ax = axes[index // steps][index % steps]
        for rank in range(world_size):
            for chunk in range(world_size):
                held = state[rank][chunk]
                ax.add_patch(Rectangle((chunk, rank), 1, 1, facecolor=colours(
                    0.15 + 0.7 * len(held) / world_size), edgecolor="white"))
                # a complete chunk is a sum sign: only partial sums name their ranks, in Persian
                # with a separator, since the Persian zero is a dot and «۰۳» reads as a number
                complete = len(held) == world_size
                ax.text(chunk + 0.5, rank + 0.5,
                        "Σ" if complete else RANK_SEPARATOR[lang].join(str(r) for r in sorted(held)),
                        ha="center", va="center", fontsize=13 if complete else 10,
                        color="white" if complete else "black")
        for rank, chunk in sent:
            ax.add_patch(Rectangle((chunk + 0.05, rank + 0.05), 0.9, 0.9, fill=False,
                                   edgecolor="darkred", linewidth=2))
        ax.set_xlim(0, world_size)
        ax.set_ylim(world_size, 0)
        ax.set_xticks([c + 0.5 for c in range(world_size)], range(world_size))
        ax.set_yticks([r + 0.5 for r in range(world_size)], range(world_size))
        # the axis names once per row and column: the room goes to the cells and their digits
        if index >= steps:
            ax.set_xlabel(labels["chunk"])
        if index % steps == 0:
            ax.set_ylabel(labels["rank"])
        ax.set_title(labels[phase].format(step=step + 1), fontsize=11)
        ax.set_aspect("equal")
    fig.suptitle(labels["ring_title"].format(n=world_size))
    fig.tight_layout(w_pad=0.4)
    return fig


def bandwidth_figure(rows: list[dict], world_size: int, lang: str = "en",
                     ops: tuple[str, ...] = ("ring all_reduce", "gloo all_reduce",
                                             "naive all_reduce")) -> Figure:
    """Bus bandwidth (nccl-tests) against tensor size for each measured operation."""
    labels, fig, ax = start_figure(LABELS, lang, figsize=(6.5, 4))
    for op in ops:
        points = _measured(rows, op)
        if not points:
            continue
        algorithm = op.split()[-1]
        busbw = [cost_model.bandwidths(algorithm, n, t, world_size)[1] / 1e6 for n, t in points]
        ax.plot([n for n, _ in points], busbw, marker="o", label=operation(op, lang))
    ax.set_xscale("log", base=2)
    return _finish(fig, ax, labels["size"], labels["busbw"])


def alpha_beta_figure(rows: list[dict], fits: dict[str, cost_model.AlphaBeta],
                      world_size: int, lang: str = "en", measured: str | None = None) -> Figure:
    """Measured times (points) beside the fitted alpha-beta model (lines), log-log.

    A point that shows the reliability sign (`collectives_lab.slower_than_larger`) is ringed.
    The first scheme's points are filled, the others' hollow, so that equal times stay visible.
    Each line is the model on 50 log-spaced sizes between the measured ones, so it bends only
    where the model does. The legend gives each fit in ms and GB/s, lesson 76's fit table's units,
    then what the points are (filled, hollow) and, when a point shows the sign, what a ring means.
    `measured` (the date of the run) titles the figure "measured here, <date>".
    """
    labels, fig, ax = start_figure(LABELS, lang, figsize=(6.5, 4))
    any_flagged = False
    for index, (op, fit) in enumerate(fits.items()):
        points = _measured(rows, op)
        algorithm = op.replace(" ", "_") if op.startswith("naive") else op.split()[-1]
        sizes = [n for n, _ in points]
        line, = ax.plot(sizes, [1e3 * t for _, t in points], "o", zorder=3,
                        **({} if index == 0 else {"markerfacecolor": "none"}))
        flagged = slower_than_larger(dict(points))
        ax.plot(flagged, [1e3 * t for n, t in points if n in flagged], "o", markersize=14,
                markerfacecolor="none", markeredgecolor=line.get_color())
        any_flagged = any_flagged or bool(flagged)
        grid = np.geomspace(min(sizes), max(sizes), 50)
        ax.plot(grid, [1e3 * cost_model.predict(algorithm, n, world_size, fit.alpha, fit.beta)
                       for n in grid], "-", color=line.get_color(),
                # the naive scheme has no steps: its alpha is per message of rank 0
                label=labels["fit_naive" if op.startswith("naive") else "fit"].format(
                    op=operation(op, lang), alpha=fit.alpha * 1e3, bw=fit.bandwidth / 1e9))
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    # plain milliseconds (2, 5, 10, 20, 50) rather than 6×10^0 on a log axis
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1, 2, 5)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())
    if measured is not None:
        ax.set_title(labels["measured_on"].format(date=measured))
    kinds = language.listed([labels["filled" if index == 0 else "hollow"].format(
        op=operation(op, lang)) for index, op in enumerate(fits)], lang)
    keys = [Line2D([], [], marker="o", linestyle="none", color="0.45",
                   label=labels["measured_points"].format(points=kinds))]
    if any_flagged:
        keys.append(Line2D([], [], marker="o", linestyle="none", markersize=11,
                           markerfacecolor="none", markeredgecolor="0.45",
                           label=labels["ringed"].format(percent=100 * (RELIABILITY_SLACK - 1))))
    return _finish(fig, ax, labels["size"], labels["time"], keys=keys)


def busiest_rank_figure(traffic: dict[int, dict[str, float]], lang: str = "en") -> Figure:
    """Bytes through the busiest rank, in tensor sizes, for ring and naive all-reduce against N.

    `traffic[N]` maps "ring" and "naive" to (bytes sent + received by the busiest rank) / size.
    """
    labels, fig, ax = start_figure(LABELS, lang, figsize=(5.5, 3.6))
    sizes = sorted(traffic)
    for key, colour in (("naive", "C2"), ("ring", "C0")):  # alpha_beta_figure's colours
        ax.plot(sizes, [traffic[n][key] for n in sizes], marker="o", color=colour,
                label=labels[key])
    # the ring's 4(N-1)/N approaches 4 and never reaches it: the line the text compares it with
    ax.axhline(4, color="C0", linestyle="--", linewidth=1, label=labels["ring_limit"])
    ax.set_xticks(sizes)
    return _finish(fig, ax, labels["ranks"], labels["busiest"])


def algorithms_figure(rows: list[dict], costs, world_size: int, lang: str = "en",
                      switches: list[tuple[int, str, str]] = ()) -> Figure:
    """Measured time of every all-reduce algorithm against size, log-log: points joined by
    straight (solid) lines, which is what `choose` reads between measured sizes, beside the
    time the fit of `costs` (a `choose.AlgorithmCosts`) predicts (dashed), and a vertical line
    at each of `switches` ((bytes, from, to), as `choose.predicted_switches` gives them).

    `rows` are {algorithm, world_size, nbytes, seconds}, as `choose.stored_costs` reads them.
    """
    labels, fig, ax = start_figure(LABELS, lang, figsize=(6.5, 6))
    for name in costs.fits:
        points = sorted((r["nbytes"], r["seconds"]) for r in rows if r["algorithm"] == name)
        sizes = [n for n, _ in points]
        line, = ax.plot(sizes, [1e3 * t for _, t in points], "o-", label=labels[name])
        ax.plot(sizes, [1e3 * costs.predict(name, n, world_size) for n in sizes], "--",
                color=line.get_color(), alpha=0.6)
    for index, (nbytes, _, _) in enumerate(switches):
        ax.axvline(nbytes, color="black", linestyle=":", label=None if index else labels["switch"])
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(base=10, numticks=20))  # a tick at every decade
    ax.set_title(labels["model"], fontsize=11)
    return _finish(fig, ax, labels["size"], labels["time"])


def modelled_algorithms_figure(costs, world_size: int, sizes: list[int], lang: str = "en",
                               switches: list[tuple[int, str, str]] = ()) -> Figure:
    """The time one alpha-beta model gives each algorithm of `costs` (a `choose.AlgorithmCosts`
    whose fits are all that model) against size, log-log, with a vertical line at each of
    `switches` ((bytes, from, to)). Nothing measured: where two lines cross the choice changes.
    """
    labels, fig, ax = start_figure(LABELS, lang, figsize=(6.5, 5.5))
    for name in costs.fits:
        ax.plot(sizes, [1e6 * costs.predict(name, n, world_size) for n in sizes], label=labels[name])
    for index, (nbytes, _, _) in enumerate(switches):
        ax.axvline(nbytes, color="black", linestyle=":",
                   label=None if index else labels["model_switch"])
    ax.set_xscale("log", base=2)
    # from the first size, every other one: 2^10, 2^12, ... as measured; the Persian labels
    # ("۶۴ KiB") are wider than 2^16, so every fourth one there
    ax.set_xticks(sizes[::4] if lang == "fa" else sizes[::2])
    ax.set_yscale("log")
    (model,) = set(costs.fits.values())  # one model for every algorithm
    ax.set_title(labels["modelled"].format(n=world_size, alpha=1e6 * model.alpha,
                                           bw=1e-9 / model.beta), fontsize=11)
    return _finish(fig, ax, labels["size"], labels["time_us"])


# The tables of lesson 76 in Persian: English label -> Persian term (book/fa/glossary.md).
TABLE_LABELS = {
    **language.TERMS,
    "world_size": "تعداد رتبه‌ها", "backend": "بک‌اند", "threads": "رشته‌ها",
    "naive_all_reduce": "کاهش همگانی ساده‌لوحانه", "primitive": "عملیات",
    "bytes sent": "بایت‌های فرستاده", "bytes received": "بایت‌های دریافتی",
    "nbytes": "بایت‌ها", "op": "عملیات",
    "recursive_doubling": "دوبرابرسازی بازگشتی",
    "halving_doubling": "نیم‌سازی و دوبرابرسازی", "direct": "مستقیم", "N =": "N =",
    "messages in a row": "پیام‌های پشت سر هم", "bytes per rank / n": "بایت‌های هر رتبه / n",
    "shared_memory": "حافظهٔ مشترک",
    "all_reduce without shared memory": "کاهش همگانی بدون حافظهٔ مشترک",
    "ring all_reduce": "کاهش همگانی حلقه‌ای", "naive all_reduce": "کاهش همگانی ساده‌لوحانه",
    "gloo all_reduce": "کاهش همگانی gloo", "auto all_reduce": "کاهش همگانی auto",
    "recursive_doubling all_reduce": "کاهش همگانی با دوبرابرسازی بازگشتی",
    "halving_doubling all_reduce": "کاهش همگانی با نیم‌سازی و دوبرابرسازی",
    "ring / gloo": "حلقه / gloo", "auto / gloo": "auto / gloo",
    "fastest measured": "سریع‌ترینِ اندازه‌گیری‌شده", "auto's choice": "انتخاب auto",
    "with this size left out": "با کنار گذاشتن همین اندازه",
    "auto, run 2 / run 1": "auto، اجرای دوم / اجرای اول",
    "sends": "می‌فرستد", "receives": "دریافت می‌کند",
    "ring (model)": "حلقه (مدل)", "naive (model)": "ساده‌لوحانه (مدل)",
    "GB sent by the busiest rank": "گیگابایتِ ارسالیِ پرکارترین رتبه",
    "modelled seconds": "ثانیه بنا بر مدل",
    "latency term (ms)": "جملهٔ تأخیر (ms)",
    "bandwidth term, 1 MiB (ms)": "جملهٔ پهنای باند، ۱ MiB (ms)",
    "bandwidth term, 1 GiB (ms)": "جملهٔ پهنای باند، ۱ GiB (ms)",
    "algorithm": "الگوریتم", "from (bytes)": "از (بایت)",
    "pipelined chain": "زنجیرهٔ پایپلاینی", "binomial tree": "درخت دوجمله‌ای",
    "one send of the tensor": "یک بار فرستادن کل تنسور", "modelled ms": "میلی‌ثانیه بنا بر مدل",
    "messages received": "پیام‌های دریافتی", "nodes": "گره‌ها", "gpus per node": "GPUهای هر گره",
    "sharding": "شاردبندی",
    "parameters, 2 all-gathers": "پارامترها، ۲ گردآوری همگانی", "total": "کل",
    "on the network": "روی شبکه", "bytes only": "فقط بایت‌ها", "with latencies": "با تأخیرها",
    "with latencies, 32 units": "با تأخیرها، ۳۲ واحد",
    "ms per step, median of 4 to 256 KiB": "میلی‌ثانیه در هر گام، میانهٔ ۴ تا ۲۵۶ KiB",
    "running sum in bfloat16": "جمع جاری با bfloat16",
    "float32, result rounded to bfloat16": "با float32، سپس گرد کردن نتیجه به bfloat16",
    "float32 throughout": "سراسر با float32",
    "stored run": "اجرای ذخیره‌شده", "this run": "این اجرا",
    "largest model error (%)": "بزرگ‌ترین خطای مدل (٪)",
    "α (ms per step or message)": "α برای هر گام یا پیام (ms)",
    "1 MiB": "۱ MiB", "1 GiB": "۱ GiB",
    "scatter + all-gather": "پخش از یک رتبه + گردآوری همگانی",
    "this run / stored run": "این اجرا / اجرای ذخیره‌شده", "crossover": "نقطهٔ تقاطع",
    "naive (ms)": "ساده‌لوحانه (ms)", "posted at once (ms)": "یک‌جا به‌راه‌افتاده (ms)",
    "at once / naive": "یک‌جا / ساده‌لوحانه", "least": "کمترین", "median": "میانه",
    "most": "بیشترین", "of 9 rounds": "از ۹ دور",
    "gap": "فاصله", "time ratio": "نسبت زمان‌ها", "over the bar": "بیش از آستانه",
    "shared memory / naive, 256 KiB": "حافظهٔ مشترک / ساده‌لوحانه، ۲۵۶ KiB",
    "shared memory / naive, 1 MiB": "حافظهٔ مشترک / ساده‌لوحانه، ۱ MiB",
    "naive / shared memory, 4 MiB": "ساده‌لوحانه / حافظهٔ مشترک، ۴ MiB",
}


def localized(table, lang: str):
    """`table` (a DataFrame or Series) with its labels in edition `lang`: the Persian terms of
    TABLE_LABELS for "fa", unchanged for "en" (`plots.tables.translate`; values never change).
    Raises ValueError for another language."""
    return translate(table, {"fa": TABLE_LABELS}, lang)

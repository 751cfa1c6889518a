"""Figures of lesson 80: each rank's save in time, and the shards' layout before and after
resharding. Drawn from real runs: `checkpoint_lab.timed_save` (the file operations of every rank,
through a timing disk) and `checkpoint_lab.shard_layout` (read from a manifest).

    save_timeline_figure(launch.spawn(checkpoint_lab.timed_save, run, root, world_size=4), lang="fa")
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from lesson_code import language
from lesson_code.plots import FIGURE_WIDTH, legend_below, number, start_figure
from lesson_code.plots.tables import translate

LABELS = {
    "en": {"rank": "rank", "time": "time from the start of the save (ms)", "write": "file written",
           "fsync": "fsync", "rename": "rename", "publish": "folder renamed: published",
           "elements": "element of the flat parameter vector", "ranks": "{n} ranks",
           "padding": "+{n} padding", "root fsync": "root fsync",
           "files": {".owner": ".owner", "shard": "shard", "replicated.pt": "replicated",
                     "manifest.json": "manifest", "manifest.sha256": "manifest.sha256"}},
    "fa": {"rank": "رتبه", "time": "زمان از آغاز ذخیره (میلی‌ثانیه)", "write": "نوشتن فایل",
           "fsync": "fsync", "rename": "تغییر نام", "publish": "تغییر نام پوشه: انتشار",
           "elements": "عنصرِ بردار تخت پارامترها", "ranks": "{n} رتبه",
           "padding": "{n} عنصر پدینگ", "root fsync": "fsync ریشه",
           "files": {".owner": "نشانه", "shard": "شارد", "replicated.pt": "تکثیرشده",
                     "manifest.json": "مانیفست", "manifest.sha256": "manifest.sha256"}},
}
COLOURS = {"write": "#c6dbef", "fsync": "#2171b5", "rename": "black", "publish": "#d62728"}

# Table labels of the Persian edition (the English labels are the keys).
TABLE_WORDS = {"fa": {
    **language.TERMS,
    "file": "فایل", "all": "همه", "writer": "رتبهٔ نویسنده", "tensors": "تنسورها", "bytes": "بایت",
    "start": "آغاز", "length": "طول", "padding": "پدینگ",
    "never stopped": "بی‌وقفه", "resumed from step 10": "ادامه از چکپوینت گام ۱۰", "error": "خطا",
    "no manifest": "بدون مانیفست", "missing shard": "شارد گم‌شده", "truncated shard": "شارد کوتاه‌شده",
    "manifest edited": "مانیفست ویرایش‌شده", "another world size": "تعداد دیگری از رتبه‌ها",
    "renamed to step 20": "تغییر نام به گام ۲۰",
    "saved on 4 ranks": "ذخیره روی ۴ رتبه", "loaded on 2 ranks": "بارگذاری روی ۲ رتبه",
    "elements per rank": "عنصرهای هر رتبه",
    "format": "قالب",
    "count": "شمار", "sum": "جمع", "raised": "خطای رخ‌داده",
    "max_abs_change": "بیشینهٔ تغییر مطلق", "ours": "قالب ما", "dcp": "DCP",
    "change": "تغییر", "loads": "بارگذاری می‌شود", "skipped": "کنارگذاشته‌ها",
    "contents of the root": "محتوای پوشهٔ ریشه", "latest complete": "آخرین چکپوینت کامل",
    "saves": "ذخیره می‌کند",
    "signal received": "سیگنال را گرفت", "saves after step": "ذخیره پس از گام",
    "elements": "عنصرها", "from byte": "آغاز در فایل (بایت)",
    "continued from step 2": "ادامه از چکپوینت گام ۲",
    "nothing saved": "هنوز چیزی ذخیره نشده", "first save interrupted": "نخستین ذخیره نیمه‌کاره ماند",
    "crashed mid-save": "اجرایی که در میانهٔ ذخیره از کار افتاد",
    "newest damaged": "تازه‌ترین چکپوینت آسیب‌دیده", "trains from step": "آموزش از گام",
    "load failed": "بارگذاری ناکام",
    "resumed": "ادامه‌یافته",
    "resumed, RNG state lost": "ادامه‌یافته، بدون وضعیت مولد اعداد تصادفی",
    "resumed, step count lost": "ادامه‌یافته، بدون شمارِ گام‌های Adam",
    "stage": "بخش ذخیره", "seconds": "ثانیه", "GB/s": "GB/s",
    "copy in memory": "رونوشت در حافظه", "torch.save into memory": "torch.save در حافظه",
    "crc32 (zlib), for comparison": "crc32 (`zlib`)، برای مقایسه",
    "write, fsync, rename, fsync": "نوشتن، fsync، تغییر نام، fsync",
    "sha256 at the measured rate": "sha256 با نرخ اندازه‌گیری‌شده",
    "one process, 90 GB (s)": "یک فرایند، ۹۰ GB (ثانیه)",
    "64 ranks, 1.4 GB each (s)": "۶۴ رتبه، هر یک ۱٫۴ GB (ثانیه)",
    "measured here": "اندازه‌گیری‌شده در اینجا", "step (ms)": "گام (ms)", "save (ms)": "ذخیره (ms)",
    "Young's interval at one failure every 3.09 h (s)":
        "فاصلهٔ یانگ با یک خرابی در هر ۳٫۰۹ ساعت (ثانیه)",
    "steps between saves": "گام‌های میان دو ذخیره", "bandwidth (TB/s)": "پهنای باند (ترابایت بر ثانیه)",
    "save (s)": "ذخیره (ثانیه)", "interval (min)": "فاصلهٔ ذخیره‌ها (دقیقه)",
    "time lost (%)": "زمان ازدست‌رفته (٪)", "model tensors": "تنسورهای مدل",
    "own vectors": "بردارهای خود رتبه", "blocking save (ms)": "ذخیرهٔ مسدودکننده (میلی‌ثانیه)",
    "in the background (ms)": "در پس‌زمینه (میلی‌ثانیه)", "chosen": "انتخاب‌شده",
    "of which waiting for the save before (ms)": "از این مقدار، انتظار برای ذخیرهٔ قبلی (میلی‌ثانیه)",
    "largest |parameter|": "بزرگ‌ترین قدرمطلق پارامتر", "float32 spacing there": "فاصلهٔ float32 در آنجا",
    "tolerance in spacings": "آستانه بر حسب این فاصله", "difference on 2 ranks": "اختلاف روی ۲ رتبه",
    "difference, step count lost": "اختلاف، بدون شمار گام‌های Adam",
    "signal before the all-reduce: handler ran": "سیگنال پیش از کاهش همگانی: گرداننده اجرا شد",
    "signal before the all-reduce: saves after step": "سیگنال پیش از کاهش همگانی: ذخیره پس از گام",
    "signal after the all-reduce: saves after step": "سیگنال پس از کاهش همگانی: ذخیره پس از گام",
    "part": "بخش", "bound by": "محدود به", "s": "ثانیه", "GB": "گیگابایت",
    "client": "کلاینت گره", "core": "یک هسته",
    "write the shards (a node's {} ranks)": "نوشتن شاردها ({} رتبهٔ یک گره)",
    "hash a shard (each rank)": "چکیده‌گیری از یک شارد (هر رتبه)",
    "write replicated.pt (rank 0)": "نوشتن replicated.pt (رتبهٔ ۰)",
    "hash replicated.pt (rank 0)": "چکیده‌گیری از replicated.pt (رتبهٔ ۰)",
    "blocking save, in all": "ذخیرهٔ مسدودکننده، روی هم",
    "read the shards (a node's {} ranks)": "خواندن شاردها ({} رتبهٔ یک گره)",
    "load without replicated.pt: read and hash, in all": "بارگذاری بدون replicated.pt: خواندن و چکیده‌گیری، روی هم",
    "read the shards and replicated.pt (a node's {} ranks)": "خواندن شاردها و replicated.pt ({} رتبهٔ یک گره)",
    "load with replicated.pt (load_zero): read and hash, in all":
        "بارگذاری با replicated.pt (load_zero): خواندن و چکیده‌گیری، روی هم",
    "blocking save": "ذخیرهٔ مسدودکننده", "pageable copy ({} GB/s)": "رونوشت صفحه‌پذیر ({} GB/s)",
    "pinned copy ({} GB/s)": "رونوشت سنجاق‌شده ({} GB/s)", "Young's interval (min)": "فاصلهٔ یانگ (دقیقه)",
    "files read": "فایل‌های خوانده‌شده", "equal to reshard's, bit for bit": "برابر با شارد `reshard`، بیت‌به‌بیت",
}}


def table(frame, lang: str = "en"):
    """A lesson-80 table with its labels in `lang` (`plots.tables.translate`)."""
    return translate(frame, TABLE_WORDS, lang)



def save_timeline_figure(results: list[dict], lang: str = "en") -> Figure:
    """A row per rank: each file's write (light), its fsyncs (dark), renames (ticks), and the
    rename that publishes the folder (red line over every row), in milliseconds. Rank 0's file
    writes are named (`.owner`, its shard, `replicated.pt` and the manifest's two files), and so
    is an fsync before its first write (the root's, after creating the staging folder): all above
    its row, never between rank 0 and rank 1, each at the lowest of three heights where it does
    not run into the name before it (`_levels`), so that a name sits just above its bar unless a
    neighbour is in the way; each on a white ground, so that the publish line passes behind it.
    The root's fsync after the publish, which makes it durable, is named on rank 0's row, right
    of the red line; the time axis runs 8% past the last event, so that it shows.
    An fsync is drawn thinner than its file's write, which it mostly spans.

    `results` are every rank's `checkpoint_lab.timed_save` results.
    """
    labels, fig, ax = start_figure(LABELS, lang, figsize=(FIGURE_WIDTH, 2.2 + 0.55 * len(results)))
    seen, named = set(), []  # rank 0's named events: (middle in ms, text)
    published = max((end for r in results for kind, _, _, end in r["events"] if kind == "publish"),
                    default=float("inf"))
    after = []  # rank 0's fsyncs after the publish: (end in ms)
    for result in results:
        rank = result["rank"]
        first_write = min((start for kind, _, start, _ in result["events"] if kind == "write"),
                          default=float("inf"))
        for kind, name, start, end in sorted(result["events"], key=lambda e: e[0] != "write"):
            label = labels[kind] if kind not in seen else None
            seen.add(kind)
            if kind in ("write", "fsync"):
                ax.barh(rank, 1e3 * (end - start), left=1e3 * start, color=COLOURS[kind],
                        height=0.6 if kind == "write" else 0.16, label=label)
                file = labels["files"].get("shard" if name.startswith("shard-") else name)
                if kind == "fsync" and end <= first_write:
                    file = labels["root fsync"]
                if rank == 0 and file and (kind == "write" or end <= first_write):
                    named.append((1e3 * (start + end) / 2, file))
                if rank == 0 and kind == "fsync" and start >= published:
                    after.append(1e3 * end)
            elif kind == "rename":
                ax.plot([1e3 * end] * 2, [rank - 0.32, rank + 0.32], color=COLOURS[kind],
                        linewidth=1, label=label)
            else:
                ax.axvline(1e3 * end, color=COLOURS[kind], linestyle="--", label=label,
                           zorder=0.9)  # behind the bars: the fsync right after it shows
    ranks = [r["rank"] for r in results]
    ax.set_yticks(ranks, [language.numbered(labels["rank"], r, lang) for r in ranks])
    ax.set_ylim(max(ranks) + 0.6, min(ranks) - 1.9)  # rank 0 on top, room for its file names
    # The save starts at 0 (the lock and the staging folder come first); past the last event,
    # room for the root's fsync after the publish and its name.
    last = max((end for r in results for *_, end in r["events"]), default=0.0)
    ax.set_xlim(0, 1.08 * 1e3 * last if last > 0 else None)
    rows = {0: [], 1: [], 2: []}  # three heights above rank 0's bar, nearest first
    for (x, file), level in zip(sorted(named), _levels(sorted(named), ax.get_xlim()[1])):
        rows[level].append(ax.text(x, -0.34 - 0.4 * level, file, ha="center", va="bottom",
                                   fontsize=10, zorder=3,
                                   bbox={"facecolor": "white", "edgecolor": "none", "pad": 1}))
    durable = None  # on rank 0's row, where nothing else is drawn right of the publish line
    if after:
        durable = ax.annotate(labels["root fsync"], (max(after), 0), xytext=(4, 0),
                              textcoords="offset points", ha="left", va="center", fontsize=10)
    ax.set_xlabel(labels["time"])
    legend_below(ax, ncol=2)
    fig.tight_layout()
    if durable is not None:
        _make_room(ax, durable, max(after))
    for row in rows.values():
        _spread(ax, row)
    return fig


def _make_room(ax, text, x: float, gap_px: float = 6.0) -> None:
    """Widen the time axis, if need be, so that `text`, drawn right of time `x`, ends `gap_px`
    inside the axes."""
    renderer = ax.figure.canvas.get_renderer()
    width = ax.get_window_extent(renderer).width
    needed = text.get_window_extent(renderer).x1 + gap_px - ax.get_window_extent(renderer).x1
    if needed > 0:
        ax.set_xlim(0, x * width / (x * width / ax.get_xlim()[1] - needed))


def _levels(named: list[tuple[float, str]], span_ms: float, chars: float = 60.0) -> list[int]:
    """For labels (middle in ms, text) in time order, the lowest of three heights (0 nearest the
    bar) where each clears the last label already there, taking a character as `span_ms / chars`
    wide; where none is clear, the height whose last label ends earliest."""
    ends = [float("-inf")] * 3
    levels = []
    for x, text in named:
        half = (len(text) + 2) / 2 * span_ms / chars
        level = next((k for k in range(3) if ends[k] < x - half), ends.index(min(ends)))
        ends[level] = x + half
        levels.append(level)
    return levels


def _spread(ax, texts: list, gap_px: float = 6.0) -> None:
    """Move neighbouring labels of one row apart, each by half their overlap, so that the files
    of a short save (written within a few ms) keep legible names."""
    renderer = ax.figure.canvas.get_renderer()
    ms_per_px = (ax.get_xlim()[1] - ax.get_xlim()[0]) / ax.get_window_extent(renderer).width
    for left, right in zip(texts, texts[1:]):
        overlap = left.get_window_extent(renderer).x1 + gap_px - right.get_window_extent(renderer).x0
        if overlap > 0:
            left.set_x(left.get_position()[0] - overlap / 2 * ms_per_px)
            right.set_x(right.get_position()[0] + overlap / 2 * ms_per_px)


def reshard_layout_figure(layouts: list[list[dict]], numel: int, lang: str = "en") -> Figure:
    """One row per world size: each shard's elements [start, start + length) coloured by rank,
    with the padding past the `numel` real elements hatched.

    `layouts` holds, for each checkpoint, its `checkpoint_lab.shard_layout` rows.
    """
    labels, fig, ax = start_figure(LABELS, lang, figsize=(FIGURE_WIDTH, 1.2 + 0.8 * len(layouts)))
    colours = plt.get_cmap("tab10").colors
    for row, shards in enumerate(layouts):
        for shard in shards:
            real = shard["length"] - shard["padding"]
            ax.barh(row, real, left=shard["start"], color=colours[shard["rank"] % 10],
                    edgecolor="white", height=0.6)
            ax.text(shard["start"] + real / 2, row, language.numbered(labels["rank"], shard["rank"], lang),
                    ha="center", va="center", fontsize=11, color="white")
            if shard["padding"]:  # a few elements: hatched, and named under the bar's end
                ax.barh(row, shard["padding"], left=shard["start"] + real, color="white",
                        edgecolor="grey", hatch="///", height=0.6)
                ax.annotate(labels["padding"].format(n=number(shard["padding"], lang)),
                            (shard["start"] + shard["length"], row + 0.32), ha="right",
                            va="top", fontsize=10, xytext=(-3, 0), textcoords="offset points")
    ax.set_yticks(range(len(layouts)),
                  [labels["ranks"].format(n=number(len(shards), lang)) for shards in layouts])
    ax.invert_yaxis()
    ax.axvline(numel, color="black", linewidth=0.8)
    ax.set_xlabel(labels["elements"])
    ax.set_xlim(0, numel * 1.04)
    fig.tight_layout()
    return fig


STATES_LABELS = {
    "en": {"title": "A step's folder: its five states, and what moves it between them",
           "staging": "staging", "committed": "committed", "published": "published",
           "aside": "aside", "deleting": "deleting", "gone": "deleted",
           "rows": "rows {a} to {b}", "row": "row {a}",
           "sha256": "manifest.sha256\nwritten", "publish": "renamed:\npublished",
           "re-save": "↓ renamed by\na re-save", "back": "↑ renamed back if the\nnew copy fails to verify",
           "prune": "renamed by\na prune", "debris": "the next save of\nits step, or a prune",
           "by prune": "the prune", "replaced": "once the new copy\nis published",
           "if published": "if step-N\nexists:\ndebris",
           "complete": "a crash here leaves a complete copy, published if its step has none",
           "skipped": "a crash here leaves debris, which readers skip"},
    "fa": {"title": "پوشهٔ یک گام: پنج وضعیتش، و آنچه آن را از یکی به دیگری می‌برد",
           "staging": "آماده‌سازی", "committed": "قطعی‌شده", "published": "منتشرشده",
           "aside": "جایگزین‌شده", "deleting": "در حال پاک شدن", "gone": "پاک‌شده",
           "rows": "ردیف‌های {a} تا {b}", "row": "ردیف {a}",
           "sha256": "نوشتن\nmanifest.sha256", "publish": "تغییر نام:\nانتشار",
           "re-save": "↓ تغییر نام در\nذخیرهٔ دوباره", "back": "↑ بازگرداندن نام اگر رونوشت\nتازه از وارسی نگذرد",
           "prune": "تغییر نام\nدر هرس", "debris": "ذخیرهٔ بعدی همان گام\nیا هرس",
           "by prune": "هرس", "replaced": "همین که رونوشت تازه\nمنتشر شد",
           "if published": "اگر step-N\nموجود باشد:\nپس‌مانده",
           "complete": "از کار افتادن در اینجا رونوشتی کامل به جا می‌گذارد، که اگر step-N نباشد منتشر می‌شود",
           "skipped": "از کار افتادن در اینجا پس‌مانده‌ای به جا می‌گذارد که خواننده‌ها کنارش می‌گذارند"},
}
# (state, folder on disk, its rows in the table of a save's moments, centre x, centre y)
FOLDER_STATES = [("staging", ".step-N.tmp", (1, 6), 0.0, 2.6),
                 ("committed", ".step-N.tmp\n+ manifest.sha256", (7, 7), 2.5, 2.6),
                 ("published", "step-N", (8, 8), 5.0, 2.6),
                 ("deleting", ".step-N.deleting", None, 2.5, 0.0),
                 ("aside", ".step-N.replaced", None, 5.0, 0.0)]
STATE_COLOURS = {"complete": "#c7e9c0", "skipped": "#e0e0e0"}


def folder_states_figure(lang: str = "en") -> Figure:
    """The five states a step's folder can be left in (lesson 80a): boxes coloured by what a
    crash there leaves (a complete copy, or debris; a committed copy beside a published step-N
    is debris, the grey arrow from it), arrows labelled by the write, rename or
    deletion that moves the folder on, each box with its rows in the table of a save's moments
    (`faults.states_of_a_save`). Drawn right to left in Persian. A schematic: no data."""
    from matplotlib.patches import FancyBboxPatch, Patch

    labels, fig, ax = start_figure(STATES_LABELS, lang, figsize=(FIGURE_WIDTH, 6.4))
    side = -1 if lang == "fa" else 1  # Persian reads right to left: mirror the x axis
    align = {1: "left", -1: "right"}
    half_w, half_h = 1.1, 0.7
    centres = {}
    for state, folder, rows, x, y in FOLDER_STATES:
        x *= side
        centres[state] = (x, y)
        kind = "skipped" if state in ("staging", "deleting") else "complete"
        ax.add_patch(FancyBboxPatch((x - half_w, y - half_h), 2 * half_w, 2 * half_h,
                                    boxstyle="round,pad=0.02", facecolor=STATE_COLOURS[kind],
                                    edgecolor="#555555"))
        ax.text(x, y + 0.4, labels[state], ha="center", va="center", fontsize=12, weight="bold")
        if lang == "fa" and "\n" not in folder:
            folder = f"\u2066{folder}\u2069"  # a name: left to right, Latin in a Persian figure
        ax.text(x, y - 0.05 if "\n" in folder else y, folder, ha="center", va="center",
                fontsize=10.5)
        if rows:
            text = labels["row" if rows[0] == rows[1] else "rows"].format(
                a=number(rows[0], lang), b=number(rows[1], lang))
            ax.text(x, y - 0.48, text, ha="center", va="center", fontsize=10.5, color="#08519c")
    band_y = -2.1
    left, right = sorted((-1.1 * side, 7.6 * side))
    ax.add_patch(FancyBboxPatch((left, band_y - 0.25), right - left, 0.5, boxstyle="round,pad=0.02",
                                facecolor="white", edgecolor="#555555", linestyle="--"))
    ax.text((left + right) / 2, band_y, labels["gone"], ha="center", va="center", fontsize=12)

    def arrow(start, end, text, at, ha="center", colour="black"):
        ax.annotate("", end, start, arrowprops={"arrowstyle": "-|>", "color": colour, "lw": 1.4,
                                                "shrinkA": 0, "shrinkB": 0})
        ax.text(*at, text, ha=ha, va="center", fontsize=10.5)

    (sx, sy), (cx, cy), (px, py) = centres["staging"], centres["committed"], centres["published"]
    (dx, dy), (ax_, ay) = centres["deleting"], centres["aside"]
    arrow((sx + side * half_w, sy), (cx - side * half_w, cy), labels["sha256"],
          ((sx + cx) / 2, sy + half_h + 0.4))
    arrow((cx + side * half_w, cy), (px - side * half_w, py), labels["publish"],
          ((cx + px) / 2, cy + half_h + 0.4))
    arrow((px + 0.3 * side, py - half_h), (ax_ + 0.3 * side, ay + half_h), labels["re-save"],
          (px + 0.5 * side, (py + ay) / 2 + 0.3), align[side])
    arrow((ax_ - 0.3 * side, ay + half_h), (px - 0.3 * side, py - half_h), labels["back"],
          (px + 0.5 * side, (py + ay) / 2 - 0.3), align[side])
    arrow((px - 0.9 * side, py - half_h), (dx + 0.5 * side, dy + half_h), labels["prune"],
          (dx + 0.75 * side, (py + dy) / 2), align[-side])
    # a committed copy beside a published step-N is debris too: it joins the staging copy's way out
    arrow((cx - 0.9 * side, cy - half_h), (sx + 0.03 * side, sy - half_h - 0.75),
          labels["if published"], (sx + 0.15 * side, sy - half_h - 1.3), align[side], "#777777")
    arrow((sx, sy - half_h), (sx, band_y + 0.27), labels["debris"],
          (sx + 0.12 * side, (dy - half_h + band_y) / 2), align[side], "#777777")
    arrow((dx, dy - half_h), (dx, band_y + 0.27), labels["by prune"],
          (dx + 0.12 * side, (dy + band_y) / 2), align[side], "#777777")
    arrow((ax_, ay - half_h), (ax_, band_y + 0.27), labels["replaced"],
          (ax_ + 0.12 * side, (ay + band_y) / 2), align[side], "#777777")
    ax.set_xlim(sorted((-1.2 * side, 7.7 * side)))
    ax.set_ylim(band_y - 0.35, 4.3)
    ax.axis("off")
    ax.set_title(labels["title"], fontsize=12)
    legend_below(ax, ncol=1, below=0.1,
                 handles=[Patch(facecolor=STATE_COLOURS[k], edgecolor="#555555", label=labels[k])
                          for k in ("complete", "skipped")])
    fig.tight_layout()
    return fig


MODES_LABELS = {
    "en": {"blocking": "blocking save:\ntraining loop", "loop": "background save:\ntraining loop",
           "writer": "background save:\nwriter thread", "step": "training step",
           "save": "save: training stopped", "copy": "copy to host memory",
           "write": "write and hash, beside training", "seconds": "{s} s",
           "copied": "copy, {s} s",
           "time": "time (s), modelled: the 7.5B example, steps of {step} s"},
    "fa": {"blocking": "ذخیرهٔ مسدودکننده:\nحلقهٔ آموزش", "loop": "ذخیره در پس‌زمینه:\nحلقهٔ آموزش",
           "writer": "ذخیره در پس‌زمینه:\nرشتهٔ نویسنده", "step": "گام آموزش",
           "save": "ذخیره: آموزش متوقف", "copy": "رونوشت به حافظهٔ میزبان",
           "write": "نوشتن و چکیده‌گیری، کنار آموزش", "seconds": "{s} ثانیه",
           "copied": "رونوشت، {s} ثانیه",
           "time": "زمان (ثانیه)، مدل‌سازی‌شده: مدل ۷٫۵ میلیارد پارامتری، گام‌های {step} ثانیه‌ای"},
}
MODES_COLOURS = {"step": "#c6dbef", "save": "#d62728", "copy": "#08519c", "write": "#fdae6b"}


def save_modes_figure(blocking_s: float, copy_s: float, step_s: float = 10.0,
                      lang: str = "en") -> Figure:
    """One save of each kind on a time axis, modelled (lesson 80b): a blocking save stops the
    training loop for `blocking_s`; a background save stops it for its copy, `copy_s`, and its
    writer thread then spends `blocking_s` writing and hashing beside the next steps. Two steps of
    `step_s` before the save, and steps after it up to the same end time."""
    labels, fig, ax = start_figure(MODES_LABELS, lang, figsize=(FIGURE_WIDTH, 3.6))
    before = 2 * step_s
    end = before + blocking_s + 2 * step_s

    def steps(row, start):
        while start < end:
            ax.barh(row, min(step_s, end - start), left=start, height=0.6, color=MODES_COLOURS["step"],
                    edgecolor="white", label=labels["step"] if row == 0 and start == 0 else None)
            start += step_s

    steps(0, 0.0)
    ax.barh(0, blocking_s, left=before, height=0.6, color=MODES_COLOURS["save"], label=labels["save"])
    ax.text(before + blocking_s / 2, 0, labels["seconds"].format(s=number(round(blocking_s, 1), lang)),
            ha="center", va="center", color="white", fontsize=11)
    steps(0, before + blocking_s)
    steps(1, 0.0)
    ax.barh(1, max(copy_s, 0.004 * end), left=before, height=0.6, color=MODES_COLOURS["copy"],
            label=labels["copy"])
    steps(1, before + copy_s)
    ax.annotate(labels["copied"].format(s=number(round(copy_s, 2), lang)), (before, 1.3),
                xytext=(before - 0.02 * end, 1.62), ha="right", va="center", fontsize=10.5,
                arrowprops={"arrowstyle": "-", "color": "#555555"})
    ax.barh(2, blocking_s, left=before + copy_s, height=0.6, color=MODES_COLOURS["write"],
            label=labels["write"])
    ax.set_yticks([0, 1, 2], [labels["blocking"], labels["loop"], labels["writer"]])
    ax.set_ylim(2.5, -0.5)
    ax.set_xlim(0, end)
    ax.set_xlabel(labels["time"].format(step=number(round(step_s), lang)))
    legend_below(ax, ncol=2)
    fig.tight_layout()
    return fig

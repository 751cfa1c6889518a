"""What `python -m lesson_code.scale_lab` prints, in English or Persian (lesson 78's scale lab).

Each function takes what the lab measured and returns lines of text: what the simulation
measures and what it cannot, the sweep beside the formulas, the ZeRO paper's table with every
byte the paper does not count and why, lesson 79's pipeline per stage, and the check against
real ranks. Numbers in Persian follow `lesson_code.language`.
"""

from __future__ import annotations

import pandas as pd

from lesson_code import language
from lesson_code.bench import stored as bench_stored

SAY = {
    "en": {
        "title": "Lesson 78 at scale: the course's DDP and ZeRO stages 1-3, unchanged, on "
                 "simulated ranks in one process",
        "measures": "Measured: the bytes each rank keeps (parameters, gradients, optimizer "
                    "state, buffers), read from its tensors' storage; the most it holds at "
                    "once in a step; the bytes and messages it sends, from its ledger.",
        "cannot": "Not measured: time, bandwidth, contention, or the buffers NCCL and gloo "
                  "allocate for themselves. DDP and ZeRO ranks are simulated one at a time in "
                  "torch's fake process group (what a rank receives is not real) with tensors "
                  "on the meta device (shapes and bytes, no memory, no values).",
        "pipeline_threads": "Lesson 79's pipeline runs too: its stages are threads of this process "
                    "that pass real activations.",
        "sweep": "MiniGPT of {parameters:,} parameters ({dtype} weights and gradients, fp32 "
                 "master copy and moments), one step, the last rank of N ranks. MB held after "
                 "the step (parameters, gradients, optimizer state), measured / formula:",
        "sent": "MB each rank sent in the step, measured / formula:",
        "matches": "Of what the formulas count, every rank held exactly the formula over its "
                   "real shard (padded so that N divides it): {ok}",
        "reads": "Values read from meta tensors, which have none, and answered 0: {reads} in "
                 "each step of {strategies} (DDP's check that no rank missed a gradient: 0 "
                 "says none did)",
        "paper": "The ZeRO paper's Figure 1 (Rajbhandari et al., 2020), 7.5B parameters "
                 "({parameters:,}, a MiniGPT of 36 blocks of width 4096) on {world_size} ranks, "
                 "mixed-precision Adam, rank {rank}; GB = 1e9 bytes:",
        "paper_row": "  {strategy:7s} paper {paper:g} GB, formula {formula:.2f}, measured "
                     "{measured:.2f} (agrees: {agrees}); all it holds {held:.2f} GB",
        "beyond": "    + {gb:.3f} GB {why}",
        "peaks": "    peak in the step {peak:.1f} GB; while building {setup:.1f} GB",
        "peak_why": "  The step's peak adds activations, the flat copies the step makes of "
                    "gradients and weights, Adam's temporaries and ring buffers. While "
                    "building, every rank first makes the whole model in float32 "
                    "(zero_lab.run_model) and casts it, before the optimizer takes its shard.",
        "pipeline": "Lesson 79's pipeline: a MiniGPT of {layers} layers ({parameters:,} "
                    "parameters, float32), {micro_batches} micro-batches, {schedule}, every "
                    "stage a thread. Per stage: MB of parameters (least-most), the most bytes a "
                    "stage sent, the most activations a stage kept at once:",
        "pipeline_row": "  P = {stages:3d}: {least:.3f}-{most:.3f} MB, {sent:,} bytes, {stored}",
        "pipeline_check": "Every stage sent what lesson 79's protocol sends: {sent_ok}; the "
                          "loss is the same for every P: {loss_ok}",
        "check": "N = 4 against 4 real gloo ranks: bytes held equal {held}, sent equal {sent}, "
                 "messages equal {messages}; peaks differ by at most {peak:,} bytes (LayerNorm "
                 "keeps its statistics in float32 on the meta device, as on a GPU, in bfloat16 "
                 "in the CPU kernel).",
        "check_values": "  {strategy}: after one step on 4 threads of this process, the "
                        "parameters differ from the real ranks' by {distance:.2g} of how far "
                        "the step moved them (largest difference {diff:.2g})",
        "check_ddp": "  (Both runs of DDP here all-reduce with torch's own collectives: lesson "
                     "77's ring runs on a thread of its own, to which a simulated rank cannot "
                     "lend its process group.)",
        "check_pipeline": "  Lesson 79's step on 4 threads: traffic equal {traffic}, largest "
                          "gradient difference {grad:.2g}",
        "seconds": "Ran in {seconds:.0f} s.",
        "stored": "lesson 78b scale lab: MiniGPT with {parameters:,} parameters, {dtype} weights "
                  "and gradients, fp32 master copy and moments, one step of {tokens} tokens on "
                  "each rank; bytes held, peak and sent by the last rank of N simulated ranks "
                  "(torch's fake process group, tensors on the meta device)",
        "stored_to": "The sweep is stored in {path}, which the book's page and its memory "
                     "calculator read.",
        "why": {
            "gradients: buckets": "DDP's buckets: each gradient is copied into a bucket to be "
                                  "all-reduced, and both are kept (torch's DDP too, unless "
                                  "gradient_as_bucket_view=True)",
            "gradients: shard": "ZeRO-1's averaged gradient shard, kept beside the whole "
                                ".grad until zero_grad()",
            "gradients: .grad": "whole gradients a sharded stage should not keep",
            "buffers: model buffers": "of buffers: MiniGPT's causal masks, a T x T table of "
                                      "booleans per block (not model state)",
        },
    },
    "fa": {
        "title": "درس ۷۸ در مقیاس بزرگ: پیاده‌سازی همین درس‌ها از DDP و مرحله‌های ۱ تا ۳ ZeRO، بی‌هیچ "
                 "تغییری، روی رتبه‌های شبیه‌سازی‌شده در یک فرایند",
        "measures": "اندازه‌گیری‌شده: بایت‌هایی که هر رتبه نگه می‌دارد (پارامترها، گرادیان‌ها، "
                    "وضعیت بهینه‌ساز، بافرها) که از حافظهٔ زیرین تنسورهایش خوانده می‌شود؛ بیشترین "
                    "حافظه‌ای که در یک گام هم‌زمان نگه می‌دارد؛ و بایت‌ها و پیام‌هایی که "
                    "می‌فرستد، از دفتر ارتباطاتش.",
        "cannot": "اندازه‌گیری‌نشده: زمان، پهنای باند، رقابت بر سر منابع، و بافرهایی که "
                  "NCCL و gloo برای خودشان تخصیص می‌دهند. رتبه‌های DDP و ZeRO یکی‌یکی در گروه "
                  "فرایند «`fake`» در PyTorch شبیه‌سازی می‌شوند (آنچه یک رتبه دریافت می‌کند واقعی "
                  "نیست) و تنسورهایشان روی دستگاه «`meta`» است (شکل و بایت دارند، نه حافظه و نه "
                  "مقدار).",
        "pipeline_threads": "پایپلاینِ درس ۷۹ هم اجرا می‌شود: مرحله‌هایش رشته‌های همین فرایندند و "
                    "فعال‌سازی‌های واقعی را به هم می‌دهند.",
        "sweep": "MiniGPT با {parameters:,} پارامتر (وزن‌ها و گرادیان‌های {dtype}، رونوشت "
                 "اصلی fp32 و گشتاورهای fp32)، یک گام، آخرین رتبه از N رتبه. مگابایت نگه‌داشته پس "
                 "از گام (پارامترها، گرادیان‌ها، وضعیت بهینه‌ساز)، اندازه‌گیری / فرمول:",
        "sent": "مگابایت فرستادهٔ هر رتبه در گام، اندازه‌گیری / فرمول:",
        "matches": "از آنچه فرمول‌ها می‌شمارند، هر رتبه دقیقاً همان فرمول را روی شارد واقعی‌اش "
                   "(با پدینگ تا N بر آن بخش‌پذیر شود) نگه داشت: {ok}",
        "reads": "مقدارهایی که از تنسورهای «`meta`» خوانده شد، که مقداری ندارند، و با ۰ پاسخ "
                 "گرفت: {reads} در هر گام {strategies} (وارسی DDP که هیچ رتبه‌ای گرادیانی را "
                 "جا نینداخته باشد: ۰ یعنی هیچ‌کدام نینداخت)",
        "paper": "شکل ۱ مقالهٔ ZeRO (راجباندری و همکاران، ۲۰۲۰)، ۷٫۵ میلیارد پارامتر "
                 "({parameters:,}، یک MiniGPT با ۳۶ بلوک به پهنای ۴۰۹۶) روی {world_size} "
                 "رتبه، Adam با دقت ترکیبی، رتبهٔ {rank}؛ هر گیگابایت {gigabyte:g} بایت:",
        "paper_row": "  {strategy}: مقاله {paper:g} گیگابایت، فرمول {formula:.2f}، اندازه‌گیری "
                     "{measured:.2f} (هم‌خوان: {agrees})؛ همهٔ آنچه نگه می‌دارد {held:.2f} گیگابایت",
        "beyond": "    + {gb:.3f} گیگابایت {why}",
        "peaks": "    بیشینهٔ حافظه در گام {peak:.1f} گیگابایت؛ هنگام ساختن {setup:.1f} گیگابایت",
        "peak_why": "  بیشینهٔ حافظهٔ گام این‌ها را هم دارد: فعال‌سازی‌ها، رونوشت‌های تختی که گام از "
                    "گرادیان‌ها و وزن‌ها می‌سازد، تنسورهای موقت Adam و بافرهای حلقه. هنگام "
                    "ساختن، هر رتبه نخست کل مدل را با float32 می‌سازد (zero_lab.run_model) و "
                    "تبدیلش می‌کند، پیش از آنکه بهینه‌ساز شاردش را بردارد.",
        "pipeline": "پایپلاین درس ۷۹: یک MiniGPT با {layers} لایه ({parameters:,} پارامتر، "
                    "float32)، {micro_batches} میکرودسته، {schedule}، هر مرحله یک رشته. برای "
                    "هر مرحله: مگابایت پارامترها (کمترین تا بیشترین)، بیشترین بایت‌هایی که یک "
                    "مرحله فرستاد، بیشترین فعال‌سازی‌هایی که یک مرحله هم‌زمان نگه داشت:",
        "pipeline_row": "  P = {stages}: {least:.3f} تا {most:.3f} مگابایت، {sent:,} بایت، {stored}",
        "pipeline_check": "هر مرحله همان را فرستاد که پروتکل درس ۷۹ می‌فرستد: {sent_ok}؛ زیان "
                          "برای هر P یکی است: {loss_ok}",
        "check": "N = ۴ در برابر ۴ رتبهٔ واقعی gloo: بایت‌های نگه‌داشته برابر {held}، "
                 "فرستاده برابر {sent}، پیام‌ها برابر {messages}؛ بیشینه‌های حافظه حداکثر {peak:,} بایت "
                 "اختلاف دارند (LayerNorm آماره‌هایش را روی دستگاه «`meta`»، مانند GPU، با float32 "
                 "نگه می‌دارد و در کرنل محاسباتیِ CPU با bfloat16).",
        "check_values": "  {strategy}: پس از یک گام روی ۴ رشتهٔ همین فرایند، فاصلهٔ پارامترها "
                        "از پارامترهای رتبه‌های واقعی {distance:.2g} از مسافتی است که گام آن‌ها "
                        "را جابه‌جا کرد (بیشترین اختلاف {diff:.2g})",
        "check_ddp": "  (هر دو اجرای DDP در این‌جا با عملیات جمعی خودِ PyTorch کاهش همگانی "
                     "می‌کنند: حلقهٔ درس ۷۷ روی رشتهٔ جداگانه‌ای اجرا می‌شود که یک رتبهٔ "
                     "شبیه‌سازی‌شده نمی‌تواند گروه فرایندش را به آن بسپارد.)",
        "check_pipeline": "  گام درس ۷۹ روی ۴ رشته: ترافیک برابر {traffic}، بیشترین اختلاف "
                          "گرادیان {grad:.2g}",
        "seconds": "اجرا در {seconds:.0f} ثانیه.",
        "stored": "آزمایشگاه مقیاس درس ۷۸ب: MiniGPT با {parameters:,} پارامتر، وزن‌ها و "
                  "گرادیان‌های {dtype}، رونوشت اصلی fp32 و گشتاورهای fp32، یک گام با {tokens} توکن "
                  "روی هر رتبه؛ بایت‌های نگه‌داشته، بیشینهٔ حافظه و بایت‌های فرستادهٔ آخرین رتبه از N رتبهٔ "
                  "شبیه‌سازی‌شده (گروه فرایند «`fake`» در PyTorch، تنسورها روی دستگاه «`meta`»)",
        "stored_to": "پیمایش در {path} ذخیره شد؛ صفحهٔ کتاب و ماشین‌حساب حافظه‌اش آن را "
                     "می‌خوانند.",
        "why": {
            "gradients: buckets": "باکت‌های DDP: هر گرادیان برای کاهش همگانی در یک باکت "
                                  "رونوشت می‌شود و هر دو نگه داشته می‌شوند (DDP خودِ PyTorch هم، مگر "
                                  "با gradient_as_bucket_view=True)",
            "gradients: shard": "شارد میانگین‌گرفتهٔ گرادیان ZeRO-1 که تا zero_grad() کنار "
                                ".grad کامل می‌ماند",
            "gradients: .grad": "گرادیان‌های کاملی که مرحله‌ای شاردشده نباید نگه دارد",
            "buffers: model buffers": "بافر: ماسک‌های علّی MiniGPT، جدولی T × T از بولی‌ها "
                                      "برای هر بلوک (جزو وضعیت مدل نیست)",
        },
    },
}


def say(key: str, lang: str, **values) -> str:
    """The sentence `key` of the report in `lang`, filled with `values` (language.fill)."""
    return language.fill(SAY[language.check_language(lang)][key], lang, **values)


def header(lang: str, pipeline: bool = True) -> list[str]:
    """What the lab is, what it measures and what it cannot; with `pipeline`, that lesson 79's
    pipeline runs too, and how."""
    lines = [say("title", lang), say("measures", lang), say("cannot", lang)]
    return lines + [say("pipeline_threads", lang)] if pipeline else lines


def stored_description(run) -> str:
    """What the stored sweep of `run` (a `ScaleRun`) holds, as its file's first line says it."""
    return say("stored", "en", **_stored_facts(run))


def stored_note(note: dict[str, str], run, lang: str) -> str:
    """The stored sweep's note (`scale_lab.stored.load`) in `lang`: what it holds, then when
    and on what machine (bench.stored.note_text's words). Raises ValueError when the table was
    stored for another run than `run`, whose facts the Persian sentence is written from."""
    if note["description"] != stored_description(run):
        raise ValueError(f"the stored sweep is of another run ({note['description']!r}): store "
                         "this one with python -m lesson_code.scale_lab --into-package")
    measured = bench_stored.MEASURED_ON[0].format(date=note["measured"], machine=note["machine"])
    return "\n".join([say("stored", lang, **_stored_facts(run)),
                      bench_stored.note_text([measured], lang)])


def _stored_facts(run) -> dict:
    tokens = run.sequences_per_rank * (run.tokens or run.gpt.context)
    return {"parameters": run.parameters, "dtype": run.dtype, "tokens": tokens}


def sweep_lines(table: pd.DataFrame, parameters: int, dtype: str, lang: str) -> list[str]:
    """The sweep as two small tables, N down and strategies across: MB held after the step,
    then MB sent in it, each "measured/formula"."""
    strategies = list(dict.fromkeys(table.strategy))
    head = "  " + "N".rjust(4) + "".join(s.rjust(16) for s in strategies)
    lines = [say("sweep", lang, parameters=parameters, dtype=dtype), head]
    for column, formula, title in (("model_states", "formula", None),
                                   ("sent", "formula_sent", "sent")):
        if title:
            lines += [say(title, lang), head]
        for n, group in table.groupby("N", sort=True):
            rows = group.set_index("strategy").loc[strategies]
            cells = [megabytes(row[column], lang) + "/" + megabytes(row[formula], lang)
                     for _, row in rows.iterrows()]
            lines.append("  " + language.number(int(n), lang).rjust(4)
                         + "".join(cell.rjust(16) for cell in cells))
    return lines


def megabytes(nbytes: float, lang: str) -> str:
    """`nbytes` in MB with two decimals, as edition `lang` writes a number."""
    return language.number(nbytes / 1e6, lang, ".2f")


def reads_lines(table: pd.DataFrame, lang: str) -> list[str]:
    """How many values the simulated steps read from meta tensors (answered 0), if any."""
    reading = table[table.scalar_reads > 0]
    if reading.empty:
        return []
    strategies = language.listed(dict.fromkeys(reading.strategy), lang)
    return [say("reads", lang, reads=int(reading.scalar_reads.max()), strategies=strategies)]


def paper_lines(table: pd.DataFrame, lang: str) -> list[str]:
    """The paper's table, each strategy's measured figure, and every byte beyond the paper's
    count with why it is there."""
    facts = table.attrs
    lines = [say("paper", lang, parameters=facts["parameters"], world_size=facts["world_size"],
                 rank=facts["rank"], gigabyte=1e9)]
    for strategy, row in table.iterrows():
        lines.append(say("paper_row", lang, strategy=strategy, paper=row.paper_GB,
                         formula=row.formula_GB, measured=row.measured_GB, agrees=bool(row.agrees),
                         held=row.held_GB))
        for item, nbytes in row.beyond.items():
            lines.append(say("beyond", lang, gb=nbytes / 1e9,
                             why=SAY[lang]["why"].get(item, item)))
        lines.append(say("peaks", lang, peak=row.peak_GB, setup=row.setup_peak_GB))
    return lines + [say("peak_why", lang)]


def pipeline_lines(table: pd.DataFrame, run, lang: str) -> list[str]:
    """Per number of stages: the least and most parameter MB of a stage, the most bytes a stage
    sent and activations it kept; then whether every stage sent the protocol's bytes."""
    lines = [say("pipeline", lang, layers=table.attrs["layers"], parameters=table.attrs["parameters"],
                 micro_batches=run.micro_batches, schedule=run.schedule.upper())]
    for stages, group in table.groupby("P"):
        lines.append(say("pipeline_row", lang, stages=int(stages),
                         least=group.parameters.min() / 1e6, most=group.parameters.max() / 1e6,
                         sent=int(group.sent.max()), stored=int(group.peak_stored.max())))
    losses = table.loss.dropna()
    return lines + [say("pipeline_check", lang, sent_ok=bool((table.sent == table.formula_sent).all()),
                        loss_ok=bool((losses == losses.iloc[0]).all()))]


def check_lines(check: pd.DataFrame, pipeline_check: pd.DataFrame, lang: str) -> list[str]:
    """The comparison with real ranks: the bytes, then the parameters of each strategy, then
    lesson 79's step."""
    lines = [say("check", lang, held=bool(check.held_equal.all()), sent=bool(check.sent_equal.all()),
                 messages=bool(check.messages_equal.all()),
                 peak=int(check.peak_difference.abs().max()))]
    for strategy, rows in check.groupby(level="strategy", sort=False):
        lines.append(say("check_values", lang, strategy=strategy, distance=rows.distance.max(),
                         diff=rows.max_param_diff.max()))
        if strategy == "DDP":
            lines.append(say("check_ddp", lang))
    return lines + [say("check_pipeline", lang, traffic=bool(pipeline_check.traffic_equal.all()),
                        grad=pipeline_check.max_grad_diff.max())]

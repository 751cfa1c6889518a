"""The words of practice mode in both languages: report headings, failure sentences, hang hints.

A failure is a kind plus fields (`grading.Failure`); its sentence here is a format string per
language. A field is code (a name, a dtype, a traceback: shown as Python writes it), a number
(Persian digits in Persian), or prose: prose is a `Phrase`, which carries its words in both
languages, so that no English fragment lands inside a Persian sentence. The Persian words are
the glossary's (book/fa/glossary.md); tests/practice/test_practice_words.py holds them to it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from lesson_code import language

LANGUAGES = ("en", "fa")
LIST_SEPARATOR = {"en": ", ", "fa": "، "}
LAST_SEPARATOR = {"en": " and ", "fa": " و "}


@dataclass(frozen=True)
class Phrase:
    """Prose for the report in both languages: a format string per language and its fields.

    Fields are localized like a failure's (numbers in the reader's digits, nested phrases in
    the reader's language). Built inside ranks too, so it stays plain data (picklable).
    """

    en: str
    fa: str
    fields: dict[str, Any] = field(default_factory=dict, hash=False)

    def with_fields(self, **fields: Any) -> Phrase:
        """This phrase with `fields` added (a shared sentence filled in for one case)."""
        return Phrase(self.en, self.fa, {**self.fields, **fields})

    def text(self, lang: str) -> str:
        """The phrase in `lang`."""
        return _filled(getattr(self, check_language(lang)), self.fields, lang)


def phrase(en: str, fa: str, **fields: Any) -> Phrase:
    """`Phrase(en, fa, fields)`, written as a call."""
    return Phrase(en, fa, fields)


@dataclass(frozen=True)
class Number:
    """A float shown with `digits` significant digits (enough to tell it from its neighbour)."""

    value: float
    digits: int


def distinct_numbers(got: float, expected: float) -> tuple[Number, Number]:
    """`got` and `expected` with the fewest significant digits (3 or more) that tell them apart."""
    for digits in range(3, 18):
        if f"{got:.{digits}g}" != f"{expected:.{digits}g}":
            break
    return Number(got, digits), Number(expected, digits)


def listing(items: list[Any] | tuple[Any, ...]) -> Phrase:
    """"0, 1 and 2" in the reader's language (its digits and separators)."""
    fields = {f"item{index}": item for index, item in enumerate(items)}
    slots = ["{%s}" % name for name in fields]
    texts = {lang: LIST_SEPARATOR[lang].join(slots[:-1]) + LAST_SEPARATOR[lang] + slots[-1]
             if len(slots) > 1 else "".join(slots) for lang in LANGUAGES}
    return Phrase(texts["en"], texts["fa"], fields)


# An optional page's letter in Persian: lesson 78's optional page, "78a", is «۷۸الف».
PAGE_LETTERS = {"a": "الف", "b": "ب"}


def lesson_name(number: int | str) -> int | Phrase:
    """A lesson as the report names it: a number (written in the reader's digits), or an
    optional page such as "78a", in Persian «۷۸الف»."""
    if isinstance(number, int):
        return number
    digits, letter = number[:-1], number[-1]
    return Phrase(number, language.persian_digits(digits) + PAGE_LETTERS[letter])


def every_rank(world_size: int) -> Phrase:
    """"all 4 ranks" (or "rank 0 alone"): the group of a case run on every rank of its world."""
    if world_size == 1:
        return phrase("rank {zero} alone", "رتبهٔ {zero} به‌تنهایی", zero=0)
    return phrase("all {n} ranks", "همهٔ {n} رتبه", n=world_size)


HEADINGS = {
    "en": {
        "title": "Lesson {lesson}: checking {path}",
        "first_failure": "first failing case",
        "hint": "hint", "why": "why",
        "passed": "passed", "failed": "FAILED", "skipped": "not run",
        "gate_skipped": "checks {first} to {last} were not run: {reason}",
        "summary_pass": "All {total} checks passed.",
        "summary_fail": "{failed} of {total} checks failed.",
        "summary_fail_skipped": "{failed} of {total} checks failed; {skipped} were not run.",
        "summary_one_pass": "Check {number} passed.",
        "summary_one_fail": "Check {number} failed.",
        "details": "Details of {title}:",
        "waiting": "Where each rank was waiting (innermost call first):",
        "waiting_ranks": "rank {ranks}", "waiting_ranks_many": "ranks {ranks}",
        "waiting_at": "line {line} of {file}, in {function}: {source}",
        "waiting_at_no_source": "line {line} of {file}, in {function}",
        "called_from": "called from {calls}",
        "call_at": "{function} (line {line})",
        "outside_file": "not in your file: {calls}",
        "no_stack": "(it did not answer the request for its stack)",
        "timing": "Time on {world_size} ranks ({what}), {rounds} rounds timed in alternation: "
                  "yours {yours} ({yours_low} to {yours_high}), the course's {course} "
                  "({course_low} to {course_high}). Round by round, yours took {low} to {high} "
                  "times the course's time (median {ratio}): that spread is this measurement's "
                  "noise on this machine, so only a ratio further from {one} than the spread says "
                  "that one is faster.",
        "milliseconds": "{value} ms",
        "started": "Wrote {path}: fill in each function marked NotImplementedError, then run\n"
                   "  python -m lesson_code.practice check {lesson} {path}{lang_flag}",
        "running": "running {title} ...",
    },
    "fa": {
        "title": "درس {lesson}: وارسی {path}",
        "first_failure": "نخستین حالت ناموفق",
        "hint": "راهنمایی", "why": "چرا",
        "passed": "قبول", "failed": "رد", "skipped": "اجرا نشد",
        "gate_skipped": "وارسی‌های {first} تا {last} اجرا نشدند: {reason}",
        "summary_pass": "هر {total} وارسی قبول شد.",
        "summary_fail": "{failed} وارسی از {total} رد شد.",
        "summary_fail_skipped": "{failed} وارسی از {total} رد شد و {skipped} وارسی اجرا نشد.",
        "summary_one_pass": "وارسی {number} قبول شد.",
        "summary_one_fail": "وارسی {number} رد شد.",
        "details": "جزئیات «{title}»:",
        "waiting": "جای انتظار هر رتبه (درونی‌ترین فراخوانی نخست):",
        "waiting_ranks": "رتبهٔ {ranks}", "waiting_ranks_many": "رتبه‌های {ranks}",
        "waiting_at": "خط {line} از {file}، در {function}: {source}",
        "waiting_at_no_source": "خط {line} از {file}، در {function}",
        "called_from": "فراخوانده از {calls}",
        "call_at": "{function} (خط {line})",
        "outside_file": "بیرون از فایل شما: {calls}",
        "no_stack": "(به درخواست پشتهٔ فراخوانی‌اش پاسخ نداد)",
        "timing": "زمان روی {world_size} رتبه ({what})، {rounds} دور به‌نوبت زمان‌گیری‌شده: "
                  "کد شما {yours} ({yours_low} تا {yours_high})، کد درس {course} "
                  "({course_low} تا {course_high}). دور به دور، زمان کد شما {low} تا {high} برابر "
                  "زمان کد درس بود (میانه {ratio}): این پراکندگی نوفهٔ این اندازه‌گیری روی این "
                  "دستگاه است، پس فقط نسبتی که بیش از این پراکندگی از {one} فاصله داشته باشد "
                  "نشان می‌دهد که یکی سریع‌تر است.",
        "milliseconds": "{value} میلی‌ثانیه",
        "started": "{path} نوشته شد: هر تابعی را که NotImplementedError دارد کامل کنید و سپس اجرا کنید\n"
                   "  python -m lesson_code.practice check {lesson} {path}{lang_flag}",
        "running": "در حال اجرای «{title}» ...",
    },
}

FAILURES = {
    "en": {
        "missing": "your file defines no function or class {name}",
        "other_lesson": "your file defines {names} of lesson {lesson}, and no {name}",
        "raised": "{case}: rank {rank} raised {error} (traceback below)",
        "timeout": "{case}: ranks {ranks} had not finished after {seconds} s",
        "crashed": "{case}: a rank process died",
        "mismatch": "{case}: rank {rank} differs from {reference} at element {index} of "
                    "{element_of}: got {got}, expected {expected}; {tolerance}",
        "shape": "{case}: rank {rank} returned shape {got}, expected {expected}",
        "not_in_place": "{case}: rank {rank} did not change the tensor it was given",
        "bytes": "{case}: rank {rank} sent {got} bytes; {expected_what} sends {expected}",
        "order": "{case}: stage {stage} ran {got}, expected {expected}",
        "value": "{case}: {what} is {got}, expected {expected}",
        "not_raised": "{case}: returned {got} instead of raising {expected}",
        # lesson 80: sharded checkpoints
        "no_manifest": "{case}: {file} is missing or unreadable ({error})",
        "no_entry": "{case}: manifest.json lists no file with \"rank\": {rank}",
        "unlisted": "{case}: {file} is in the checkpoint folder but not in manifest.json's files",
        "checksum": "{case}: manifest.json records {field} {got} for {file}, but the file has "
                    "{expected}",
        "accepted_flipped": "{case}: rank {rank} loaded {file} with one byte flipped instead of "
                            "raising",
        "accepted_truncated": "{case}: rank {rank} loaded {file} cut to half its bytes instead of "
                              "raising",
        "accepted_world_size": "{case}: rank {rank} loaded a checkpoint of {saved} ranks as one of "
                               "{world_size} ranks instead of raising",
        "lost_previous": "{case}: after the killed saves, rank {rank} cannot load {folder}: {error}",
        "published_half": "{case}: {folder} exists although its save was killed before it finished",
        "no_crash": "{case}: the save finished, but every rank was to be killed inside torch.save: "
                    "write each file's tensors with torch.save",
        # lesson 81: the capstone's resume
        "resumed": "{case}: the run resumed from step {step}'s checkpoint differs from the run "
                   "that never stopped in {what}",
        "no_checkpoint": "{case}: run_rank returned no checkpoint of step {step} in "
                         "result[\"checkpoints\"]",
    },
    "fa": {
        "missing": "فایل شما تابع یا کلاسی به نام `{name}` تعریف نمی‌کند",
        "other_lesson": "فایل شما {names} از درس {lesson} را تعریف می‌کند و `{name}` را نه",
        "raised": "{case}: رتبهٔ {rank} خطای {error} داد (ردِ پشته در پایین)",
        "timeout": "{case}: رتبه‌های {ranks} پس از {seconds} ثانیه هنوز تمام نکرده بودند",
        "crashed": "{case}: فرایند یکی از رتبه‌ها از کار افتاد",
        "mismatch": "{case}: در رتبهٔ {rank}، عنصر {index} از {element_of} با {reference} فرق دارد: "
                    "{got} به‌جای {expected}؛ {tolerance}",
        "shape": "{case}: رتبهٔ {rank} شکل {got} را برگرداند، نه {expected}",
        "not_in_place": "{case}: رتبهٔ {rank} تنسوری را که گرفته بود تغییر نداد",
        "bytes": "{case}: رتبهٔ {rank} در مجموع {got} بایت فرستاد؛ {expected_what} {expected} بایت "
                 "می‌فرستد",
        "order": "{case}: مرحلهٔ {stage} ترتیب {got} را اجرا کرد، نه {expected}",
        "value": "{case}: {what} برابر {got} است، نه {expected}",
        "not_raised": "{case}: به‌جای خطای {expected}، مقدار {got} را برگرداند",
        # درس ۸۰: چکپوینت شاردشده
        "no_manifest": "{case}: `{file}` وجود ندارد یا خواندنی نیست ({error})",
        "no_entry": "{case}: `manifest.json` هیچ فایلی با `\"rank\": {rank}` را فهرست نمی‌کند",
        "unlisted": "{case}: `{file}` در پوشهٔ چکپوینت هست ولی در فهرست فایل‌های `manifest.json` نیست",
        "checksum": "{case}: `manifest.json` برای `{file}` مقدار {field} را {got} ثبت کرده، ولی "
                    "مقدار خود فایل {expected} است",
        "accepted_flipped": "{case}: رتبهٔ {rank} فایل `{file}` را با یک بایت وارونه‌شده بارگذاری "
                            "کرد، به‌جای آنکه خطا بدهد",
        "accepted_truncated": "{case}: رتبهٔ {rank} فایل `{file}` را که به نیمه کوتاه شده بود "
                              "بارگذاری کرد، به‌جای آنکه خطا بدهد",
        "accepted_world_size": "{case}: رتبهٔ {rank} چکپوینتِ {saved} رتبه را در گروهی از "
                               "{world_size} رتبه بارگذاری کرد، به‌جای آنکه خطا بدهد",
        "lost_previous": "{case}: پس از ذخیره‌های کشته‌شده، رتبهٔ {rank} نمی‌تواند `{folder}` را "
                         "بارگذاری کند: {error}",
        "published_half": "{case}: `{folder}` وجود دارد، هرچند ذخیره‌اش پیش از پایان کشته شد",
        "no_crash": "{case}: ذخیره تمام شد، ولی قرار بود هر رتبه درون `torch.save` کشته شود: "
                    "تنسورهای هر فایل را با `torch.save` بنویسید",
        # درس ۸۱: ادامهٔ آموزش در پروژهٔ پایانی
        "resumed": "{case}: اجرای ادامه‌یافته از چکپوینت گام {step} در {what} با اجرای بی‌وقفه "
                   "فرق دارد",
        "no_checkpoint": "{case}: `run_rank` در `result[\"checkpoints\"]` هیچ چکپوینتی از گام {step} "
                         "برنگرداند",
    },
}

# What a failure of each kind most likely means, appended to its sentence (`Failure.diagnosis`).
DIAGNOSES = {
    "times_n": Phrase(
        "it is exactly {n} times the expected value everywhere: did you forget to divide by "
        "the group's size?",
        "همه‌جا دقیقاً {n} برابر مقدار درست است: آیا تقسیم بر اندازهٔ گروه فراموش شده است؟"),
    "own_input": Phrase(
        "it is this rank's own input, unchanged: nothing that the other ranks sent is in it",
        "این همان ورودی خود این رتبه است، دست‌نخورده: هیچ چیزی از آنچه رتبه‌های دیگر فرستادند "
        "در آن نیست"),
}

# Why a check was not run (`grading.CheckResult.skipped`).
SKIPPED = {
    "gate": Phrase(
        "your file must first import without an error and define the template's names",
        "فایل شما باید نخست بدون خطا بارگذاری شود و نام‌های قالب را تعریف کند"),
    "hang": Phrase(
        "it calls {function}, where the ranks were stuck in check {number}: fix that first",
        "این وارسی `{function}` را فرا می‌خواند، همان‌جا که رتبه‌ها در وارسی {number} گیر کردند: "
        "نخست همان را درست کنید"),
    "hang_via": Phrase(
        "it calls {name}, which calls {function}, where the ranks were stuck in check "
        "{number}: fix that first",
        "این وارسی `{name}` را فرا می‌خواند که `{function}` را فرا می‌خواند، همان‌جا که رتبه‌ها در "
        "وارسی {number} گیر کردند: نخست همان را درست کنید"),
}

# The hint of a run that hung, by its cause (`hangs.Hang.cause`); it replaces the check's own hint.
HANG_HINTS = {
    "in_send": Phrase(
        "every rank waits in a blocking dist.send for a receive that no rank has posted, a "
        "deadlock: either each rank sends before it receives (post the send and the receive "
        "together, dist.isend and dist.irecv, then wait on both (work.wait())), or the ranks "
        "receive from other peers than the ones that send to them",
        "هر رتبه در یک `dist.send` مسدودکننده منتظر دریافتی است که هیچ رتبه‌ای آغاز نکرده، یعنی "
        "بن‌بست: یا هر رتبه پیش از دریافت می‌فرستد (ارسال و دریافت را با هم آغاز کنید، "
        "`dist.isend` و `dist.irecv`، و سپس منتظر هر دو بمانید (`work.wait()`))، یا رتبه‌ها از "
        "همتاهایی دریافت می‌کنند که به آن‌ها نمی‌فرستند"),
    "in_recv": Phrase(
        "every rank waits in a blocking dist.recv for a message that no rank has sent, a "
        "deadlock: either each rank receives before it sends (post the send and the receive "
        "together, dist.isend and dist.irecv, then wait on both (work.wait())), or the ranks "
        "send to other peers than the ones that receive from them",
        "هر رتبه در یک `dist.recv` مسدودکننده منتظر پیامی است که هیچ رتبه‌ای نفرستاده، یعنی "
        "بن‌بست: یا هر رتبه پیش از ارسال دریافت می‌کند (ارسال و دریافت را با هم آغاز کنید، "
        "`dist.isend` و `dist.irecv`، و سپس منتظر هر دو بمانید (`work.wait()`))، یا رتبه‌ها به "
        "همتاهایی می‌فرستند که از آن‌ها دریافت نمی‌کنند"),
    "deadlock": Phrase(
        "a rank waited for a message that no rank had sent, a deadlock: every rank must post "
        "what its peers wait for before it waits itself. Post the sends and the receives "
        "together (dist.isend and dist.irecv), then wait on all of them (work.wait())",
        "رتبه‌ای منتظر پیامی ماند که هیچ رتبه‌ای نفرستاده بود، یعنی بن‌بست: هر رتبه باید آنچه "
        "همتایانش منتظرش هستند را پیش از آنکه خودش منتظر بماند آغاز کند. ارسال‌ها و دریافت‌ها "
        "را با هم آغاز کنید (`dist.isend` و `dist.irecv`) و سپس منتظر همهٔ آن‌ها بمانید "
        "(`work.wait()`)"),
    "apart": Phrase(
        "the ranks wait in different places, each for a message the others never send: every "
        "rank of the group must make the same sends and receives, in the same order, with "
        "matching peers",
        "رتبه‌ها در جاهای متفاوتی منتظرند و هر کدام پیامی را می‌خواهد که دیگران هرگز "
        "نمی‌فرستند: همهٔ رتبه‌های گروه باید ارسال‌ها و دریافت‌های یکسانی را، به یک ترتیب و با "
        "همتاهای جفت‌شده، انجام دهند"),
    "left": Phrase(
        "ranks {returned} had already returned, so they never sent what the others wait for: "
        "check that every rank runs every step of the loop, for every group size",
        "رتبه‌های {returned} پیش‌تر برگشته بودند، پس آنچه دیگران منتظرش هستند هرگز فرستاده نشد: "
        "مطمئن شوید که هر رتبه همهٔ گام‌های حلقه را، برای هر اندازهٔ گروه، اجرا می‌کند"),
    "busy": Phrase(
        "the ranks were still computing in your code, not waiting for a message: look for a "
        "loop that never ends; if your code is only slow, run the check again with a larger "
        "--timeout",
        "رتبه‌ها هنوز در کد شما محاسبه می‌کردند، نه منتظر پیامی: دنبال حلقه‌ای بگردید که هرگز "
        "تمام نمی‌شود؛ اگر کدتان فقط کند است، وارسی را با `--timeout` بزرگ‌تری دوباره اجرا کنید"),
    "peer_gone": Phrase(
        "this rank was waiting for a message when its neighbour stopped: most likely the "
        "neighbour gave up waiting too, a deadlock (post the send and the receive together, "
        "dist.isend and dist.irecv, then wait on both (work.wait())), unless it raised an error "
        "of its own",
        "این رتبه منتظر پیامی بود که همسایه‌اش متوقف شد: به احتمال زیاد همسایه هم از انتظار دست "
        "کشید، یعنی بن‌بست (ارسال و دریافت را با هم آغاز کنید، `dist.isend` و `dist.irecv`، و سپس "
        "منتظر هر دو بمانید (`work.wait()`))، مگر آنکه خودش خطایی داده باشد"),
    "unknown": Phrase(
        "the ranks did not finish in time: look where each one waits; if your code is only "
        "slow, run the check again with a larger --timeout",
        "رتبه‌ها به‌موقع تمام نکردند: ببینید هر کدام کجا منتظر است؛ اگر کدتان فقط کند است، "
        "وارسی را با `--timeout` بزرگ‌تری دوباره اجرا کنید"),
}


def check_language(lang: str) -> str:
    """`lang` if practice mode speaks it; ValueError naming the choices otherwise."""
    if lang not in LANGUAGES:
        raise ValueError(f"unknown language {lang!r}: use one of {', '.join(LANGUAGES)}")
    return lang


def localized(value: Any, lang: str) -> Any:
    """A field as the `lang` report prints it: a phrase in `lang`, numbers as `lang` writes them
    (alone or in a list; in Persian by the course's rule, `language.persian_number_text`: 1e-05
    is «۱۰⁻⁵»); any other value (names, dtypes, cases, tracebacks: code) unchanged."""
    if isinstance(value, Phrase):
        return value.text(lang)
    if isinstance(value, (list, tuple)) and value and all(_is_number(item) for item in value):
        return "[" + LIST_SEPARATOR[lang].join(localized(item, lang) for item in value) + "]"
    if not _is_number(value):
        return value
    if isinstance(value, Number):
        text = f"{value.value:.{value.digits}g}"
    elif isinstance(value, float) and math.isfinite(value):
        text = f"{value:.0f}" if abs(value) >= 100 else f"{value:.3g}"  # 1234 ms, not 1.23e+03
    else:
        text = str(value)
    return language.persian_number_text(text) if lang == "fa" else text


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float, Number)) and not isinstance(value, bool)


def plain(text: str, lang: str) -> str:
    """The course's words `text` (a sentence, a check's title or hint) as a terminal prints them in
    `lang`: in Persian each `name` in backticks stands in a left-to-right isolate instead
    (`language.isolated_code`), so that it reads in its own direction inside the line; English
    keeps its backticks."""
    return language.isolated_code(text) if check_language(lang) == "fa" else text


def _filled(template: str, fields: dict[str, Any], lang: str) -> str:
    """`template` (its names isolated in Persian: `plain`) formatted with `fields`, each
    localized; a field's own text (code, a traceback) is left as it is."""
    return plain(template, lang).format(
        **{name: localized(value, lang) for name, value in fields.items()})


def heading(key: str, lang: str, **fields: Any) -> str:
    """The report heading `key` in `lang`, filled with `fields`."""
    return _filled(HEADINGS[check_language(lang)][key], fields, lang)


def failure_sentence(kind: str, fields: dict[str, Any], lang: str,
                     diagnosis: Phrase | None = None) -> str:
    """The sentence of a failure of `kind` in `lang`, then its diagnosis; an unknown kind prints
    its fields as they are."""
    template = FAILURES[check_language(lang)].get(kind)
    try:
        sentence = _filled(template, fields, lang) if template else f"{kind}: {fields}"
    except (KeyError, IndexError):
        sentence = f"{kind}: {fields}"
    return sentence + (f" ({diagnosis.text(lang)})" if diagnosis is not None else "")

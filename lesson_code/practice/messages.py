"""The words of practice mode in both languages: report headings and the sentence of each failure.

A failure is a kind plus fields (`grading.Failure`); its sentence here is a format string per
language. In Persian, numbers get Persian digits (`persian_digits`); code-like fields (names,
dtypes, cases, tracebacks) stay as Python writes them.
"""

from __future__ import annotations

from typing import Any

LANGUAGES = ("en", "fa")
PERSIAN_DIGITS = str.maketrans("0123456789.", "۰۱۲۳۴۵۶۷۸۹٫")

HEADINGS = {
    "en": {
        "title": "Lesson {lesson}: checking {path}",
        "first_failure": "first failing case",
        "hint": "hint", "passed": "passed", "failed": "FAILED",
        "summary_pass": "All {total} checks passed.",
        "summary_fail": "{failed} of {total} checks failed.",
        "details": "Details of {title}:",
        "timing": "Time on {world_size} ranks ({what}; yours and the course's timed in "
                  "alternation, a median of {trials} runs or more): yours {yours}, the course's "
                  "{course} ({ratio}x).",
        "started": "Wrote {path}: fill in each function marked NotImplementedError, then run\n"
                   "  python -m lesson_code.practice check {lesson} {path}{lang_flag}",
        "running": "running {title} ...",
    },
    "fa": {
        "title": "درس {lesson}: بررسی {path}",
        "first_failure": "نخستین حالت ناموفق",
        "hint": "راهنمایی", "passed": "قبول", "failed": "رد",
        "summary_pass": "هر {total} بررسی قبول شد.",
        "summary_fail": "{failed} بررسی از {total} رد شد.",
        "details": "جزئیات «{title}»:",
        "timing": "زمان روی {world_size} رتبه ({what}؛ کد شما و کد درس یک‌درمیان زمان‌گیری "
                  "شده‌اند، میانهٔ دست‌کم {trials} اجرا): کد شما {yours}، کد درس {course} "
                  "({ratio} برابر).",
        "started": "{path} نوشته شد: هر تابعی را که NotImplementedError دارد کامل کنید و سپس اجرا کنید\n"
                   "  python -m lesson_code.practice check {lesson} {path}{lang_flag}",
        "running": "در حال اجرای «{title}» ...",
    },
}

FAILURES = {
    "en": {
        "missing": "your file has no {name}",
        "raised": "{case}: rank {rank} raised {error}",
        "timeout": "{case}: ranks {ranks} were still running after {seconds} s",
        "crashed": "{case}: a rank process died",
        "mismatch": "{case}: rank {rank} differs from {reference} at element {index}: "
                    "got {got}, expected {expected}",
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
        "missing": "فایل شما {name} را ندارد",
        "raised": "{case}: رتبهٔ {rank} خطای {error} داد",
        "timeout": "{case}: رتبه‌های {ranks} پس از {seconds} ثانیه هنوز در حال اجرا بودند",
        "crashed": "{case}: فرایند یکی از رتبه‌ها از کار افتاد",
        "mismatch": "{case}: نتیجهٔ رتبهٔ {rank} در عنصر {index} با {reference} فرق دارد: "
                    "{got} به‌جای {expected}",
        "shape": "{case}: رتبهٔ {rank} شکل {got} را برگرداند، نه {expected}",
        "not_in_place": "{case}: رتبهٔ {rank} تانسوری را که گرفته بود تغییر نداد",
        "bytes": "{case}: رتبهٔ {rank} {got} بایت فرستاد؛ {expected_what} {expected} بایت می‌فرستد",
        "order": "{case}: مرحلهٔ {stage} ترتیب {got} را اجرا کرد، نه {expected}",
        "value": "{case}: {what} برابر {got} است، نه {expected}",
        "not_raised": "{case}: به‌جای خطای {expected}، مقدار {got} را برگرداند",
        # درس ۸۰: چکپوینت شاردشده
        "no_manifest": "{case}: {file} وجود ندارد یا خواندنی نیست ({error})",
        "no_entry": "{case}: manifest.json هیچ فایلی با \"rank\": {rank} را فهرست نمی‌کند",
        "unlisted": "{case}: {file} در پوشهٔ چکپوینت هست ولی در فهرست فایل‌های manifest.json نیست",
        "checksum": "{case}: manifest.json برای {file} مقدار {field} را {got} ثبت کرده، ولی "
                    "مقدار خود فایل {expected} است",
        "accepted_flipped": "{case}: رتبهٔ {rank} فایل {file} را با یک بایت وارونه بارگذاری کرد، "
                            "به‌جای آنکه خطا بدهد",
        "accepted_truncated": "{case}: رتبهٔ {rank} فایل {file} را که به نیمه کوتاه شده بود "
                              "بارگذاری کرد، به‌جای آنکه خطا بدهد",
        "accepted_world_size": "{case}: رتبهٔ {rank} چکپوینتِ {saved} رتبه را در گروهی از "
                               "{world_size} رتبه بارگذاری کرد، به‌جای آنکه خطا بدهد",
        "lost_previous": "{case}: پس از ذخیره‌های کشته‌شده، رتبهٔ {rank} نمی‌تواند {folder} را "
                         "بارگذاری کند: {error}",
        "published_half": "{case}: {folder} وجود دارد، هرچند ذخیره‌اش پیش از پایان کشته شد",
        "no_crash": "{case}: ذخیره تمام شد، ولی قرار بود هر رتبه درون torch.save کشته شود: "
                    "تنسورهای هر فایل را با torch.save بنویسید",
        # درس ۸۱: ادامهٔ آموزش در پروژهٔ پایانی
        "resumed": "{case}: اجرای ادامه‌یافته از چکپوینت گام {step} در {what} با اجرای بی‌وقفه "
                   "فرق دارد",
        "no_checkpoint": "{case}: run_rank در result[\"checkpoints\"] هیچ چکپوینتی از گام {step} "
                         "برنگرداند",
    },
}


def check_language(lang: str) -> str:
    """`lang` if practice mode speaks it; ValueError naming the choices otherwise."""
    if lang not in LANGUAGES:
        raise ValueError(f"unknown language {lang!r}: use one of {', '.join(LANGUAGES)}")
    return lang


def persian_digits(text: str) -> str:
    """`text` with Western digits and the decimal point written the Persian way."""
    return text.translate(PERSIAN_DIGITS)


def localized(value: Any, lang: str) -> Any:
    """A number as the `lang` report prints it (Persian digits in Persian); other values unchanged.

    Only numbers are localized: names, dtypes, cases and tracebacks are code and stay as written.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return value
    if isinstance(value, float):
        text = f"{value:.0f}" if abs(value) >= 100 else f"{value:.3g}"  # 1234 ms, not 1.23e+03
    else:
        text = str(value)
    return persian_digits(text) if lang == "fa" else text


def _filled(template: str, fields: dict[str, Any], lang: str) -> str:
    """`template` formatted with `fields`, numbers localized."""
    return template.format(**{name: localized(value, lang) for name, value in fields.items()})


def heading(key: str, lang: str, **fields: Any) -> str:
    """The report heading `key` in `lang`, filled with `fields`."""
    return _filled(HEADINGS[check_language(lang)][key], fields, lang)


def failure_sentence(kind: str, fields: dict[str, Any], lang: str) -> str:
    """The sentence of a failure of `kind` in `lang`; an unknown kind prints its fields as is."""
    template = FAILURES[check_language(lang)].get(kind)
    try:
        return _filled(template, fields, lang) if template else f"{kind}: {fields}"
    except (KeyError, IndexError):
        return f"{kind}: {fields}"

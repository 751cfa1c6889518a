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
        "timing": "Time, median of {trials} runs on {world_size} ranks ({what}): yours {yours}, "
                  "the course's {course} ({ratio}x).",
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
        "timing": "زمان، میانهٔ {trials} اجرا روی {world_size} رتبه ({what}): کد شما {yours}، "
                  "کد درس {course} ({ratio} برابر).",
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
        "accepted": "{case}: the load accepted a {damage} checkpoint instead of raising",
        "lost": "{case}: after the crash, {what}",
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
        "accepted": "{case}: بارگذاری به‌جای خطا، نقطهٔ وارسی {damage} را پذیرفت",
        "lost": "{case}: پس از خرابی، {what}",
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
    text = f"{value:.3g}" if isinstance(value, float) else str(value)
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

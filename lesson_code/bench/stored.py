"""Benchmark tables stored with the package, with the machine and the date they were measured on.

A lesson cannot run a long measurement while its page is built, so it reads the table that
`python -m lesson_code.bench ddp` (or `zero`, `zero_stages`) measured,
`lesson_code/measured_<name>.csv` (package data), headed by comment lines that say when, where
and with which command it was measured.
Run on your machine, a benchmark writes its table into bench-results/ and leaves the package's
alone; `--into-package` replaces the package's (for whoever refreshes the book's figures).

    table, note = load("ddp")        # note["measured"], note["machine"], note["command"]
    print(note_text(note, "fa"))     # what, when and where, as the Persian edition says it

Every stored table's note is written in English (its comment lines); `note_text` says it in
Persian from the same facts, read back from the English line through the pair of sentences in
DESCRIPTIONS that the benchmark writes it with. A benchmark whose sentence changes changes its
pair here (tests/unit/test_bench_notes.py reads every stored table's note in both languages).
"""

from __future__ import annotations

import datetime
import os
import re
from pathlib import Path

import pandas as pd

from lesson_code import language
from lesson_code.harness.files import replacing
from lesson_code.harness.timing import machine_line

STORED = Path(__file__).resolve().parents[1]  # lesson_code/, whose measured_*.csv ship with it
NAMES = ("ddp", "zero", "zero_stages")


def path_of(name: str, folder: Path | None = None) -> Path:
    """The stored CSV of benchmark `name` in `folder` (by default the package's, STORED);
    raises ValueError for a benchmark that stores none."""
    if name not in NAMES:
        raise ValueError(f"no stored table for benchmark {name!r}: use one of {', '.join(NAMES)}")
    return Path(STORED if folder is None else folder) / f"measured_{name}.csv"


def machine() -> str:
    """This machine in one line (`timing.machine_line`), and its load average at the start."""
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return f"{machine_line()}, load average {load:.2f} at the start"


def store(table: pd.DataFrame, name: str, description: str, folder: Path,
          machine_at_start: str | None = None) -> Path:
    """Write `table` (index included) as the stored CSV of `name` in `folder`, headed by what,
    when and where it was measured; replaced whole (`files.replacing`), never left cut short.
    `machine_at_start` is `machine()` as the benchmark read it before it began (by default it
    is read now, when the table is stored)."""
    path = path_of(name, folder)
    note = {"description": description, "measured": datetime.date.today().isoformat(),
            "command": f"python -m lesson_code.bench {name}",
            "machine": machine_at_start or machine()}
    header = "".join(f"# {key}: {value}\n" for key, value in note.items())
    with replacing(path) as handle:
        handle.write(header + table.to_csv())
    return path


def load(name: str) -> tuple[pd.DataFrame, dict[str, str]]:
    """(the stored table of benchmark `name`, its note: description, measured, command, machine).

    Raises FileNotFoundError naming the command that makes the table when none is stored.
    """
    path = path_of(name)
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: run python -m lesson_code.bench {name}")
    lines = path.read_text().splitlines()
    note = dict(line[2:].split(": ", 1) for line in lines if line.startswith("# "))
    return pd.read_csv(path, comment="#", index_col=0), note


# What each stored table measured, as its benchmark writes it (English, fields in braces) and as
# the Persian edition says it. Fields are numbers or dates written in English; a field named in
# FIELD_WORDS is a term with a Persian word.
DESCRIPTIONS = {
    "ddp": (
        "lesson 77 benchmark: MiniGPT with {parameters} parameters, {ranks} ranks, batch {batch} "
        "per rank, Adam; {rounds} rounds in alternation, {steps} step(s) of each variant per round; "
        "of each step the phases of its slowest rank, medians over all steps; load average "
        "{load} at the end",
        "محک درس ۷۷: MiniGPT با {parameters} پارامتر روی {ranks} رتبه، دسته‌ای {batch}تایی برای "
        "هر رتبه، Adam؛ {rounds} دور به‌نوبت، در هر دور {steps} گام از هر گونه؛ از هر گام، زمان "
        "بخش‌های کندترین رتبه‌اش، و میانهٔ آن‌ها در همهٔ گام‌ها؛ میانگین بار {load} در پایان"),
    "zero": (
        "lesson 78 benchmark: MiniGPT with {parameters} parameters, {ranks} ranks, batch {batch} "
        "per rank, Adam; slowest rank's median per phase over {steps} steps (ddp = our bucketed "
        "DDP + unsharded fp32-master Adam)",
        "محک درس ۷۸: MiniGPT با {parameters} پارامتر روی {ranks} رتبه، دسته‌ای {batch}تایی برای "
        "هر رتبه، Adam؛ میانهٔ زمان هر بخش از گام در کندترین رتبه، در {steps} گام (سطر `BucketedDDP`: "
        "همان DDP باکت‌دار ما، با Adam شاردنشده و وزن‌های اصلی fp32)"),
    "zero_stages": (
        "lesson 78 stages: MiniGPT with {parameters} parameters ({blocks} blocks of width "
        "{width}), float32, global batch {batch} x {tokens} tokens, Adam; bytes per rank: peak "
        "allocated in one step (torch's allocator, as its profiler reports it; the highest rank) "
        "beside the formula; slowest rank's median step over {steps} steps. DDP: our NaiveDDP "
        "(memory) or bucketed DDP (time), with fp32-master Adam",
        "مرحله‌های ZeRO در درس ۷۸: MiniGPT با {parameters} پارامتر ({blocks} بلوک با پهنای "
        "{width})، float32، دستهٔ سراسری {batch} × {tokens} توکن، Adam؛ بایت در هر رتبه: بیشینهٔ "
        "حافظهٔ گرفته‌شده در یک گام (تخصیص‌دهندهٔ torch، چنان‌که نیم‌رخ‌نگار حافظهٔ آن گزارش می‌دهد؛ "
        "پرمصرف‌ترین رتبه) در کنار فرمول؛ میانهٔ زمان گام در کندترین رتبه، در {steps} گام. DDP: "
        "\u200fNaiveDDP ما (برای حافظه) یا DDP باکت‌دار ما (برای زمان)، همراه با Adam با وزن‌های اصلی "
        "fp32"),
    "collectives": (
        "{collective} times of {ranks} gloo ranks, median of {trials} trials (auto and gloo: the "
        "better of two such medians, timed in turn), measured {date} by python -m "
        "lesson_code.bench collectives",
        "زمان‌های {collective} روی {ranks} رتبهٔ gloo، میانهٔ {trials} آزمایش (برای `auto` و "
        "gloo بهترینِ دو میانه از این دست که به‌نوبت زمان‌گیری شدند)، اندازه‌گیری‌شده در {date} "
        "با `python -m lesson_code.bench collectives`"),
    "pipeline": (
        "pipeline bubble of 1F1B steps, median of {repeats} steps after {warmup} warm-up, "
        "{sequences} sequences per micro-batch, measured {date} by python -m lesson_code.bench "
        "pipeline",
        "حباب پایپلاین در گام‌های 1F1B، میانهٔ {repeats} گام پس از {warmup} گام گرم‌کردن، "
        "{sequences} دنباله در هر میکرودسته، اندازه‌گیری‌شده در {date} با "
        "`python -m lesson_code.bench pipeline`"),
    "capstone": (
        "the whole capstone command against its torch-only twin on {ranks} ranks, from process "
        "start to exit, median of {repeats} runs, measured {date} by python -m lesson_code.bench "
        "capstone",
        "کل فرمان پروژهٔ پایانی در برابر همتایش که فقط از torch بهره می‌گیرد، روی {ranks} رتبه، از "
        "آغاز فرایند تا پایان آن، میانهٔ {repeats} اجرا، اندازه‌گیری‌شده در {date} با "
        "`python -m lesson_code.bench capstone`"),
    "capstone_curve": (
        "loss per step of python -m lesson_code.capstone --lr-spike-step {spike} on {ranks} "
        "ranks, and its divergence guard's events, measured {date} by python -m "
        "lesson_code.bench capstone",
        "زیان هر گام در `python -m lesson_code.capstone --lr-spike-step {spike}` روی {ranks} "
        "رتبه، و رویدادهای محافظ واگرایی آن، اندازه‌گیری‌شده در {date} با "
        "`python -m lesson_code.bench capstone`"),
}
MACHINE = ("{arch}, {cores} cores, {system}, Python {python}, torch {torch}",
           "{arch}، {cores} هسته، {system}، \u2066Python {python}\u2069، \u2066torch {torch}\u2069")
LOAD = (", load average {load} at the start", "، میانگین بار {load} در آغاز")
MEASURED_ON = ("measured {date} on {machine}", "اندازه‌گیری‌شده در {date} روی {machine}")
MACHINE_LINE = ("machine: {machine}", "دستگاه: {machine}")
FIELD_WORDS = {"collective": {"all-reduce": "کاهش همگانی", "reduce-scatter": "کاهش و پخش",
                              "all-gather": "گردآوری همگانی"}}
RAW_FIELDS = ("python", "torch", "spike")  # inside a command or an isolate: kept as written


def description(name: str, **fields) -> str:
    """The English sentence of what benchmark `name` measured (DESCRIPTIONS), its fields filled."""
    return DESCRIPTIONS[name][0].format(**fields)


def comment_lines(path: Path | str) -> list[str]:
    """The comment lines that head a stored table (what, when, where), without their "# "."""
    with open(path, encoding="utf-8") as handle:
        return [line[2:].rstrip("\n") for line in handle if line.startswith("# ")]


def note_text(note: dict[str, str] | list[str], lang: str) -> str:
    """What a lesson prints above a stored table, in `lang`: `load`'s note (description, then
    "measured <date> on <machine>") or a table's comment lines, one per line. In Persian each
    sentence is its Persian twin (DESCRIPTIONS) with the same facts: numbers by the course's rule,
    commands and names isolated left to right (the twins' backticks become isolates,
    `language.isolated_code`); a line this module does not know stays English."""
    if isinstance(note, dict):
        lines = [note["description"], MEASURED_ON[0].format(date=note["measured"],
                                                            machine=note["machine"])]
    else:
        lines = list(note)
    if language.check_language(lang) == "en":
        return "\n".join(lines)
    return "\n".join(_persian_line(line) for line in lines)


def _persian_line(line: str) -> str:
    """One English line of a note, said in Persian (or as it is, when no sentence matches)."""
    pairs = [*DESCRIPTIONS.values(), MEASURED_ON, MACHINE_LINE]
    for english, persian in pairs:
        fields = _read(english, line)
        if fields is not None:
            return language.isolated_code(persian).format(
                **{key: _persian_field(key, value) for key, value in fields.items()})
    return line


def _read(template: str, line: str) -> dict[str, str] | None:
    """The fields of `line` written by `template` ("{ranks} ranks" -> {"ranks": "4"}), or None."""
    pattern = "".join(f"(?P<{piece[1:-1]}>.+?)" if piece.startswith("{") else re.escape(piece)
                      for piece in re.split(r"(\{\w+\})", template) if piece)
    found = re.fullmatch(pattern, line)
    return found.groupdict() if found else None


def _persian_field(key: str, value: str) -> str:
    """A field of a note in Persian: a machine line, a term, a date, a number, a name."""
    if key == "machine":
        return persian_machine(value)
    if key in FIELD_WORDS:
        return FIELD_WORDS[key].get(value, value)
    if key in RAW_FIELDS:
        return value
    if re.fullmatch(r"\d{4}-\d{2}-\d{2}", value):
        return language.isolated(language.persian_digits(value))  # a hyphen between digits
    if language.NUMBER_TEXT.fullmatch(value):
        return language.persian_number_text(value)
    return language.isolated(value)


def persian_machine(line: str) -> str:
    """`machine()`'s line in Persian: «x86_64، ۲ هسته، Linux، ...», its Latin names isolated left
    to right (a stored note's line, and the explorers' note of where their constants come from)."""
    english, persian = MACHINE
    for load_english, load_persian in [LOAD, ("", "")]:
        fields = _read(english + load_english, line)
        if fields is not None:
            return (persian + load_persian).format(
                **{key: _persian_field(key, value) for key, value in fields.items()})
    return language.isolated(line)

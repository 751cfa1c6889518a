"""Command line of practice mode: `start` writes a lesson's template, `check` grades a file.

    python -m lesson_code.practice start 76 [--lang fa] [--out my_collectives.py] [--force]
    python -m lesson_code.practice check 76 my_collectives.py [--lang fa] [--timeout 60]

`check` exits 0 only when every check passes, 1 when one fails, and 2 (one line on stderr, no
traceback) for a bad argument: an unknown lesson, a missing file, an unknown language.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lesson_code.harness.cli_args import positive_int
from lesson_code.practice.grading import DEFAULT_TIMEOUT_S, Check, CheckFailed, Lesson, run_checks
from lesson_code.practice.lessons import LESSONS, lesson
from lesson_code.practice.messages import LANGUAGES, heading, localized
from lesson_code.practice.report import format_report
from lesson_code.practice.templates import write_template


def _lesson_number(text: str) -> int:
    """`type=` for a lesson that has a practice: ArgumentTypeError naming the choices otherwise."""
    try:
        return lesson(positive_int(text)).number
    except (ValueError, argparse.ArgumentTypeError) as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _positive_seconds(text: str) -> float:
    """`type=` for --timeout: a positive number of seconds."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds: "
                                         f"pass one such as {DEFAULT_TIMEOUT_S:g}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The parser of both subcommands."""
    parser = argparse.ArgumentParser(
        prog="python -m lesson_code.practice",
        description="Write a lesson's piece yourself and have the course grade it on real ranks.")
    commands = parser.add_subparsers(dest="command", required=True)
    start = commands.add_parser("start", help="write the lesson's template to a file")
    check = commands.add_parser("check", help="grade your file on real gloo ranks")
    for command in (start, check):
        command.add_argument("lesson", type=_lesson_number,
                             help=f"lesson number: {', '.join(map(str, sorted(LESSONS)))}")
    check.add_argument("path", type=Path, help="your file (written by `start`, then filled in)")
    for command in (start, check):
        command.add_argument("--lang", choices=LANGUAGES, default="en",
                             help="language of the template and the report (default en)")
    start.add_argument("--out", type=Path, default=None,
                       help="file to write (default: the lesson's my_*.py in this folder)")
    start.add_argument("--force", action="store_true", help="replace the file if it exists")
    check.add_argument("--timeout", type=_positive_seconds, default=DEFAULT_TIMEOUT_S,
                       help=f"seconds one run of ranks may take (default {DEFAULT_TIMEOUT_S:g})")
    return parser


def start(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """Write the template; exit 2 through the parser when the file exists."""
    chosen = lesson(args.lesson)
    destination = args.out or Path(chosen.file_name)
    try:
        written = write_template(chosen.number, args.lang, destination, overwrite=args.force)
    except (FileExistsError, FileNotFoundError, OSError) as error:
        parser.error(str(error))
    flag = " --lang fa" if args.lang == "fa" else ""
    print(heading("started", args.lang, path=str(written), lesson=str(chosen.number), lang_flag=flag))
    return 0


def check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """Grade the learner's file and print the report; 0 when every check passed, else 1."""
    if not args.path.is_file():
        parser.error(f"no file at {str(args.path)!r}: write one with "
                     f"`python -m lesson_code.practice start {args.lesson}`")
    chosen = lesson(args.lesson)
    path = str(args.path.resolve())

    def starting(running: Check) -> None:
        print(heading("running", args.lang, title=running.title[args.lang]), file=sys.stderr,
              flush=True)

    results = run_checks(list(chosen.checks), path, args.timeout, starting)
    passed = all(result.passed for result in results)
    timing = _timing_line(chosen, path, args) if passed else None
    print(format_report(chosen.number, str(args.path), results, args.lang, timing))
    return 0 if passed else 1


def _timing_line(chosen: Lesson, path: str, args: argparse.Namespace) -> str | None:
    """The report's timing sentence, or None when the lesson times nothing or the run failed."""
    if chosen.timing is None:
        return None
    try:
        measured = chosen.timing(path, args.timeout)
    except CheckFailed:
        return None
    return heading("timing", args.lang, trials=measured.trials, world_size=measured.world_size,
                   what=measured.what, yours=_duration(measured.yours_s, args.lang),
                   course=_duration(measured.course_s, args.lang),
                   ratio=round(measured.yours_s / measured.course_s, 2))


def _duration(seconds: float, lang: str) -> str:
    """Seconds as milliseconds with their unit, in the report's digits."""
    unit = "ms" if lang == "en" else "میلی‌ثانیه"
    return f"{localized(round(seconds * 1e3, 2), lang)} {unit}"


def main(argv: list[str] | None = None) -> int:
    """Run `start` or `check`; the exit status of the command."""
    parser = build_parser()
    args = parser.parse_args(argv)
    return start(parser, args) if args.command == "start" else check(parser, args)

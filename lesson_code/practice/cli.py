"""Command line of practice mode: `start` writes a lesson's template, `check` grades a file.

    python -m lesson_code.practice start 76 [--lang fa] [--out my_collectives.py] [--force]
    python -m lesson_code.practice check 76 my_collectives.py [--lang fa] [--timeout 60] [--only 3]
    python -m lesson_code.practice start 78a      # lesson 78's optional page on ZeRO-3

`check` exits 0 only when every check passes, 1 when one fails or is not run, and 2 (the
subcommand's usage and one error line on stderr, no traceback) for a bad argument: an unknown
lesson, a missing file, an unknown language, a timeout outside 1 to 3600 s, a check number the
lesson does not have.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from lesson_code.practice.grading import DEFAULT_TIMEOUT_S, Check, CheckFailed, Lesson, run_checks
from lesson_code.practice.lessons import LESSONS, lesson
from lesson_code.practice.messages import LANGUAGES, heading, plain
from lesson_code.practice.report import format_report
from lesson_code.practice.templates import write_template
from lesson_code.practice.timing import timing_line

# A run of ranks needs about a second to start and import the learner's file; an hour is more
# than any check takes (so more is a typo, and `inf` would overflow the launcher's clock).
TIMEOUT_RANGE_S = (1.0, 3600.0)
CHOICES = ", ".join(sorted(LESSONS))


def _lesson_number(text: str) -> int | str:
    """`type=` for a lesson that has a practice: ArgumentTypeError naming the choices otherwise."""
    try:
        return lesson(text).number
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a lesson with a practice: choose one "
                                         f"of {CHOICES}") from None


def _timeout_seconds(text: str) -> float:
    """`type=` for --timeout: a finite number of seconds inside TIMEOUT_RANGE_S."""
    low, high = TIMEOUT_RANGE_S
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not low <= value <= high:  # also refuses nan and inf
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds from {low:g} to "
                                         f"{high:g}: pass one such as {DEFAULT_TIMEOUT_S:g}")
    return value


def _check_number(text: str) -> int:
    """`type=` for --only: a whole number of 1 or more (the lesson's count is checked after)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a check number: pass one such as 2")
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
        command.add_argument("lesson", type=_lesson_number, help=f"lesson number: {CHOICES}")
    check.add_argument("path", type=Path, help="your file (written by `start`, then filled in)")
    for command in (start, check):
        command.add_argument("--lang", choices=LANGUAGES, default="en",
                             help="language of the template and the report (default en)")
    start.add_argument("--out", type=Path, default=None,
                       help="file to write (default: the lesson's my_*.py in this folder)")
    start.add_argument("--force", action="store_true", help="replace the file if it exists")
    check.add_argument("--timeout", type=_timeout_seconds, default=DEFAULT_TIMEOUT_S,
                       metavar="S", help="seconds one run of ranks may take, from "
                       f"{TIMEOUT_RANGE_S[0]:g} to {TIMEOUT_RANGE_S[1]:g} (default "
                       f"{DEFAULT_TIMEOUT_S:g})")
    check.add_argument("--only", type=_check_number, default=None, metavar="K",
                       help="run check K alone (its number in the report), e.g. after a fix")
    parser.set_defaults(subparsers={"start": start, "check": check})
    return parser


def start(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """Write the template; exit 2 through the parser when the file exists."""
    chosen = lesson(args.lesson)
    destination = args.out or Path(chosen.file_name)
    try:
        written = write_template(chosen.number, args.lang, destination, overwrite=args.force)
    except OSError as error:  # FileExistsError among them
        parser.error(str(error))
    flag = " --lang fa" if args.lang == "fa" else ""
    print(heading("started", args.lang, path=str(written), lesson=str(chosen.number), lang_flag=flag))
    return 0


def check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """Grade the learner's file and print the report; 0 when every check passed, else 1."""
    chosen = lesson(args.lesson)
    if not args.path.is_file():
        parser.error(f"no file at {str(args.path)!r}: write one with "
                     f"`python -m lesson_code.practice start {args.lesson}`")
    if args.only is not None and args.only > len(chosen.checks):
        parser.error(f"lesson {chosen.number} has checks 1 to {len(chosen.checks)}, not "
                     f"{args.only}")
    path = str(args.path.resolve())
    checks, first = list(chosen.checks), 1
    if args.only is not None:
        checks, first = [chosen.checks[args.only - 1]], args.only

    def starting(running: Check) -> None:
        print(heading("running", args.lang, title=plain(running.title[args.lang], args.lang)),
              file=sys.stderr, flush=True)

    results = run_checks(checks, path, args.timeout, starting, first_number=first)
    passed = all(result.passed for result in results)
    timing = _timing_line(chosen, path, args) if passed and args.only is None else None
    print(format_report(chosen.number, str(args.path), results, args.lang, timing,
                        only=args.only is not None))
    return 0 if passed else 1


def _timing_line(chosen: Lesson, path: str, args: argparse.Namespace) -> str | None:
    """The report's timing sentence, or None when the lesson times nothing or the run failed."""
    if chosen.timing is None:
        return None
    try:
        return timing_line(chosen.timing(path, args.timeout), args.lang)
    except CheckFailed:
        return None


def main(argv: list[str] | None = None) -> int:
    """Run `start` or `check`; the exit status of the command."""
    args = build_parser().parse_args(argv)
    command = args.subparsers[args.command]  # its errors show its own usage, not the top one's
    return start(command, args) if args.command == "start" else check(command, args)

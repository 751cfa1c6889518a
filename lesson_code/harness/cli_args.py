"""Argument checks shared by every command line of the course (`python -m lesson_code.<lesson>`).

A bad argument should end a command the way argparse ends it: one error line on stderr that names
the value and says what to pass instead, exit status 2, no traceback, and before any rank starts.
The `type=` functions check one value; `check_at_most`, `check_in_range` and `check_divides`
check one value against another (`--checkpoint-step` against `--steps`) through `parser.error`.

    parser.add_argument("--steps", type=cli_args.positive_int, default=20)
    cli_args.check_in_range(parser, "--checkpoint-step", args.checkpoint_step, 1, args.steps,
                            "the checkpoint is written after one of the run's steps")
"""

from __future__ import annotations

import argparse
import os

from lesson_code import launch
from lesson_code.language import LANGUAGES

SEED_MAX = 2**32 - 1  # torch takes 64-bit seeds; runs add rank and replica offsets to this one


def _integer(text: str) -> int:
    """`text` as an int; argparse's message for anything else (`int` alone says "invalid int")."""
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number: pass one such as 4") from None


def positive_int(text: str) -> int:
    """`type=` for counts that must be at least 1 (ranks, steps, micro-batches, elements)."""
    value = _integer(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not positive: pass a whole number of 1 or more")
    return value


def non_negative_int(text: str) -> int:
    """`type=` for values that may be 0 but not negative (offsets, counts that may be empty)."""
    value = _integer(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative: pass a whole number of 0 or more")
    return value


def seed_int(text: str) -> int:
    """`type=` for random seeds: 0 to SEED_MAX, so that seed + rank offsets still fit torch's seed."""
    value = _integer(text)
    if not 0 <= value <= SEED_MAX:
        raise argparse.ArgumentTypeError(f"{value} is not a seed: pass a whole number from 0 to {SEED_MAX}")
    return value


def world_size_in_use(requested: int) -> tuple[int, str]:
    """The number of ranks a run will have, and how to name it in an error message.

    Under torchrun, torchrun's WORLD_SIZE decides and `--world-size` is ignored (see
    `launch.run`), so a limit on the world size must be checked against WORLD_SIZE.
    """
    if launch.under_torchrun():
        return int(os.environ["WORLD_SIZE"]), "torchrun's WORLD_SIZE"
    return requested, "--world-size"


def check_world_size(parser: argparse.ArgumentParser, requested: int, limit: int,
                     reason: str) -> None:
    """`parser.error` (exit status 2) unless the run's world size is at most `limit`.

    The run's world size is `requested` (`--world-size`), or torchrun's WORLD_SIZE under torchrun.
    """
    size, name = world_size_in_use(requested)
    check_at_most(parser, name, size, limit, reason)


def check_at_most(parser: argparse.ArgumentParser, name: str, value: int, limit: int,
                  reason: str) -> None:
    """`parser.error` (exit status 2) unless `value` <= `limit`; `reason` says why the limit."""
    if value > limit:
        parser.error(f"{name} {value} is too large: {reason}, so pass at most {limit}")


def check_in_range(parser: argparse.ArgumentParser, name: str, value: int, low: int, high: int,
                   reason: str) -> None:
    """`parser.error` (exit status 2) unless `low` <= `value` <= `high`; `reason` says why."""
    if not low <= value <= high:
        parser.error(f"{name} {value} is outside {low}..{high}: {reason}, so pass a value "
                     f"from {low} to {high}")


def check_divides(parser: argparse.ArgumentParser, name: str, value: int, total: int,
                  what: str) -> None:
    """`parser.error` (exit status 2) unless `value` divides `total` (`what` names the total)."""
    if total % value:
        divisors = ", ".join(str(d) for d in range(1, total + 1) if total % d == 0)
        parser.error(f"{name} {value} does not divide {what} ({total}): pass one of {divisors}")


def add_language(parser: argparse.ArgumentParser) -> None:
    """--lang en|fa: the language the command prints its report in (English by default)."""
    parser.add_argument("--lang", choices=LANGUAGES, default="en",
                        help="language of the report: en (default) or fa")


def lab_arguments(argv: list[str] | None, module: str, description: str, steps: int,
                  batch_size: int, choices: dict[str, tuple[str, ...]] | None = None
                  ) -> argparse.Namespace:
    """The command line of `python -m lesson_code.<module>`: --world-size (4), --steps, --lang
    (`add_language`), and for each `choices` entry ("optimizer": ("zero", ...)) an option
    --optimizer taking one of them (the first by default); exits with status 2 for a world size
    above `batch_size` (each rank needs samples of the batch)."""
    parser = argparse.ArgumentParser(prog=f"python -m lesson_code.{module}", description=description)
    parser.add_argument("--world-size", type=positive_int, default=4)
    parser.add_argument("--steps", type=positive_int, default=steps)
    add_language(parser)
    for name, values in (choices or {}).items():
        parser.add_argument(f"--{name}", choices=values, default=values[0])
    args = parser.parse_args(argv)
    check_world_size(parser, args.world_size, batch_size,
                              f"each rank needs samples of the global batch of {batch_size}")
    return args

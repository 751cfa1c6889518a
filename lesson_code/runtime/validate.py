"""Checks of arguments that many modules take (world sizes, counts, rates), written once.

Every function raises ValueError with a message that names the argument, the value it got and
what to pass instead. Pure Python. They live on the package's ground floor because the launcher
checks its own arguments with them (`launch.spawn`, `runtime.devices`); the lessons' modules
import them through `lesson_code.harness.validate`.

    require_positive_int("world_size", world_size, "the number of ranks, such as 4")
"""

from __future__ import annotations


def require_positive_int(name: str, value, fix: str = "a whole number of 1 or more") -> int:
    """Return `value` if it is an int of 1 or more (not a bool); else raise ValueError."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}: pass {fix}")
    return value


def require_positive(name: str, value, fix: str = "a number above 0") -> float:
    """Return `value` if it is a real number above 0 (not a bool); else raise ValueError."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name} must be positive, got {value!r}: pass {fix}")
    return value


def require_choice(name: str, value, choices) -> object:
    """Return `value` if it is one of `choices`; else raise ValueError listing them."""
    if value not in choices:
        raise ValueError(f"unknown {name} {value!r}: use one of {', '.join(map(repr, choices))}")
    return value

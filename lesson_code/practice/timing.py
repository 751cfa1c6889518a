"""The learner's code timed against the course's, and how much the figures move between rounds.

One figure per side says little on a shared machine: the course's own ring timed against itself
read 0.74x in the notebook's sample report, and 0.52x to 1.06x for the learner who reported it.
So both sides are timed in many short rounds, in alternation (the side that goes first changes
every round, so neither always gets the warm caches, and a burst of load from another process
falls on both alike), and the report gives each side's median with its range, and the range of
the per-round ratio: that spread is how noisy the measurement was, on this machine, this time.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Callable

from lesson_code.harness.timing import collective_seconds, median_seconds, slowest_rank
from lesson_code.practice.messages import Phrase, heading, localized

ROUNDS = 9  # pairs of short trials (about 0.05 s each): an odd count has a middle one


@dataclass(frozen=True)
class Timing:
    """Seconds per round of the learner's code and of the course's on the same task."""

    what: Phrase
    world_size: int
    yours_s: tuple[float, ...]
    course_s: tuple[float, ...]

    def ratios(self) -> list[float]:
        """The learner's seconds over the course's, round by round."""
        return [yours / course for yours, course in zip(self.yours_s, self.course_s)]


def paired_rounds(yours: Callable[[], object], course: Callable[[], object], *,
                  rounds: int = ROUNDS) -> tuple[list[float], list[float]]:
    """(the learner's, the course's) slowest-rank seconds of one call, per round.

    Collective: call on every rank. Each side is first warmed up and given the number of calls
    that makes a trial last about 0.05 s (`collective_seconds`); then each round times one trial
    of each, the learner's first in even rounds and the course's first in odd ones.
    """
    calls = (yours, course)
    repeats = [collective_seconds(call, trials=1)[1] for call in calls]
    samples: tuple[list[float], list[float]] = ([], [])
    for round_index in range(rounds):
        for side in ((0, 1) if round_index % 2 == 0 else (1, 0)):
            seconds = median_seconds(calls[side], trials=1, repeats=repeats[side])
            samples[side].append(slowest_rank(seconds))
    return samples


def timing_line(timing: Timing, lang: str) -> str:
    """The report's sentence: each side's median and range, and the per-round ratio's range."""
    ratios = timing.ratios()

    def milliseconds(seconds: float) -> str:
        return heading("milliseconds", lang, value=round(seconds * 1e3, 2))

    return heading(
        "timing", lang, world_size=timing.world_size, what=timing.what, rounds=len(ratios),
        yours=milliseconds(statistics.median(timing.yours_s)),
        yours_low=localized(round(min(timing.yours_s) * 1e3, 2), lang),
        yours_high=localized(round(max(timing.yours_s) * 1e3, 2), lang),
        course=milliseconds(statistics.median(timing.course_s)),
        course_low=localized(round(min(timing.course_s) * 1e3, 2), lang),
        course_high=localized(round(max(timing.course_s) * 1e3, 2), lang),
        low=round(min(ratios), 2), high=round(max(ratios), 2),
        ratio=round(statistics.median(ratios), 2), one=1)

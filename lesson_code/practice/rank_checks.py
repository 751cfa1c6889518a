"""What the graders do inside a rank: count the learner's bytes, compare tensors, name the case.

Each rank of a grading run imports the learner's file (`grading.load_learner`), calls it, and
compares what it returns with PyTorch's reference computed in the same rank on the same inputs.
A comparison returns a `Failure` rather than raising, so one rank's wrong answer does not leave
its peers waiting in the next collective; it names the element that differs, and what a
difference of a common shape most likely means (`messages.DIAGNOSES`). A learner's exception
raised inside `during(case)` carries that case to the report.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from typing import Callable, Iterator

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from lesson_code.practice.grading import (CASE_NOTE, Check, CheckFailed, Failure,
                                          load_learner, run_ranks)
from lesson_code.practice.messages import (DIAGNOSES, LANGUAGES, Number, Phrase,
                                           distinct_numbers, lesson_name, listing, localized,
                                           phrase)

SENDING_FUNCTIONS = ("send", "isend")
FLATTENED = phrase("the result, flattened", "نتیجهٔ تخت‌شده")


@contextmanager
def during(case: str | Phrase) -> Iterator[None]:
    """Tag an exception raised in the block with `case`, which the report then names (the
    rank's group and inputs) instead of the whole run's."""
    try:
        yield
    except Exception as error:
        texts = {lang: localized(case, lang) for lang in LANGUAGES}
        error.add_note(CASE_NOTE + json.dumps(texts, ensure_ascii=False))
        raise


@contextmanager
def counted_sends() -> Iterator[dict[str, int]]:
    """Count the bytes this rank sends point-to-point while the block runs: {"bytes", "messages"}.

    Wraps `torch.distributed.send` and `isend` (also where `P2POp` and `batch_isend_irecv` look
    them up), so the learner's messages are counted whichever way they are posted, and restores
    them after. The real functions still send: this measures, it does not replace.
    """
    counts = {"bytes": 0, "messages": 0}
    originals = {name: getattr(c10d, name) for name in SENDING_FUNCTIONS}

    def counting(original):
        def send(tensor, *args, **kwargs):
            counts["bytes"] += tensor.numel() * tensor.element_size()
            counts["messages"] += 1
            return original(tensor, *args, **kwargs)
        return send

    wrappers = {name: counting(original) for name, original in originals.items()}
    try:
        for name, wrapper in wrappers.items():
            setattr(c10d, name, wrapper)
            setattr(dist, name, wrapper)
        yield counts
    finally:
        for name, original in originals.items():
            setattr(c10d, name, original)
            setattr(dist, name, original)


def tensor_kind(tensor: torch.Tensor) -> Phrase:
    """"shape [3, 4] of torch.float32", in the reader's digits."""
    return phrase("shape {shape} of {dtype}", "شکل {shape} از نوع `{dtype}`",
                  shape=list(tensor.shape), dtype=str(tensor.dtype))


def compare(got, expected: torch.Tensor, bound: torch.Tensor | None, *, case: str | Phrase,
            case_index: int, rank: int, reference: str | Phrase,
            element_of: Phrase | Callable[[int], Phrase] = FLATTENED,
            own: torch.Tensor | None = None, group_size: int = 1) -> Failure | None:
    """None when `got` has `expected`'s shape and dtype and is within `bound` of it elementwise.

    `bound` None means exactly equal (integers, and data that is only moved). Otherwise the first
    element outside the bound (a NaN is outside every bound), with both values and the bound it
    broke (`tolerance`), makes the Failure; `element_of` says what the element indexes (or,
    called with the index, where it lies). Two diagnoses: `got` exactly `group_size` times
    `expected` (a sum not divided), or equal to `own`, this rank's own input (nothing received).
    """
    where = {"case": case, "case_index": case_index, "rank": rank}
    if not isinstance(got, torch.Tensor):
        return Failure("value", {**where, "what": phrase("the returned value", "مقدار برگشتی"),
                                 "got": type(got).__name__,
                                 "expected": phrase("a torch.Tensor", "یک `torch.Tensor`")})
    if got.shape != expected.shape or got.dtype != expected.dtype:
        return Failure("shape", {**where, "got": tensor_kind(got), "expected": tensor_kind(expected)})
    difference = (got.double() - expected.double()).abs().reshape(-1)
    allowed = torch.zeros_like(difference) if bound is None else bound.double().reshape(-1)
    outside = (~(difference <= allowed)).nonzero()  # written so that NaN counts as outside
    if outside.numel() == 0:
        return None
    index = int(outside[0])
    values = got.reshape(-1)[index].item(), expected.reshape(-1)[index].item()
    if isinstance(values[0], float):
        values = distinct_numbers(*values)
    return Failure("mismatch", {**where, "reference": reference, "index": index,
                                "element_of": element_of(index) if callable(element_of) else element_of,
                                "got": values[0], "expected": values[1],
                                "tolerance": tolerance(difference[index].item(),
                                                       None if bound is None else
                                                       allowed[index].item())},
                   diagnosis=_diagnosis(got, expected, allowed, own, group_size))


def tolerance(difference: float, allowed: float | None) -> Phrase:
    """What a mismatch broke: exact equality (`allowed` None), or "they differ by 0.000123,
    more than the 1e-05 allowed" (3 significant digits: which bound, not its last bit)."""
    if allowed is None:
        return phrase("they must be exactly equal", "این دو باید دقیقاً برابر باشند")
    return phrase("they differ by {difference}, more than the {allowed} allowed",
                  "اختلافشان {difference} است، بیش از {allowed} که مجاز است",
                  difference=Number(difference, 3), allowed=Number(allowed, 3))


def _diagnosis(got: torch.Tensor, expected: torch.Tensor, allowed: torch.Tensor,
               own: torch.Tensor | None, group_size: int) -> Phrase | None:
    """What a wrong result of a common shape means (see `compare`), or None."""
    if own is not None and torch.equal(got, own) and not torch.equal(own, expected):
        return DIAGNOSES["own_input"]
    if group_size > 1 and expected.count_nonzero() > 0:
        scaled = expected.double().reshape(-1) * group_size
        slack = group_size * allowed + 4 * _eps(got) * scaled.abs()
        if bool(((got.double().reshape(-1) - scaled).abs() <= slack).all()):
            return DIAGNOSES["times_n"].with_fields(n=group_size)
    return None


def _eps(tensor: torch.Tensor) -> float:
    return torch.finfo(tensor.dtype).eps if tensor.is_floating_point() else 0.0


def defined_names(rank: int, world_size: int, path: str, candidates: tuple[str, ...]) -> list[str]:
    """Rank function: which of `candidates` the learner's file defines (as functions or classes)."""
    module = load_learner(path)
    return [name for name in candidates if callable(getattr(module, name, None))]


def names_check(lesson: int | str, names: tuple[str, ...],
                other_lessons: dict[int | str, tuple[str, ...]]) -> Check:
    """The first check of every lesson, its gate: the learner's file imports and defines the
    template's names. A file that defines another lesson's names instead is said to be that
    lesson's (`python -m lesson_code.practice check 78` on lesson 76's file)."""
    candidates = tuple(dict.fromkeys(names + sum(other_lessons.values(), ())))

    def run(path: str, timeout_s: float) -> None:
        defined = run_ranks(defined_names, path, candidates, world_size=1, timeout_s=timeout_s,
                            case=phrase("importing your file", "بارگذاری فایل شما"))[0]
        missing = [name for name in names if name not in defined]
        if not missing:
            return
        for other, its_names in sorted(other_lessons.items(), key=lambda item: str(item[0])):
            if set(its_names) <= set(defined):
                raise CheckFailed(Failure(
                    "other_lesson", {"names": listing(list(its_names)),
                                     "lesson": lesson_name(other),
                                     "name": missing[0]},
                    hint=phrase("grade it as lesson {other}'s file (`python -m lesson_code."
                                "practice check {command} ...`), or write this lesson's template "
                                "with `python -m lesson_code.practice start {this}`",
                                "آن را به‌عنوان فایل درس {other} بسنجید (`python -m lesson_code."
                                "practice check {command} ...`)، یا قالب همین درس را با "
                                "`python -m lesson_code.practice start {this} --lang fa` بنویسید",
                                other=lesson_name(other), command=str(other),
                                this=str(lesson))))
        raise CheckFailed(Failure("missing", {"name": missing[0]}))

    listed = listing(list(names))
    listed_code = listing([f"`{name}`" for name in names])  # Persian: each name isolated
    return Check("names",
                 {"en": f"the file imports and defines {listed.text('en')}",
                  "fa": f"فایل بدون خطا import می‌شود و {listed_code.text('fa')} را تعریف می‌کند"},
                 {"en": f"start from the template (`python -m lesson_code.practice start {lesson}`) "
                        "and keep its names",
                  "fa": "از قالب شروع کنید (`python -m lesson_code.practice start "
                        f"{lesson} --lang fa`) و نام‌هایش را نگه دارید"},
                 run, gate=True)

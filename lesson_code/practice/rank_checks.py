"""What the graders do inside a rank: count the learner's bytes, compare tensors, find their names.

Each rank of a grading run imports the learner's file (`grading.load_learner`), calls it, and
compares what it returns with PyTorch's reference computed in the same rank on the same inputs.
A comparison returns a `Failure` rather than raising, so one rank's wrong answer does not leave
its peers waiting in the next collective.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from lesson_code.practice.grading import Check, Failure, fail_on_first, load_learner, run_ranks

SENDING_FUNCTIONS = ("send", "isend")


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


def compare(got, expected: torch.Tensor, bound: torch.Tensor | None, *, case: str,
            case_index: int, rank: int, reference: str) -> Failure | None:
    """None when `got` has `expected`'s shape and dtype and is within `bound` of it elementwise.

    `bound` None means exactly equal (integers, and data that is only moved). Otherwise the first
    element outside the bound, with both values, makes the Failure.
    """
    where = {"case": case, "case_index": case_index, "rank": rank}
    if not isinstance(got, torch.Tensor):
        return Failure("value", {**where, "what": "the returned value", "got": type(got).__name__,
                                 "expected": "a torch.Tensor"})
    if got.shape != expected.shape or got.dtype != expected.dtype:
        return Failure("shape", {**where, "got": f"{tuple(got.shape)} {got.dtype}",
                                 "expected": f"{tuple(expected.shape)} {expected.dtype}"})
    difference = (got.double() - expected.double()).abs().reshape(-1)
    allowed = torch.zeros_like(difference) if bound is None else bound.double().reshape(-1)
    outside = (difference > allowed).nonzero()
    if outside.numel() == 0:
        return None
    index = int(outside[0])
    return Failure("mismatch", {**where, "reference": reference, "index": index,
                                "got": got.reshape(-1)[index].item(),
                                "expected": expected.reshape(-1)[index].item()})


def missing_names(rank: int, world_size: int, path: str, names: tuple[str, ...]) -> list[Failure]:
    """Rank function: a Failure for each of `names` the learner's file does not define."""
    module = load_learner(path)
    return [Failure("missing", {"name": name, "case_index": index})
            for index, name in enumerate(names) if not callable(getattr(module, name, None))]


def names_check(names: tuple[str, ...]) -> Check:
    """The first check of every lesson: the learner's file imports and defines the template's names."""
    listed = ", ".join(names)

    def run(path: str, timeout_s: float) -> None:
        fail_on_first(run_ranks(missing_names, path, names, world_size=1, timeout_s=timeout_s,
                                case="import"))

    return Check("names", {"en": f"the file imports and defines {listed}",
                           "fa": f"فایل بدون خطا بارگذاری می‌شود و {listed} را تعریف می‌کند"},
                 {"en": "start from the template (practice start) and keep its names",
                  "fa": "از قالب (practice start) شروع کنید و نام‌هایش را نگه دارید"}, run)

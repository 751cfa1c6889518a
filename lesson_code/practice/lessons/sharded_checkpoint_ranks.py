"""What lesson 80's grader does inside a rank: save and load through the learner's file, and die.

Every rank builds the same deterministic tensors (`shard_tensors`, `replicated_tensors`), saves
them with the learner's `save_sharded` and loads them back with the learner's `load_sharded`, so
the reference is the input itself and equality is exact. `die_inside_torch_save` is the fault:
the rank's next `torch.save` writes half of its bytes where it was asked to and the process kills
itself with SIGKILL, the way a power cut or an OOM kill stops a save between writing and
publishing. The learner's code is not changed to cause it, only torch.save in that one process.
"""

from __future__ import annotations

import io
import os
import signal
from pathlib import Path

import torch

from lesson_code.checkpoint import step_folder
from lesson_code.collectives_lab import make_input
from lesson_code.experiment import DTYPES
from lesson_code.practice.grading import Failure, load_learner
from lesson_code.practice.messages import Phrase, every_rank, phrase
from lesson_code.practice.rank_checks import compare, during

EXTRA = {"next_step": 7, "data": {"epoch": 1, "cursor": 4242}, "note": "resume here"}


def shard_tensors(rank: int, salt: int = 0) -> dict[str, torch.Tensor]:
    """Rank `rank`'s shard: every dtype of the course, a bool mask, a matrix, an empty tensor and
    a 0-dim scalar, with lengths that differ by rank (`salt` changes every value)."""
    tensors = {name: make_input(rank, 1001 + rank, name, seed=salt) for name in DTYPES}
    tensors["mask"] = make_input(rank, 17, "float32", seed=salt) > 0
    tensors["matrix"] = make_input(rank, 12, "float64", seed=salt).view(3, 4).to(torch.float16)
    tensors["empty"] = torch.empty(0, dtype=torch.float32)
    tensors["scalar"] = torch.tensor(rank * 1000 + salt)
    return tensors


def replicated_tensors(salt: int = 0) -> dict[str, torch.Tensor]:
    """What rank 0 saves once for every rank (model weights, in a real run)."""
    return {"embedding": make_input(100, 64, "float32", seed=salt).view(8, 8),
            "steps": torch.tensor([salt], dtype=torch.int64)}


def layout(rank: int) -> dict:
    """The JSON layout every rank passes with its shard (the manifest must keep it)."""
    return {"rank": rank, "start": 1000 * rank, "length": 1001 + rank}


def save(learner, root: str, step: int, rank: int, world_size: int, salt: int = 0):
    """The learner's save of this rank's shard as checkpoint `step`; what it returns."""
    return learner.save_sharded(root, shard_tensors(rank, salt), step=step, rank=rank,
                                world_size=world_size, layout=layout(rank),
                                replicated=replicated_tensors(salt) if rank == 0 else None,
                                extra={**EXTRA, "salt": salt})


def compare_loaded(loaded, rank: int, world_size: int, step: int, salt: int, *, case: Phrase,
                   first_index: int = 0) -> list[Failure]:
    """Failures of a load's (shard, replicated, manifest) against what was saved: exact."""
    where = {"case": case, "rank": rank}
    if not (isinstance(loaded, tuple) and len(loaded) == 3):
        return [Failure("value", {**where, "case_index": first_index, "what": "load_sharded(...)",
                                  "got": type(loaded).__name__,
                                  "expected": phrase("a tuple (shard, replicated, manifest)",
                                                     "تاپل `(shard, replicated, manifest)`")})]
    failures = []
    for offset, (got, expected) in enumerate(((loaded[0], shard_tensors(rank, salt)),
                                              (loaded[1], replicated_tensors(salt)))):
        index = first_index + offset
        what = f"load_sharded(...)[{offset}]"
        if not isinstance(got, dict) or sorted(got) != sorted(expected):
            failures.append(Failure("value", {**where, "case_index": index,
                                              "what": phrase("the keys of {what}", "کلیدهای {what}",
                                                             what=what),
                                              "got": sorted(got) if isinstance(got, dict) else got,
                                              "expected": sorted(expected)}))
            continue
        for name, tensor in expected.items():
            found = compare(got[name], tensor, None, case=case, case_index=index, rank=rank,
                            reference=phrase("the saved tensor", "تنسور ذخیره‌شده"),
                            element_of=phrase("{what}[{name}], flattened", "{what}[`{name}`]، تخت‌شده",
                                              what=what, name=repr(name)))
            if found:
                failures.append(found)
                break
    manifest = loaded[2] if isinstance(loaded[2], dict) else {}
    for offset, (key, expected) in enumerate((("world_size", world_size), ("step", step),
                                              ("extra", {**EXTRA, "salt": salt})), start=2):
        if manifest.get(key) != expected:
            failures.append(Failure("value", {**where, "case_index": first_index + offset,
                                              "what": f"manifest[{key!r}]",
                                              "got": manifest.get(key), "expected": expected}))
    return failures


def grade_round_trip(rank: int, world_size: int, path: str, root: str, step: int) -> list[Failure]:
    """Rank function: save, then load, every rank; the folder's name and every tensor exact."""
    learner = load_learner(path)
    case = phrase("{ranks}, step {step}", "{ranks}، گام {step}", ranks=every_rank(world_size),
                  step=step)
    with during(case):
        folder = save(learner, root, step, rank, world_size)
    expected = step_folder(root, step)
    if not isinstance(folder, (str, os.PathLike)) or Path(folder) != expected:
        return [Failure("value", {"case": case, "case_index": 0, "rank": rank,
                                  "what": "save_sharded(...)", "got": str(folder),
                                  "expected": str(expected)})]
    with during(case):
        loaded = learner.load_sharded(folder, rank=rank, world_size=world_size)
    return compare_loaded(loaded, rank, world_size, step, 0, case=case, first_index=1)


def save_only(rank: int, world_size: int, path: str, root: str, steps: list[int]) -> list[str]:
    """Rank function: save checkpoints `steps` (salt = the step) with the learner's code."""
    learner = load_learner(path)
    return [str(save(learner, root, step, rank, world_size, salt=step)) for step in steps]


def attempt_loads(rank: int, world_size: int, path: str, folders: list[str]) -> list[str | None]:
    """Rank function: the learner's load of each folder; per folder, the error it raised or None."""
    learner = load_learner(path)
    outcomes = []
    for folder in folders:
        try:
            learner.load_sharded(folder, rank=rank, world_size=world_size)
            outcomes.append(None)
        except Exception as error:  # noqa: BLE001 - any exception is a refusal, which is right
            outcomes.append(f"{type(error).__name__}: {error}")
    return outcomes


def load_after_crash(rank: int, world_size: int, path: str, root: str,
                     steps: list[int]) -> list[Failure]:
    """Rank function: the checkpoints of `steps` load, exact, after a crashed save."""
    learner = load_learner(path)
    failures = []
    for index, step in enumerate(steps):
        folder = step_folder(root, step)
        case = phrase("{folder}, loaded on all {n} ranks", "`{folder}`، بارگذاری‌شده روی همهٔ {n} رتبه",
                      folder=folder.name, n=world_size)
        try:
            loaded = learner.load_sharded(folder, rank=rank, world_size=world_size)
        except Exception as error:  # noqa: BLE001 - the learner's load refused its own checkpoint
            failures.append(Failure("lost_previous", {"case": case, "case_index": 10 * index,
                                                      "rank": rank, "folder": folder.name,
                                                      "error": f"{type(error).__name__}: {error}"}))
            continue
        failures += compare_loaded(loaded, rank, world_size, step, step, case=case,
                                   first_index=10 * index)
    return failures


def die_inside_torch_save() -> None:
    """From now on, this process's torch.save writes half of its bytes, then SIGKILLs itself.

    A path gets half the file (fsynced), a file object half the bytes (flushed): what a process
    killed half-way through a write leaves behind. Installed before the learner's file is
    imported, so `from torch import save` there binds it too.
    """
    original = torch.save

    def save_and_die(obj, f, *args, **kwargs):
        buffer = io.BytesIO()
        original(obj, buffer, *args, **kwargs)
        half = buffer.getvalue()[: len(buffer.getvalue()) // 2]
        if isinstance(f, (str, os.PathLike)):
            with open(f, "wb") as handle:
                handle.write(half)
                handle.flush()
                os.fsync(handle.fileno())
        else:
            f.write(half)
            getattr(f, "flush", lambda: None)()
        os.kill(os.getpid(), signal.SIGKILL)

    torch.save = torch.serialization.save = save_and_die


def save_and_die(rank: int, world_size: int, path: str, root: str, step: int) -> None:
    """Rank function: the learner's save of `step`, every rank killed inside its first torch.save.

    Never returns normally unless the learner's save never calls torch.save.
    """
    die_inside_torch_save()
    learner = load_learner(path)
    save(learner, root, step, rank, world_size, salt=step + 1)

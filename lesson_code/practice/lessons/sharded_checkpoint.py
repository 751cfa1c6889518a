"""Practice for lesson 80: the learner's sharded save and verified load, put through real faults.

The learner writes `save_sharded` and `load_sharded` with the signatures of
`lesson_code.checkpoint.shards`, kept to what the lesson teaches: each rank writes its shard file
into a hidden staging folder, rank 0 writes `manifest.json` (step, world size, `extra`, and every
file's name, size and sha256) once every shard is on disk, and one rename publishes the folder as
`root/step-XXXXXXXX`; the load verifies sizes, checksums and the world size, and raises. The
checks run that code on real gloo ranks with real files:

- round trip: on 1 to 4 ranks, tensors of every dtype of the course, a bool mask, an fp16
  matrix, an empty tensor and a 0-dim scalar come back bit for bit, with the replicated tensors
  and `extra`;
- manifest: every file of the published folder is listed with its size and sha256, every rank's
  shard with its layout;
- damage: a shard with one flipped byte (`checkpoint.faults.flip_one_byte`), or cut to half its
  bytes, makes the load raise on the rank that reads it;
- world size: a checkpoint of 2 ranks loaded by 1 or 3 ranks makes every rank raise;
- crash: every rank killed (SIGKILL) inside its first torch.save, while saving a new step and
  while saving an existing step again: the step's name never appears half-written, and the
  checkpoints published before load exactly.

Any exception is a refusal: the learner's errors need not be the course's classes.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import torch

from lesson_code.checkpoint import load_sharded as course_load
from lesson_code.checkpoint import save_sharded as course_save
from lesson_code.checkpoint import step_folder
from lesson_code.checkpoint.faults import flip_one_byte
from lesson_code.practice.grading import (Check, CheckFailed, Failure, Lesson, fail_on_first,
                                          load_learner, run_ranks)
from lesson_code.practice.lessons.sharded_checkpoint_ranks import (
    attempt_loads, grade_round_trip, layout, load_after_crash, save_and_die, save_only)
from lesson_code.practice.messages import every_rank, phrase
from lesson_code.practice.timing import Timing, paired_rounds

NAMES = ("save_sharded", "load_sharded")
WORLD_SIZES = (1, 2, 3, 4)
MANIFEST = "manifest.json"
NOT_LISTED = (MANIFEST, "manifest.sha256")  # a manifest cannot hold its own checksum
FAULT_WORLD_SIZE = 2
DAMAGED_RANK = 1
TIMED_ELEMENTS = 1 << 20  # a 4 MiB float32 shard per rank


@contextmanager
def _scratch() -> Iterator[Path]:
    """A fresh folder for one check's checkpoints, removed afterwards."""
    folder = Path(tempfile.mkdtemp(prefix="practice_checkpoint_"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _round_trip(path: str, timeout_s: float) -> None:
    with _scratch() as root:
        for step, world_size in enumerate(WORLD_SIZES, start=1):
            fail_on_first(run_ranks(grade_round_trip, path, str(root), step,
                                    world_size=world_size, timeout_s=timeout_s,
                                    case=every_rank(world_size)))



def _saved_by(folder: Path, world_size: int):
    return phrase("{folder}, saved by {n} ranks", "`{folder}`، ذخیره‌شده به دست {n} رتبه",
                  folder=folder.name, n=world_size)


def _saved(path: str, root: Path, timeout_s: float, world_size: int = FAULT_WORLD_SIZE,
           steps: tuple[int, ...] = (1,)) -> Path:
    """Save `steps` with the learner's code on `world_size` ranks; the last step's folder."""
    run_ranks(save_only, path, str(root), list(steps), world_size=world_size,
              timeout_s=timeout_s, case=phrase("save_sharded on all {n} ranks",
                                               "`save_sharded` روی همهٔ {n} رتبه", n=world_size))
    return step_folder(root, steps[-1])  # where the template says it is published


def _manifest(folder: Path, case: str) -> dict:
    """The JSON of folder/manifest.json, or CheckFailed saying why there is none."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        if not isinstance(manifest, dict):
            raise ValueError(f"a JSON {type(manifest).__name__}, not an object")
        return manifest
    except (OSError, ValueError) as error:
        raise CheckFailed(Failure("no_manifest", {"case": case, "file": str(folder / MANIFEST),
                                                  "error": f"{type(error).__name__}: {error}"}))


def _entry_of_rank(manifest: dict, rank: int, case: str) -> tuple[int, dict]:
    """(index, entry) of the manifest's file with "rank": `rank`, or CheckFailed."""
    files = manifest.get("files")
    for index, entry in enumerate(files if isinstance(files, list) else []):
        if isinstance(entry, dict) and entry.get("rank") == rank:
            return index, entry
    raise CheckFailed(Failure("no_entry", {"case": case, "rank": rank}))


def _manifest_check(path: str, timeout_s: float) -> None:
    world_size, step = 3, 1
    with _scratch() as root:
        folder = _saved(path, root, timeout_s, world_size, (step,))
        case = _saved_by(folder, world_size)
        manifest = _manifest(folder, case)
        for key, expected in (("world_size", world_size), ("step", step)):
            if manifest.get(key) != expected:
                raise CheckFailed(Failure("value", {
                    "case": case, "what": f"manifest[{key!r}]", "got": manifest.get(key),
                    "expected": expected}))
        for rank in range(world_size):
            index, entry = _entry_of_rank(manifest, rank, case)
            if entry.get("layout") != layout(rank):
                raise CheckFailed(Failure("value", {
                    "case": case, "what": f"manifest['files'][{index}]['layout']",
                    "got": entry.get("layout"), "expected": layout(rank)}))
        listed = {entry.get("name"): entry for entry in manifest.get("files", [])
                  if isinstance(entry, dict)}
        for file in sorted(folder.iterdir()):
            if file.name.startswith(".") or file.name in NOT_LISTED or not file.is_file():
                continue
            if file.name not in listed:
                raise CheckFailed(Failure("unlisted", {"case": case, "file": file.name}))
            payload = file.read_bytes()
            for field, actual in (("bytes", len(payload)),
                                  ("sha256", hashlib.sha256(payload).hexdigest())):
                if listed[file.name].get(field) != actual:
                    raise CheckFailed(Failure("checksum", {
                        "case": case, "field": field, "file": file.name,
                        "got": listed[file.name].get(field), "expected": actual}))


def _damaged_copies(folder: Path, root: Path, name: str) -> dict[str, Path]:
    """Copies of `folder` with shard `name` damaged: {"flipped": ..., "truncated": ...}."""
    copies = {}
    for damage in ("flipped", "truncated"):
        copy = root / damage / folder.name
        shutil.copytree(folder, copy)
        if damage == "flipped":
            flip_one_byte(copy / name)
        else:
            payload = (copy / name).read_bytes()
            (copy / name).write_bytes(payload[: len(payload) // 2])
        copies[damage] = copy
    return copies


def _damage_check(path: str, timeout_s: float) -> None:
    with _scratch() as root:
        folder = _saved(path, root / "saved", timeout_s)
        case = _saved_by(folder, FAULT_WORLD_SIZE)
        _, entry = _entry_of_rank(_manifest(folder, case), DAMAGED_RANK, case)
        name = str(entry.get("name"))
        copies = _damaged_copies(folder, root, name)
        outcomes = run_ranks(attempt_loads, path, [str(copy) for copy in copies.values()],
                             world_size=FAULT_WORLD_SIZE, timeout_s=timeout_s,
                             case=phrase("load_sharded of the damaged copies on all {n} ranks",
                                         "`load_sharded` روی رونوشت‌های آسیب‌دیده، همهٔ {n} رتبه",
                                         n=FAULT_WORLD_SIZE))
        for index, damage in enumerate(copies):
            if outcomes[DAMAGED_RANK][index] is None:
                raise CheckFailed(Failure(f"accepted_{damage}", {
                    "case": case, "rank": DAMAGED_RANK, "file": name}))


def _world_size_check(path: str, timeout_s: float) -> None:
    with _scratch() as root:
        folder = _saved(path, root, timeout_s)
        for world_size in (1, 3):
            case = phrase("{saved}, loaded on {n} ranks", "{saved}، بارگذاری‌شده روی {n} رتبه",
                          saved=_saved_by(folder, FAULT_WORLD_SIZE), n=world_size)
            outcomes = run_ranks(attempt_loads, path, [str(folder)], world_size=world_size,
                                 timeout_s=timeout_s, case=case)
            for rank, (outcome,) in enumerate(outcomes):
                if outcome is None:
                    raise CheckFailed(Failure("accepted_world_size", {
                        "case": case, "rank": rank, "saved": FAULT_WORLD_SIZE,
                        "world_size": world_size}))


def _crash(path: str, root: Path, step: int, timeout_s: float) -> None:
    """The learner's save of `step` with every rank killed inside torch.save; CheckFailed when
    it finishes (no torch.save) or fails otherwise (it raised, or hung)."""
    case = _killed(step)
    try:
        run_ranks(save_and_die, path, str(root), step, world_size=FAULT_WORLD_SIZE,
                  timeout_s=timeout_s, case=case)
    except CheckFailed as failed:
        if failed.failure.kind != "crashed":
            raise
        return
    raise CheckFailed(Failure("no_crash", {"case": case}))


def _killed(step: int):
    return phrase("{call} on all {n} ranks, each killed (SIGKILL) inside torch.save",
                  "`{call}` روی همهٔ {n} رتبه، که هر کدام درون `torch.save` کشته می‌شود (`SIGKILL`)",
                  call=f"save_sharded(step={step})", n=FAULT_WORLD_SIZE)


def _crash_check(path: str, timeout_s: float) -> None:
    with _scratch() as root:
        _saved(path, root, timeout_s, steps=(2, 4))
        _crash(path, root, 6, timeout_s)               # a new step
        if step_folder(root, 6).exists():
            raise CheckFailed(Failure("published_half", {
                "case": _killed(6), "folder": step_folder(root, 6).name}))
        _crash(path, root, 4, timeout_s)               # a step that is already published
        fail_on_first(run_ranks(load_after_crash, path, str(root), [2, 4],
                                world_size=FAULT_WORLD_SIZE, timeout_s=timeout_s,
                                case=phrase("load_sharded on all {n} ranks after the killed saves",
                                            "`load_sharded` روی همهٔ {n} رتبه پس از ذخیره‌های "
                                            "کشته‌شده", n=FAULT_WORLD_SIZE)))


def time_save_and_load(rank: int, world_size: int, path: str,
                       root: str) -> tuple[list[float], list[float]]:
    """Rank function: (learner's, course's) slowest-rank seconds of a save plus a load, per round."""
    learner = load_learner(path)
    shard = {"weights": torch.randn(TIMED_ELEMENTS)}
    steps = itertools.count(1)

    def round_trip(save, load, where: str) -> None:
        folder = save(f"{root}/{where}", shard, step=next(steps), rank=rank,
                      world_size=world_size, extra={})
        load(folder, rank=rank, world_size=world_size)

    return paired_rounds(lambda: round_trip(learner.save_sharded, learner.load_sharded, "yours"),
                         lambda: round_trip(course_save, course_load, "course"))


def timing(path: str, timeout_s: float) -> Timing:
    """The learner's save and load of a 4 MiB shard per rank against the course's, on 2 ranks."""
    with _scratch() as root:
        yours, course = run_ranks(time_save_and_load, path, str(root), world_size=2,
                                  timeout_s=timeout_s, case="timing")[0]
    return Timing(phrase("save_sharded then load_sharded, a shard of {size} MiB",
                         "`save_sharded` و سپس `load_sharded`، شاردی {size} مبی‌بایتی", size=4),
                  2, tuple(yours), tuple(course))


CHECKS = (
    Check("round_trip",
          {"en": "save then load gives back every tensor bit for bit, on 1 to 4 ranks",
           "fa": "ذخیره و سپس بارگذاری، هر تنسور را بیت‌به‌بیت پس می‌دهد، روی ۱ تا ۴ رتبه"},
          {"en": "return root/step-XXXXXXXX; torch.save the dict as it is (dtypes, shapes, empty "
                 "tensors); every rank reads replicated.pt; return only after rank 0 published",
           "fa": "`root/step-XXXXXXXX` را برگردانید؛ دیکشنری را همان‌طور که هست با `torch.save` "
                 "بنویسید (نوع داده، شکل، تنسورهای خالی)؛ همهٔ رتبه‌ها `replicated.pt` را بخوانند؛ "
                 "فقط پس از انتشار به دست رتبهٔ ۰ برگردید"},
          _round_trip, needs=NAMES),
    Check("manifest",
          {"en": "manifest.json lists every file with its size and sha256, every shard's layout",
           "fa": "`manifest.json` هر فایل را با اندازه و sha256 آن، و چینش هر شارد را فهرست "
                 "می‌کند"},
          {"en": "rank 0 writes the manifest last, from the entries every rank sends it "
                 "(all_gather_object), and adds replicated.pt",
           "fa": "رتبهٔ ۰ مانیفست را در پایان می‌نویسد، از مدخل‌هایی که هر رتبه برایش می‌فرستد "
                 "(`all_gather_object`)، و `replicated.pt` را هم می‌افزاید"},
          _manifest_check, needs=("save_sharded",)),
    Check("damaged_shard",
          {"en": "a shard with one flipped byte, or cut short, makes the load raise",
           "fa": "شاردی با یک بایت وارونه‌شده، یا کوتاه‌شده، بارگذاری را به خطا می‌اندازد"},
          {"en": "compare each file's size and sha256 with the manifest before torch.load",
           "fa": "پیش از `torch.load` اندازه و sha256 هر فایل را با مانیفست مقایسه کنید"},
          _damage_check, needs=NAMES),
    Check("world_size",
          {"en": "loading on another number of ranks raises on every rank",
           "fa": "بارگذاری با تعداد دیگری از رتبه‌ها در همهٔ رتبه‌ها خطا برمی‌انگیزد"},
          {"en": "compare the manifest's world_size with the one you are given, first",
           "fa": "پیش از هر چیز `world_size` مانیفست را با `world_size` داده‌شده مقایسه کنید"},
          _world_size_check, needs=NAMES),
    Check("crash",
          {"en": "a save killed half-way publishes nothing and leaves earlier checkpoints whole",
           "fa": "ذخیره‌ای که نیمه‌کاره کشته شود چیزی منتشر نمی‌کند و چکپوینت‌های قبلی را سالم "
                 "می‌گذارد"},
          {"en": "write into a hidden .step-XXXXXXXX.tmp folder and publish it with one rename "
                 "at the end; move an older copy of the step aside only then",
           "fa": "در پوشهٔ پنهان `.step-XXXXXXXX.tmp` بنویسید و در پایان با یک تغییر نام منتشرش "
                 "کنید؛ نسخهٔ قدیمی همان گام را فقط در آن لحظه کنار بگذارید"},
          _crash_check, needs=NAMES),
)

LESSON = Lesson(80, "my_checkpoint.py", NAMES, CHECKS, timing)

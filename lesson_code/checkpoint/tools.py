"""Living with sharded checkpoints (lesson 80): find the latest, restart from it, recover, keep the
last K, decide when to save, and reshard a checkpoint taken on N ranks for M ranks. One process,
no process group, except `resume` (a training script's start-up), `load_newest` (an evaluation
job's load) and `CheckpointPolicy.should_save`, which make the ranks agree.

    folder, skipped = latest_checkpoint("runs/ckpt")      # verifies every byte, says what it skipped
    folder, extra, failed = resume("runs/ckpt", load)     # every rank: where to start, or refuse
    recover_checkpoints("runs/ckpt")                       # publishes what a crash left hidden
    reshard("runs/ckpt/step-00000010", "runs/ckpt2", 2)    # 4 shards -> 2 shards
    young_interval(save_s=30, mtbf_s=3 * 3600)             # how often to save: sqrt(2 C M)
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import torch
import torch.distributed as dist

from lesson_code import language
from lesson_code.checkpoint.files import (DISK, MANIFEST_SHA256, CheckpointError,
                                          FolderNotSharedError, ManifestDamagedError,
                                          ManifestMissingError, read_manifest, read_verified,
                                          verify_checkpoint, write_file)
from lesson_code.checkpoint.lock import LOCK_TIMEOUT_S, held_alone, locked
from lesson_code.checkpoint.shards import (agree, collective_timeout_s, flat_layout, join_flat,
                                           shard_name)
from lesson_code.checkpoint.staging import (REPLICATED, deleting_folder, recover_step, seal,
                                            stage, step_folder)
from lesson_code.harness.validate import require_positive_int

STEP_FOLDER = re.compile(r"^step-(\d{8})$")
HIDDEN_COPY = re.compile(r"^\.step-(\d{8})\.(tmp|replaced)$")
BEING_DELETED = re.compile(r"^\.step-\d{8}\.deleting$")  # a prune's; never a candidate
# The faults of a checkpoint's own files: `resume` falls back to an older checkpoint on these only.
# Any other (another world size, a format this code does not read, a read error) would fail an
# older checkpoint alike, or throw away the training since the newest, so it is raised instead.
DAMAGE = frozenset({"manifest_missing", "checksum_unreadable", "manifest_changed", "not_json",
                    "step_mismatch", "shard_missing", "shard_size", "shard_changed"})


class Skipped(str):
    """One line of what `latest_checkpoint` skipped, "<folder>: <why>", which also keeps the
    folder's name and the CheckpointError that ruled it out, so that `explain("fa")` says it in
    Persian from those facts. A hidden copy without `manifest.json` or `manifest.sha256` is
    `interrupted` when no process holds the folder's lock alone, else `running`: a save that may
    still be writing it."""

    def __new__(cls, folder: str, error: CheckpointError, interrupted: bool,
                running: bool = False):
        why = str(error)
        if interrupted:
            why = ("a save in progress (a writer holds the folder's lock), not published yet"
                   if running else "an interrupted save, never published")
        made = super().__new__(cls, f"{folder}: {why}")
        made.folder, made.error, made.interrupted, made.running = folder, error, interrupted, running
        return made

    def __reduce__(self):
        return Skipped, (self.folder, self.error, self.interrupted, self.running)

    def explain(self, lang: str = "fa") -> str:
        """The line in `lang`: as it is in English; in Persian the folder, then why."""
        if language.check_language(lang) == "en":
            return str(self)
        why = self.error.explain("fa")
        if self.interrupted:
            why = ("ذخیره‌ای در جریان (نویسنده‌ای قفل پوشه را در دست دارد)، هنوز منتشرنشده"
                   if self.running else "ذخیره‌ای نیمه‌کاره که هرگز منتشر نشد")
        return f"{language.isolated(self.folder)}: {why}"


def list_checkpoints(root: Path | str) -> list[tuple[int, Path]]:
    """Published checkpoint folders under `root` as (step, folder), oldest first (not verified)."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [(int(match.group(1)), path) for path in root.iterdir()
             if path.is_dir() and (match := STEP_FOLDER.match(path.name))]
    return sorted(found)


def hidden_copies(root: Path | str) -> list[tuple[int, Path]]:
    """Unpublished folders under `root` as (step, folder): .step-N.tmp and .step-N.replaced.

    A save in progress writes .tmp; a save stopped half-way leaves it incomplete; a save stopped
    between the two renames of `publish` leaves complete copies in both (see recover_checkpoints).
    """
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted((int(match.group(1)), path) for path in root.iterdir()
                  if path.is_dir() and (match := HIDDEN_COPY.match(path.name)))


def latest_checkpoint(root: Path | str, *, hashes: bool = True, exclude: Iterable[Path | str] = (),
                      lock_timeout_s: float = LOCK_TIMEOUT_S) -> tuple[Path | None, list[str]]:
    """The newest checkpoint under `root` that verifies completely, and why newer ones were skipped.

    Candidates, newest step first: the published folders, and for a step that has none, the
    complete hidden copy that a save stopped between its two renames left (.step-N.tmp, then
    .step-N.replaced). Each is verified like verify_checkpoint, every file's size and sha256
    (one process reads every byte of the newest one: its size over the hash rate); the first
    that passes is returned, with one line per candidate skipped, e.g.
    ".step-00000004.tmp: an interrupted save, never published" or "step-00000015: <the error>"
    (each a `Skipped`, whose explain("fa") says it in Persian). With `hashes=False` each is
    verified on its manifest and its files' sizes only (`verify_checkpoint(..., hashes=False)`):
    no file is read, and a changed byte is found only by the load, which hashes what it reads;
    the restart must then choose again, passing the folders whose load failed in `exclude`
    (matched by name; not listed in what was skipped), so that the next older one is chosen.

    It reads without the lock, so a save never waits for it, nor it for a save: a published
    folder is complete and never changed in place, only replaced whole (a save of the same step)
    or renamed away to be deleted (a prune), and both hold root/.lock alone. So a published
    folder that fails to verify is looked at again holding the lock shared, which sees it before
    or after such a change, never half-way: gone, it is dropped; failing again, it is skipped as damaged. A
    hidden copy that vanished while it was read was published meanwhile (by its save, or by a
    recovery): its step's published folder is looked at instead, the same way. A hidden copy it
    chooses is published under its step's name (recover_step) and that name returned, never a
    folder a running save is about to rename: to publish, it takes the lock alone and looks
    again. Its waits for the lock share one deadline, `lock_timeout_s` seconds after the call:
    the wait that passes it raises a CheckpointError naming the holder. In a folder this process may not write (no lock can be
    taken there, and no save of its own runs) it looks without the lock and returns a hidden
    copy as it is.
    """
    root = Path(root)
    if not root.is_dir():
        return None, []
    if isinstance(exclude, (str, Path)):
        raise TypeError(f"exclude must be a list of folders, got the single {exclude!r}: "
                        f"pass [{str(exclude)!r}]")
    excluded = {Path(folder).name for folder in exclude}
    deadline = time.monotonic() + lock_timeout_s  # for all its waits together
    folder, skipped = _newest_verified(root, deadline, hashes, excluded)
    if folder is None or not folder.name.startswith("."):
        return folder, skipped
    try:
        with locked(root, f"latest_checkpoint, publishing {folder.name}", timeout_s=_left(deadline)):
            return _newest_verified(root, deadline, hashes, excluded, publish=True)
    except OSError:
        return folder, skipped


def _left(deadline: float) -> float:
    """Seconds until `deadline` (a time.monotonic() value), never below 0."""
    return max(deadline - time.monotonic(), 0.0)


def _newest_verified(root: Path, deadline: float, hashes: bool = True,
                     excluded: frozenset[str] | set[str] = frozenset(),
                     publish: bool = False) -> tuple[Path | None, list[str]]:
    """latest_checkpoint's look: without the lock, or, to `publish` a hidden copy, holding it alone."""
    published = list_checkpoints(root)
    steps = {step for step, _ in published}
    candidates = [(step, 2, folder) for step, folder in published] + [
        (step, 1 if folder.suffix == ".tmp" else 0, folder)
        for step, folder in hidden_copies(root) if step not in steps]
    candidates = [candidate for candidate in candidates if candidate[2].name not in excluded]
    skipped, looked_again = [], set()
    for step, _, folder in sorted(candidates, reverse=True):
        error = _failure(folder, hashes)
        hidden = folder.name.startswith(".")
        if error is not None and not publish:
            if hidden and not folder.is_dir():  # renamed while we read it: published, or gone
                folder, hidden = step_folder(root, step), False
                if step in looked_again or not folder.is_dir():
                    continue
            if not hidden:
                looked_again.add(step)
                error = _look_again(root, folder, deadline, hashes)
                if not folder.is_dir():
                    continue  # deleted while we read it: not a candidate any more
        if error is not None:
            # a save killed before its last file, manifest.sha256, is unfinished, not damaged
            interrupted = hidden and (isinstance(error, ManifestMissingError) or (
                isinstance(error, ManifestDamagedError) and error.fault == "checksum_unreadable"))
            skipped.append(Skipped(folder.name, error, interrupted,
                                   running=interrupted and not publish and held_alone(root)))
            continue
        if publish and hidden:
            folder = recover_step(step_folder(root, step), hashes=hashes) or folder
        return folder, skipped
    return None, skipped


def _failure(folder: Path, hashes: bool = True) -> CheckpointError | None:
    """The CheckpointError verify_checkpoint raises for `folder`, None when it verifies."""
    try:
        verify_checkpoint(folder, hashes=hashes)
    except CheckpointError as error:
        return error
    return None


def _look_again(root: Path, folder: Path, deadline: float,
                hashes: bool) -> CheckpointError | None:
    """Verify a published `folder` again holding root/.lock shared (see latest_checkpoint)."""
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(locked(root, f"latest_checkpoint, checking {folder.name} again",
                                       shared=True, timeout_s=_left(deadline)))
        except OSError:
            pass  # a folder this process may not write: no lock, and no save of ours changes it
        return _failure(folder, hashes)


def resume(root: Path | str, load: Callable[[Path], Any], *, group=None,
           lock_timeout_s: float = LOCK_TIMEOUT_S) -> tuple[Path | None, Any, list[Path]]:
    """A training script's start-up, collective over `group`: load the newest checkpoint under
    `root` that `load` (the run's own collective load) loads, start afresh where there is none,
    or raise the same CheckpointError on every rank where checkpoints exist and none loads.
    Returns (the folder loaded, what `load` returned, the newer folders whose load failed), or
    (None, None, []) for a fresh start. Only a damaged checkpoint (a fault in DAMAGE) is passed
    over for an older one; any other error of the load is raised on every rank as it is.
    """
    lock_timeout_s = min(lock_timeout_s, collective_timeout_s(group) / 2)
    failed: list[Path] = []
    while True:
        chosen, _ = agreed_choice(root, failed, lock_timeout_s, group)
        if chosen is None:
            return None, None, failed
        try:
            return chosen, load(chosen), failed
        except CheckpointError as error:  # raised alike on every rank
            if error.fault not in DAMAGE:
                raise  # not damage (another world size, a read error): see DAMAGE
            failed.append(chosen)  # rank 0 chooses the next older one


def agreed_choice(root: Path | str, excluded: list[Path], lock_timeout_s: float,
                  group=None) -> tuple[Path | None, bytes | None]:
    """Rank 0's `choose_checkpoint` (passing over `excluded`) and the chosen folder's manifest
    fingerprint, the same on every rank of `group`; (None, None) where `root` holds no checkpoint.
    Collective. If choosing fails on rank 0, `agree` raises its error on every rank, so no rank
    waits in the broadcast for a choice that never comes."""
    choice, failure = [None, None], None
    if dist.get_rank(group) == 0:
        try:
            chosen = choose_checkpoint(Path(root), excluded, lock_timeout_s)
            choice = [chosen, chosen and _fingerprint(Path(chosen))]
        except Exception as error:  # noqa: BLE001 - every rank must raise it, none wait
            failure = error
    agree(failure, group)  # rank 0's error, if it had one, raised on every rank
    dist.broadcast_object_list(choice, src=dist.get_global_rank(group or dist.group.WORLD, 0),
                               group=group)
    return (Path(choice[0]) if choice[0] else None), choice[1]


def choose_checkpoint(root: Path, failed: list[Path], lock_timeout_s: float) -> str | None:
    """Rank 0's choice for `resume`: the newest checkpoint not in `failed`, by manifests and sizes;
    None when `root` holds no checkpoint at all; a CheckpointError when none is left to load."""
    found, skipped = latest_checkpoint(root, hashes=False, exclude=failed,
                                       lock_timeout_s=lock_timeout_s)
    if found is not None:
        return str(found)
    # an interrupted save is no checkpoint; a damaged one, or a save still running, is in the way
    blocking = [reason for reason in skipped if not reason.interrupted or reason.running]
    if not failed and not blocking:
        return None
    names = [folder.name for folder in failed]
    raise CheckpointError(
        f"{root}: no checkpoint loads (load failed: {', '.join(names) or 'none'}; skipped: "
        f"{'; '.join(blocking) or 'none'}); a fresh start would train over them: restore one, "
        "or move them aside to start afresh", path=root, fault="none_loads",
        failed=names, skipped=blocking)


def load_newest(root: Path | str, load: Callable[[Path], Any], *, group=None, attempts: int = 5,
                lock_timeout_s: float = LOCK_TIMEOUT_S) -> tuple[Path | None, Any]:
    """An evaluation job's load beside a run that saves and prunes `root`, collective over `group`:
    (the newest checkpoint, what `load` returned), or (None, None) where there is none. A failed
    load chooses again (`attempts` in all), past a folder whose manifest is unchanged since chosen."""
    require_positive_int("attempts", attempts, "1 or more, such as 5")
    lock_timeout_s = min(lock_timeout_s, collective_timeout_s(group) / 2)
    damaged: list[Path] = []
    for attempt in range(attempts):
        chosen, fingerprint = agreed_choice(root, damaged, lock_timeout_s, group)
        if chosen is None:
            return None, None
        try:
            return chosen, load(chosen)
        except CheckpointError as error:  # raised alike on every rank
            if attempt == attempts - 1 or (error.fault not in DAMAGE
                                           and not isinstance(error, FolderNotSharedError)):
                raise
            if dist.get_rank(group) == 0 and _fingerprint(chosen) == fingerprint:
                damaged.append(chosen)  # unchanged since chosen: damaged, not replaced
    raise AssertionError("not reached: the last attempt returns or raises")


def _fingerprint(folder: Path) -> bytes | None:
    """The bytes of `folder`'s manifest.sha256, None when it has none: changed by any re-save."""
    try:
        return (folder / MANIFEST_SHA256).read_bytes()
    except OSError:
        return None


def recover_checkpoints(root: Path | str, *,
                        lock_timeout_s: float = LOCK_TIMEOUT_S) -> list[Path]:
    """Publish each complete hidden copy whose step has no folder; return the folders published.

    A save stopped between the two renames of `publish` (a crash, a preemption) leaves no
    step-N, only complete copies in .step-N.tmp and .step-N.replaced: the newer that verifies
    becomes step-N. Holds root/.lock alone (waiting at most `lock_timeout_s` seconds for it), so
    it never touches a save in progress.
    """
    if not Path(root).is_dir():
        return []
    with locked(root, "recover_checkpoints", timeout_s=lock_timeout_s):
        steps = sorted({step for step, _ in hidden_copies(root)})
        return [folder for step in steps if (folder := recover_step(step_folder(root, step)))]


def prune_checkpoints(root: Path | str, keep_last: int, *, hashes: bool = True,
                      lock_timeout_s: float = LOCK_TIMEOUT_S) -> list[Path]:
    """Delete the published checkpoints older than the newest `keep_last` that verify, and the
    debris; return what was deleted.

    Only a checkpoint that verifies (every file's size and sha256, so this reads every byte of
    those it keeps) counts towards `keep_last`: a damaged newest one can never cost the last good
    one. With `hashes=False` a checkpoint counts on its manifest and its files' sizes
    (`verify_checkpoint(..., hashes=False)`), a stat per file instead of a read of every byte
    kept, at the price of counting one with a changed byte. Damaged checkpoints newer than those
    kept stay, for inspection (latest_checkpoint skips them); older ones go. Debris is what
    interrupted saves left hidden (.step-N.tmp, .step-N.replaced) and what an interrupted prune
    left (.step-N.deleting); a complete copy whose step has no folder is first recovered (see
    recover_checkpoints), never deleted. A published step-N is first renamed to .step-N.deleting
    (and the rename made durable), then deleted there: a prune stopped half-way leaves a hidden
    folder that nothing reads, never a step-N with files missing. Holds root/.lock alone (waiting
    at most `lock_timeout_s` seconds for it) while it hashes and deletes, so a save in progress is
    left alone and the next save waits for it. Raises ValueError unless keep_last is an int of 1 or more.
    """
    require_positive_int("keep_last", keep_last, "1 or more (keeping none would leave nothing "
                         "to resume from)")
    if not Path(root).is_dir():
        return []
    with locked(root, "prune_checkpoints", timeout_s=lock_timeout_s):
        for step in sorted({step for step, _ in hidden_copies(root)}):
            recover_step(step_folder(root, step))
        verified, doomed = 0, []
        for _, folder in reversed(list_checkpoints(root)):  # newest first
            if verified == keep_last:
                doomed.append(folder)
                continue
            try:
                verify_checkpoint(folder, hashes=hashes)
                verified += 1
            except CheckpointError:
                pass  # damaged: kept, and not counted
        leftovers = [path for path in Path(root).iterdir()
                     if path.is_dir() and BEING_DELETED.match(path.name)]
        for folder in leftovers:  # first: a step-N saved since may be renamed to that name now
            shutil.rmtree(folder)
        for folder in doomed:
            DISK.replace(folder, deleting_folder(folder))
        if doomed:
            DISK.fsync_directory(Path(root))
        debris = [folder for _, folder in hidden_copies(root)]
        for folder in [deleting_folder(folder) for folder in doomed] + debris:
            shutil.rmtree(folder)
    return doomed + debris + leftovers


@dataclass
class CheckpointPolicy:
    """When to save: every `every_steps` steps and/or every `every_seconds` of wall clock.

    Production runs save on a clock (a job may be preempted at any time) as well as on steps.
    `keep_last` is how many checkpoints `prune_checkpoints` should keep. A save is a collective,
    so every rank must decide alike: the step rule does by itself, the clock does not (each
    process reads its own, and near the boundary one rank finds the save due a step before
    another, which would then wait in a different collective until the group's timeout). So
    `should_save` makes the ranks of `group` agree whenever the clock rule is on and a process
    group is initialised (see there).

    A save can also be asked for, by a signal that reaches one rank (a preemption warning):
    with `on_request=True`, `signal.signal(signal.SIGTERM, policy.request_save)` on every rank;
    `should_save` then agrees on it too, and sets `requested` on every rank, so that all of them
    save at the same step and can stop after it.
    """

    every_steps: int | None = None
    every_seconds: float | None = None
    keep_last: int = 2
    last_save_time: float = field(default_factory=time.monotonic)
    group: Any = field(default=None, repr=False)  # the ranks that save together; None: all
    on_request: bool = False  # True: a rank may call request_save, so should_save is collective
    requested: bool = False  # a save was asked for and the ranks agree on it (set by should_save)
    asked_here: bool = field(default=False, repr=False)  # request_save ran here, no save since

    def __post_init__(self):
        if self.every_steps is None and self.every_seconds is None and not self.on_request:
            raise ValueError("give every_steps, every_seconds, on_request=True or several: the "
                             "policy would never save")

    def request_save(self, *_signal) -> None:
        """Ask for a save after the current step. Only sets a flag, so it may be a signal handler
        (it takes the handler's two arguments); needs `on_request=True` to reach the other ranks.
        It sets `asked_here`, not `requested`: a signal may arrive at any moment, also after this
        step's all-reduce, and a rank that acted on it alone would save while the others do not.
        Raises ValueError without `on_request=True`: `should_save` would then not share the
        request, and this rank would save alone while the others wait for it in their next
        collective until the group's timeout (in a signal handler, the error stops this rank,
        and the launcher takes the others down with it)."""
        if not self.on_request:
            raise ValueError("request_save needs CheckpointPolicy(..., on_request=True): without "
                             "it should_save does not share a request with the other ranks, and "
                             "this rank would save alone; pass on_request=True")
        self.asked_here = True

    def should_save(self, step: int, now: float | None = None) -> bool:
        """True if the checkpoint after `step` (counted from 1) is due; resets the clock if so.

        Collective when `every_seconds` is set and a process group is initialised: call on every
        rank of `group` after every step, or only every n steps (n dividing `every_steps`) where an
        all-reduce per step costs too much; the clock's save then comes up to n - 1 steps late.
        The ranks all-reduce "due by my clock" with MAX, so all save at the step where the first
        of them finds it due (Megatron-LM agrees on its time-based exit the same way). `now`
        (seconds, default time.monotonic()) is this rank's clock. With `on_request=True` it is
        collective too, and a save requested on any rank is due on all of them, each left with
        `requested` set; one request makes one save, and a later one another. The decision uses
        only the reduced flags: a request that reaches a rank after it read its flag counts at
        the next step, on every rank alike.
        """
        now = time.monotonic() if now is None else now
        by_clock = self.every_seconds is not None and now - self.last_save_time >= self.every_seconds
        asked = self.asked_here  # read once: what the all-reduce carries is what this rank decides
        agreeing = self.every_seconds is not None or self.on_request
        if agreeing and dist.is_available() and dist.is_initialized():
            device = "cuda" if dist.get_backend(self.group) == "nccl" else "cpu"
            flags = torch.tensor([int(by_clock), int(asked)], device=device)
            dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=self.group)
            by_clock, asked = (bool(flag) for flag in flags.tolist())
        if asked:  # every rank saves after this step, which answers any request made so far
            self.asked_here = False
        self.requested = self.requested or asked
        due = ((self.every_steps is not None and step % self.every_steps == 0) or by_clock
               or asked)
        if due:
            self.last_save_time = now
        return due


def young_interval(save_s: float, mtbf_s: float) -> float:
    """Young's checkpoint interval, sqrt(2 C M) seconds, for a save that stops training for
    `save_s` seconds (C) and a job that fails on average every `mtbf_s` seconds (M).

    Saving every T seconds costs C / T of the time in saves, and a failure loses on average
    T / 2 of work, T / (2 M) of the time: the sum is least at T = sqrt(2 C M) (Young, 1974; a
    first-order model, good while C is far below M). Raises ValueError unless both are > 0.
    """
    for name, value in (("save_s", save_s), ("mtbf_s", mtbf_s)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ValueError(f"{name} must be a number of seconds above 0, got {value!r}")
    return math.sqrt(2 * save_s * mtbf_s)


def time_lost(interval_s: float, save_s: float, mtbf_s: float) -> float:
    """The fraction of time that saving every `interval_s` seconds costs in Young's model: the
    saves (C / T) plus the work a failure throws away (T / (2 M)); restarts not counted."""
    return save_s / interval_s + interval_s / (2 * mtbf_s)


def reshard(source: Path | str, destination_root: Path | str, world_size: int, *,
            lock_timeout_s: float = LOCK_TIMEOUT_S) -> Path:
    """Rewrite the checkpoint in `source` for `world_size` ranks under `destination_root`.

    One process joins each flat tensor (the layout's "flat" list) in rank order, strips its
    padding, pads it for the new world size and cuts equal shards; with another world size each
    new rank gets a seed of its own, `rng_seed`. Verifies every file it reads.
    """
    require_positive_int("world_size", world_size, "the number of ranks that will load it, such as 2")
    source = Path(source)
    manifest = read_manifest(source)
    entries = {entry["name"]: entry for entry in manifest["files"]}
    old = manifest["world_size"]
    shards = [read_verified(source, entries[shard_name(r, old)]) for r in range(old)]
    layout = entries[shard_name(0, old)]["layout"]
    length = math.ceil(layout["numel"] / world_size)
    full = {key: join_flat(shards, key, layout["numel"], length * world_size)
            for key in layout.get("flat", [])}  # padded for the new world size
    final = step_folder(destination_root, manifest["step"])
    with locked(destination_root, f"reshard into {final.name}", timeout_s=lock_timeout_s):
        _write_resharded(final, manifest, shards, full, layout, world_size, source, entries)
    return final


def _write_resharded(final: Path, manifest: dict, shards: list, full: dict, layout: dict,
                     world_size: int, source: Path, entries: dict) -> None:
    """Write the `world_size` new shards into staging, then seal: manifest last, publish.

    `full` holds the flat vectors padded for `world_size`; `shards` the old ranks' other tensors.
    """
    old, numel = manifest["world_size"], layout["numel"]
    length = math.ceil(numel / world_size)
    seeds = None if world_size == old else _rng_seeds(shards, full, world_size)
    staging = stage(final)
    files = []
    for rank in range(world_size):
        start = rank * length
        new = {key: value[start: start + length].clone()  # a slice alone: torch.save would
               for key, value in full.items()}                # write a view's whole vector
        if seeds is None:  # the same ranks: each keeps its own random stream
            new.update({key: value for key, value in shards[rank].items() if key not in full})
        else:
            new["rng_seed"] = torch.tensor(seeds[rank])
        new_layout = {**layout, **flat_layout(numel, start, length)}
        files.append({**write_file(staging, shard_name(rank, world_size), new), "rank": rank,
                      "layout": new_layout})
    full.clear()  # every new shard is written: free the vectors before the model's file is read
    replicated = read_verified(source, entries[REPLICATED]) if REPLICATED in entries else None
    seal(staging, final, files, step=manifest["step"], world_size=world_size,
         extra={**manifest["extra"], "resharded_from": old}, replicated=replicated)


def _rng_seeds(shards: list[dict], flat: dict, world_size: int) -> list[int]:
    """A seed for each of `world_size` new ranks: the sha256 of every old rank's random-number
    states, in rank order, with the new world size and rank; the same checkpoint resharded the
    same way gives the same seeds, and no two new ranks share one (but by a 64-bit chance)."""
    old = hashlib.sha256()
    for shard in shards:
        for key in sorted(key for key in shard if key not in flat):
            old.update(key.encode() + shard[key].reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
    return [int.from_bytes(hashlib.sha256(old.digest() + f"{world_size}:{rank}".encode())
                           .digest()[:8], "little") % 2**63 for rank in range(world_size)]

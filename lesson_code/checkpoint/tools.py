"""Living with sharded checkpoints (lesson 80): find the latest, recover, keep the last K, save
on a clock, and reshard a checkpoint taken on N ranks for M ranks. One process, no process group.

    folder, skipped = latest_checkpoint("runs/ckpt")      # verifies every byte, says what it skipped
    recover_checkpoints("runs/ckpt")                       # publishes what a crash left hidden
    reshard("runs/ckpt/step-00000010", "runs/ckpt2", 2)    # 4 shards -> 2 shards
"""

from __future__ import annotations

import contextlib
import math
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from lesson_code import language
from lesson_code.checkpoint.files import (CheckpointError, ManifestMissingError, locked,
                                          read_manifest, read_verified, verify_checkpoint,
                                          write_file)
from lesson_code.checkpoint.shards import shard_name
from lesson_code.checkpoint.staging import (REPLICATED, recover_step, seal, stage,
                                            step_folder)
from lesson_code.harness.validate import require_positive_int

STEP_FOLDER = re.compile(r"^step-(\d{8})$")
HIDDEN_COPY = re.compile(r"^\.step-(\d{8})\.(tmp|replaced)$")


class Skipped(str):
    """One line of what `latest_checkpoint` skipped, "<folder>: <why>", which also keeps the
    folder's name and the CheckpointError that ruled it out (`interrupted`: a hidden copy with no
    manifest), so that `explain("fa")` says it in Persian from those facts."""

    def __new__(cls, folder: str, error: CheckpointError, interrupted: bool):
        why = "an interrupted save, never published" if interrupted else str(error)
        made = super().__new__(cls, f"{folder}: {why}")
        made.folder, made.error, made.interrupted = folder, error, interrupted
        return made

    def __reduce__(self):
        return Skipped, (self.folder, self.error, self.interrupted)

    def explain(self, lang: str = "fa") -> str:
        """The line in `lang`: as it is in English; in Persian the folder, then why."""
        if language.check_language(lang) == "en":
            return str(self)
        why = ("ذخیره‌ای نیمه‌کاره که هرگز منتشر نشد" if self.interrupted
               else self.error.explain("fa"))
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


def latest_checkpoint(root: Path | str) -> tuple[Path | None, list[str]]:
    """The newest checkpoint under `root` that verifies completely, and why newer ones were skipped.

    Candidates, newest step first: the published folders, and for a step that has none, the
    complete hidden copy that a save stopped between its two renames left (.step-N.tmp, then
    .step-N.replaced). Each is verified like verify_checkpoint, every file's size and sha256 (so
    this reads every byte of the newest one); the first that passes is returned, with one line
    per candidate skipped, e.g. ".step-00000004.tmp: an interrupted save, never published" or
    "step-00000015: <the error>" (each a `Skipped`, whose explain("fa") says it in Persian). It
    holds root/.lock while it looks, shared with other readers, so it never sees a save half-way
    (a save holds the lock alone, and waits for the readers). A hidden copy it chooses is
    published under its step's name (recover_step) and that name returned, never a folder a
    running save is about to rename: to publish, it takes the lock alone and looks again. In a
    folder this process may not write (no lock can be taken there, and no save of its own runs)
    it looks without the lock and returns a hidden copy as it is.
    """
    root = Path(root)
    if not root.is_dir():
        return None, []
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(locked(root, "latest_checkpoint", shared=True))
        except OSError:
            return _newest_verified(root, publish=False)
        folder, skipped = _newest_verified(root, publish=False)
    if folder is None or not folder.name.startswith("."):
        return folder, skipped
    with locked(root, f"latest_checkpoint, publishing {folder.name}"):
        return _newest_verified(root, publish=True)


def _newest_verified(root: Path, publish: bool) -> tuple[Path | None, list[str]]:
    """latest_checkpoint's look, with the lock held (alone if it may `publish` a hidden copy)."""
    published = list_checkpoints(root)
    steps = {step for step, _ in published}
    candidates = [(step, 2, folder) for step, folder in published] + [
        (step, 1 if folder.suffix == ".tmp" else 0, folder)
        for step, folder in hidden_copies(root) if step not in steps]
    skipped = []
    for step, _, folder in sorted(candidates, reverse=True):
        try:
            verify_checkpoint(folder)
        except CheckpointError as error:
            hidden = folder.name.startswith(".") and isinstance(error, ManifestMissingError)
            skipped.append(Skipped(folder.name, error, interrupted=hidden))
            continue
        if publish and folder.name.startswith("."):
            folder = recover_step(step_folder(root, step)) or folder
        return folder, skipped
    return None, skipped


def recover_checkpoints(root: Path | str) -> list[Path]:
    """Publish each complete hidden copy whose step has no folder; return the folders published.

    A save stopped between the two renames of `publish` (a crash, a preemption) leaves no
    step-N, only complete copies in .step-N.tmp and .step-N.replaced: the newer that verifies
    becomes step-N. Holds root/.lock, so it never touches a save in progress.
    """
    if not Path(root).is_dir():
        return []
    with locked(root, "recover_checkpoints"):
        steps = sorted({step for step, _ in hidden_copies(root)})
        return [folder for step in steps if (folder := recover_step(step_folder(root, step)))]


def prune_checkpoints(root: Path | str, keep_last: int) -> list[Path]:
    """Delete the published checkpoints older than the newest `keep_last` that verify, and the
    debris; return what was deleted.

    Only a checkpoint that verifies (every file's size and sha256, so this reads every byte of
    those it keeps) counts towards `keep_last`: a damaged newest one can never cost the last good
    one. Damaged checkpoints newer than those kept stay, for inspection (latest_checkpoint skips
    them); older ones go. Debris is what interrupted saves left hidden (.step-N.tmp,
    .step-N.replaced); a complete copy whose step has no folder is first recovered (see
    recover_checkpoints), never deleted. Holds root/.lock, so a save in progress is left alone.
    Raises ValueError unless keep_last is an int of 1 or more.
    """
    require_positive_int("keep_last", keep_last, "1 or more (keeping none would leave nothing "
                         "to resume from)")
    if not Path(root).is_dir():
        return []
    with locked(root, "prune_checkpoints"):
        for step in sorted({step for step, _ in hidden_copies(root)}):
            recover_step(step_folder(root, step))
        verified, doomed = 0, []
        for _, folder in reversed(list_checkpoints(root)):  # newest first
            if verified == keep_last:
                doomed.append(folder)
                continue
            try:
                verify_checkpoint(folder)
                verified += 1
            except CheckpointError:
                pass  # damaged: kept, and not counted
        doomed += [folder for _, folder in hidden_copies(root)]
        for folder in doomed:
            shutil.rmtree(folder)
    return doomed


@dataclass
class CheckpointPolicy:
    """When to save: every `every_steps` steps and/or every `every_seconds` of wall clock.

    Production runs save on a clock (a job may be preempted at any time) as well as on steps.
    `keep_last` is how many checkpoints `prune_checkpoints` should keep.
    """

    every_steps: int | None = None
    every_seconds: float | None = None
    keep_last: int = 2
    last_save_time: float = field(default_factory=time.monotonic)

    def __post_init__(self):
        if self.every_steps is None and self.every_seconds is None:
            raise ValueError("give every_steps, every_seconds or both: the policy would never save")

    def should_save(self, step: int, now: float | None = None) -> bool:
        """True if the checkpoint after `step` (counted from 1) is due; resets the clock if so."""
        now = time.monotonic() if now is None else now
        due = (self.every_steps is not None and step % self.every_steps == 0) or \
              (self.every_seconds is not None and now - self.last_save_time >= self.every_seconds)
        if due:
            self.last_save_time = now
        return due


def reshard(source: Path | str, destination_root: Path | str, world_size: int) -> Path:
    """Rewrite the checkpoint in `source` for `world_size` ranks under `destination_root`.

    Every flat-sharded tensor (listed in the shards' layout under "flat") is reassembled in rank
    order, stripped of its padding, padded again for the new world size and cut into equal shards.
    Per-rank tensors that are not flat (RNG states) go to new rank r from old rank r mod N.
    Verifies every file it reads; holds destination_root/.lock while it writes there. Raises
    ValueError for a world size below 1.
    """
    require_positive_int("world_size", world_size, "the number of ranks that will load it, such as 2")
    source = Path(source)
    manifest = read_manifest(source)
    entries = {entry["name"]: entry for entry in manifest["files"]}
    old = manifest["world_size"]
    shards = [read_verified(source, entries[shard_name(r, old)]) for r in range(old)]
    layout = entries[shard_name(0, old)]["layout"]
    full = {key: torch.cat([shard[key] for shard in shards])[:layout["numel"]]
            for key in layout.get("flat", [])}
    final = step_folder(destination_root, manifest["step"])
    with locked(destination_root, f"reshard into {final.name}"):
        _write_resharded(final, manifest, shards, full, layout, world_size, source, entries)
    return final


def _write_resharded(final: Path, manifest: dict, shards: list, full: dict, layout: dict,
                     world_size: int, source: Path, entries: dict) -> None:
    """Write the `world_size` new shards into staging, then seal: manifest last, publish."""
    old, numel = manifest["world_size"], layout["numel"]
    length = math.ceil(numel / world_size)
    padding = length * world_size - numel
    staging = stage(final)
    files = []
    for rank in range(world_size):
        start = rank * length
        new = {key: torch.cat([value, value.new_zeros(padding)])[start: start + length].clone()
               for key, value in full.items()}
        new.update({key: value for key, value in shards[rank % old].items() if key not in full})
        new_layout = {**layout, "start": start, "length": length, "padding": padding}
        files.append({**write_file(staging, shard_name(rank, world_size), new), "rank": rank,
                      "layout": new_layout})
    replicated = read_verified(source, entries[REPLICATED]) if REPLICATED in entries else None
    seal(staging, final, files, step=manifest["step"], world_size=world_size,
         extra={**manifest["extra"], "resharded_from": old}, replicated=replicated)

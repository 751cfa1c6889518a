"""Living with sharded checkpoints (lesson 80): find the latest, keep the last K, save on a clock,
and reshard a checkpoint taken on N ranks for M ranks. One process, no process group needed.

    folder, skipped = latest_checkpoint("runs/ckpt")      # skips interrupted saves, says why
    reshard("runs/ckpt/step-00000010", "runs/ckpt2", 2)    # 4 shards -> 2 shards
"""

from __future__ import annotations

import math
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from lesson_code.checkpoint import (FORMAT_VERSION, REPLICATED, CheckpointError, publish,
                                    read_manifest, read_verified, shard_name, step_folder,
                                    versions, write_file, write_manifest)

STEP_FOLDER = re.compile(r"^step-(\d{8})$")


def list_checkpoints(root: Path | str) -> list[tuple[int, Path]]:
    """Published checkpoint folders under `root` as (step, folder), oldest first (not verified)."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [(int(match.group(1)), path) for path in root.iterdir()
             if path.is_dir() and (match := STEP_FOLDER.match(path.name))]
    return sorted(found)


def latest_checkpoint(root: Path | str) -> tuple[Path | None, list[str]]:
    """The newest checkpoint under `root` whose manifest reads, and why others were skipped.

    Skipped: unpublished folders (".step-...tmp", left by a save that was interrupted) and
    published ones whose manifest is missing or damaged. Files are not hashed here; load_sharded
    checks them.
    """
    root = Path(root)
    skipped = [f"{path.name}: an interrupted save, never published" for path in
               sorted(root.glob(".step-*.tmp"))] if root.is_dir() else []
    for _, folder in reversed(list_checkpoints(root)):
        try:
            read_manifest(folder)
            return folder, skipped
        except CheckpointError as error:
            skipped.append(f"{folder.name}: {error}")
    return None, skipped


def prune_checkpoints(root: Path | str, keep_last: int) -> list[Path]:
    """Delete all but the newest `keep_last` published checkpoints; return what was deleted."""
    if keep_last < 1:
        raise ValueError(f"keep_last must be at least 1, got {keep_last!r}: keeping none would "
                         "leave nothing to resume from")
    doomed = [folder for _, folder in list_checkpoints(root)[:-keep_last]]
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
    Verifies every file it reads. Raises ValueError for a world size below 1.
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive int, got {world_size!r}")
    source = Path(source)
    manifest = read_manifest(source)
    entries = {entry["name"]: entry for entry in manifest["files"]}
    old = manifest["world_size"]
    shards = [read_verified(source, entries[shard_name(r, old)]) for r in range(old)]
    layout = entries[shard_name(0, old)]["layout"]
    numel, flat_keys = layout["numel"], layout.get("flat", [])
    length = math.ceil(numel / world_size)
    padding = length * world_size - numel
    full = {key: torch.cat([shard[key] for shard in shards])[:numel] for key in flat_keys}
    final = step_folder(destination_root, manifest["step"])
    staging = final.with_name(f".{final.name}.tmp")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    files = []
    for rank in range(world_size):
        start = rank * length
        new = {key: torch.cat([value, value.new_zeros(padding)])[start: start + length].clone()
               for key, value in full.items()}
        new.update({key: value for key, value in shards[rank % old].items() if key not in full})
        new_layout = {**layout, "start": start, "length": length, "padding": padding}
        files.append({**write_file(staging, shard_name(rank, world_size), new), "rank": rank,
                      "layout": new_layout})
    if REPLICATED in entries:
        files.append({**write_file(staging, REPLICATED, read_verified(source, entries[REPLICATED])),
                      "rank": None, "layout": {}})
    write_manifest(staging, {"format_version": FORMAT_VERSION, "step": manifest["step"],
                             "world_size": world_size, "files": files,
                             "extra": {**manifest["extra"], "resharded_from": old},
                             "versions": versions()})
    publish(staging, final)
    return final
